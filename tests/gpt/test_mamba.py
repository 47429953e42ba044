"""Mamba-2 `M` layers (gpt/mamba.py): the chunked scan against the recurrence it computes, the mixer against
transformers' NemotronH torch path on the same weights (fp32, several chunks, groups > 1), Megatron-Core's
MambaMixer initialisation, and the refusals."""

from __future__ import annotations

import math

import pytest
import torch

from arguments.config import ConfigError
from arguments.parser import parse_config
from gpt.mamba import MambaMixer
from gpt.mamba_scan import ssd_scan
from gpt.mamba_settings import MambaSettings
from gpt.model import build_gpt_model
from gpt.parallel_plan import TensorParallelPlan
from parallel.init import materialize
from parallel.state import ParallelState

SINGLE = ParallelState(device=torch.device("cpu"))
TINY = ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16", "--max-position-embeddings", "16",
        "--vocab-size", "64", "--mamba-head-dim", "8", "--mamba-num-groups", "2", "--mamba-state-dim", "8"]


def recurrence(x, dt, a, b, c, d):
    """h_t = exp(dt_t a) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t + D x_t: one token at a time, in fp64."""
    batch, seq, heads, width = x.shape
    b, c = (t.repeat_interleave(heads // t.shape[2], dim=2) for t in (b, c))
    state, out = torch.zeros(batch, heads, width, b.shape[-1], dtype=torch.float64), []
    for t in range(seq):
        decay = torch.exp(dt[:, t] * a)[..., None, None]
        state = state * decay + (dt[:, t, :, None] * x[:, t])[..., None] * b[:, t, :, None, :]
        out.append(torch.einsum("bhpn,bhn->bhp", state, c[:, t]) + d[:, None] * x[:, t])
    return torch.stack(out, dim=1)


def test_the_chunked_scan_is_the_recurrence_with_the_state_carried_between_chunks():
    generator = torch.Generator().manual_seed(0)
    batch, seq, heads, width, groups, state = 2, 11, 4, 3, 2, 5   # 11 tokens: two whole chunks of 4 and a padded one

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    x, b, c = draw(batch, seq, heads, width), draw(batch, seq, groups, state), draw(batch, seq, groups, state)
    dt = torch.nn.functional.softplus(draw(batch, seq, heads))
    a, d = -torch.rand(heads, generator=generator, dtype=torch.float64) * 2, draw(heads)
    expected = recurrence(x, dt, a, b, c, d)
    chunked = ssd_scan(x, dt, a, b, c, d, chunk=4)
    torch.testing.assert_close(chunked.double(), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ssd_scan(x, dt, a, b, c, d, chunk=11).double()[:, 4:], recurrence(
        x[:, 4:], dt[:, 4:], a, b[:, 4:], c[:, 4:], d), atol=1e-3)  # the carried state matters after chunk one


def test_the_mixer_equals_transformers_nemotron_h_on_the_same_weights():
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    config = parse_config(["--hybrid-layer-pattern", "M", *TINY]).model
    ours = materialize(MambaMixer(config, TensorParallelPlan(SINGLE)), seed=5).eval()
    # NemotronH's time_step_min clamps dt from below; Megatron-Core's MambaMixer has no clamp (dt_limit (0, inf))
    theirs_config = NemotronHConfig(
        hidden_size=32, mamba_num_heads=ours.heads, mamba_head_dim=8, ssm_state_size=8, n_groups=2,
        chunk_size=MambaSettings.CHUNK_SIZE, conv_kernel=MambaSettings.CONV_WIDTH, use_conv_bias=True, use_bias=False,
        layer_norm_epsilon=MambaSettings.NORM_EPSILON, time_step_min=0.0, hybrid_override_pattern="M",
        num_hidden_layers=1, vocab_size=64)
    theirs = NemotronHMamba2Mixer(theirs_config, layer_idx=0).eval()
    # in_proj and the conv are one parameter per part here (split on its own under TP), one tensor there
    ours_by_name = {**dict(ours.named_parameters()), "in_proj.weight": ours.in_proj.joined("weight"),
                    "conv1d.weight": ours.conv1d.joined("weight"), "conv1d.bias": ours.conv1d.joined("bias")}
    with torch.no_grad():
        for name, param in theirs.named_parameters():
            param.copy_(ours_by_name[name])
    seq = 2 * MambaSettings.CHUNK_SIZE + 44    # three chunks, the last one padded
    hidden = torch.randn(2, seq, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = theirs(hidden), ours(hidden)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max(), (got - expected).abs().max()


def test_the_initialisation_is_megatron_core_mamba_mixers():
    config = parse_config(["--hybrid-layer-pattern", "MMMM", *TINY, "--mamba-num-heads", "64"]).model
    mixer = materialize(MambaMixer(config, TensorParallelPlan(SINGLE)), seed=5)
    a = torch.exp(mixer.A_log)
    assert a.min() >= 1 and a.max() < 16 and a.max() - a.min() > 10   # U[1, 16]
    dt = torch.nn.functional.softplus(mixer.dt_bias.double())
    assert dt.min() >= MambaSettings.DT_MIN * (1 - 1e-5) and dt.max() <= MambaSettings.DT_MAX * (1 + 1e-5)
    assert torch.equal(mixer.D, torch.ones(64)) and torch.equal(mixer.norm.weight, torch.ones(64 * 8))
    bound, conv = 1 / math.sqrt(MambaSettings.CONV_WIDTH), mixer.conv1d.joined("weight")
    assert conv.abs().max() <= bound and conv.abs().max() > 0.9 * bound
    in_proj = mixer.in_proj.joined("weight")
    assert abs(in_proj.std().item() - config.init_method_std) < 0.1 * config.init_method_std
    # the residual branch's scaled std: a hybrid model's init_method_std / sqrt(its 4 layers), Megatron's multiplier 1
    assert abs(mixer.out_proj.weight.std().item() - config.init_method_std / 2) < 0.05 * config.init_method_std
    again = materialize(MambaMixer(config, TensorParallelPlan(SINGLE)), seed=5)
    assert torch.equal(again.A_log, mixer.A_log) and torch.equal(again.dt_bias, mixer.dt_bias)


def test_megatron_flags_and_defaults():
    config = parse_config(["--hybrid-layer-pattern", "M-*-", "--hidden-size", "1024", "--num-attention-heads", "8",
                           "--vocab-size", "64"]).model
    assert (config.mamba.mamba_state_dim, config.mamba.mamba_head_dim, config.mamba.mamba_num_groups) == (128, 64, 8)
    assert config.mamba.heads(1024) == 32   # MambaMixer: d_inner = expand 2 x hidden, over the head width
    model = build_gpt_model(parse_config(["--hybrid-layer-pattern", "M-*-", *TINY]).model, SINGLE, seed=1)
    assert model(torch.randint(0, 64, (2, 16))).shape == (2, 16, 64)


@pytest.mark.parametrize("argv, words", [
    (["--mamba-num-groups", "3"], "--mamba-num-groups 3 does not divide the 8 Mamba heads"),
    (["--mamba-head-dim", "7"], "--mamba-head-dim 7 does not divide 2 x --hidden-size"),
    (["--tensor-model-parallel-size", "4"], "--mamba-num-groups 2 does not split over --tensor-model-parallel-size 4"),
    (["--fp8-format", "hybrid"], "--fp8-format with `M` (Mamba) layers in M-*-: their FP8 in-projection is not built"),
])
def test_each_refusal_is_one_line(argv, words):
    with pytest.raises(ConfigError) as refused:
        parse_config(["--hybrid-layer-pattern", "M-*-", *TINY, *argv])
    assert "\n" not in str(refused.value) and words in str(refused.value), str(refused.value)


def test_a_torch_dist_save_of_mamba_layers_writes_megatron_lms_layout(tmp_path):
    """HybridModel's `M` layer names (checkpoint/torch_dist/names.py; tests/checkpoint/test_torch_dist_mamba_gdn.py):
    no start line says the save is this project's format."""
    from arguments.parser import parse_arguments

    notes = parse_arguments(["--hybrid-layer-pattern", "M-*-", *TINY, "--save", str(tmp_path / "ckpt"),
                             "--ckpt-format", "torch_dist"]).notes
    assert not any("this project's checkpoints" in note for note in notes), notes


@pytest.mark.parametrize("pattern, extra", [("M-M*-", []), ("*--*", []), ("M*E-ME", ["--num-experts", "4"])])
def test_the_shapes_parameter_count_is_the_models(pattern, extra):
    """gpt/shape.py probes one attention block; a pattern's `M` and one-part blocks are counted beyond it, so the
    start-up line and the planner count the model's parameters."""
    from gpt.model import GPTModel
    from gpt.shape import model_shape

    config = parse_config(["--hybrid-layer-pattern", pattern, *TINY, *extra]).model
    model = GPTModel(config, ParallelState(device=torch.device("meta")))
    assert model_shape(config).parameter_count(config.padded_vocab_size()) == \
        sum(param.numel() for param in model.parameters())


def test_generation_with_a_kv_cache_is_refused_in_one_line_and_runs_without():
    from gpt.generation import generate
    from gpt.sampling import Sampling

    config = parse_config(["--hybrid-layer-pattern", "M-*-", *TINY]).model
    model = build_gpt_model(config, SINGLE, seed=1).eval()
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ConfigError, match=r"^Mamba \(`M`\) layers keep no decoding state here.*--no-kv-cache\)$"):
        generate(model, prompt, 2, Sampling(top_k=1))
    assert generate(model, prompt, 2, Sampling(top_k=1), use_cache=False).shape == (1, 2)


def test_a_hugging_face_export_of_mamba_layers_names_what_nemotron_h_needs_in_one_line():
    """NemotronH (families/nemotron_h/) holds `M` layers beside relu2 MLPs and attention without positions."""
    from checkpoint.hf.folders import check_convertible

    with pytest.raises(ConfigError) as refused:
        check_convertible(parse_config(["--hybrid-layer-pattern", "M-*-", *TINY]).model,
                          "scripts/tools/convert_to_hf.py")
    assert "\n" not in str(refused.value) and "as a NemotronHForCausalLM this one would need" in str(refused.value)
