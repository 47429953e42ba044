"""Gated DeltaNet, a `G` layer's mixer (gpt/gated_delta_net.py), against transformers' Qwen3NextGatedDeltaNet (5.24,
transformers/models/qwen3_next/modeling_qwen3_next.py, its torch path) on the same weights, its initialisation as
Megatron-Core's GatedDeltaNet, and the flags that place it (gpt/gdn_settings.py, gpt/layer_spec.py).

Our in_proj rows lie per query/key head, [q_i | k_i | its value heads' v | their z | their b | their a] (so that TP
splits whole heads, as Megatron-Core's TP split); Qwen3-Next's in_proj_qkvz holds per key head [q_i | k_i | v_i |
z_i], and in_proj_ba [b_i | a_i]; our conv1d channels lie per head [q_i | k_i | v_i], theirs [q | k | v]. dt_bias,
A_log, the gated norm's weight and out_proj are the same tensors in both.
"""

from __future__ import annotations

import math

import pytest
import torch

from base.errors import ConfigError
from gpt.layer_spec import mixer_symbols
from gpt.model import build_gpt_model
from parallel.state import ParallelState
from tests.distributed import run_distributed
from tests.gpt.test_llama_blocks import tiny_config

SINGLE = ParallelState(device=torch.device("cpu"))
GDN = dict(swiglu=True, normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope",
           linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
           linear_conv_kernel_dim=4)


def gdn_config(**overrides):
    return tiny_config(**{**GDN, "hybrid_layer_pattern": "G-*-", **overrides})


def qwen3_next_gated_delta_net(ours, config):
    """transformers' Qwen3NextGatedDeltaNet holding `ours`' weights, rearranged into its per-key-head layout."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    gdn = config.gdn
    hf_config = Qwen3NextConfig(
        hidden_size=config.hidden_size, linear_num_key_heads=gdn.linear_num_key_heads,
        linear_num_value_heads=gdn.linear_num_value_heads, linear_key_head_dim=gdn.linear_key_head_dim,
        linear_value_head_dim=gdn.linear_value_head_dim, linear_conv_kernel_dim=gdn.linear_conv_kernel_dim,
        hidden_act="silu", rms_norm_eps=config.norms.layernorm_epsilon, num_hidden_layers=1,
        layer_types=["linear_attention"])
    theirs = Qwen3NextGatedDeltaNet(hf_config, layer_idx=0)
    nk, nv, dk, dv = gdn.linear_num_key_heads, gdn.linear_num_value_heads, gdn.linear_key_head_dim, \
        gdn.linear_value_head_dim
    group = nv // nk
    # ours per query/key head: [q_i | k_i | v_i | z_i | b_i | a_i]; theirs [q_i | k_i | v_i | z_i] and [b_i | a_i]
    per_head = ours.in_proj.weight.detach().view(nk, -1, config.hidden_size)
    qkvz, ba = per_head.split([2 * dk + 2 * group * dv, 2 * group], dim=1)
    # our conv channels per head [q_i | k_i | v_i], theirs [q | k | v]
    q, k, v = ours.conv1d.weight.detach().view(nk, -1, 1, gdn.linear_conv_kernel_dim).split([dk, dk, group * dv], 1)
    with torch.no_grad():
        theirs.in_proj_qkvz.weight.copy_(qkvz.reshape(-1, config.hidden_size))
        theirs.in_proj_ba.weight.copy_(ba.reshape(-1, config.hidden_size))
        theirs.conv1d.weight.copy_(torch.cat([part.reshape(-1, 1, gdn.linear_conv_kernel_dim) for part in (q, k, v)]))
        theirs.dt_bias.copy_(ours.dt_bias)
        theirs.A_log.copy_(ours.A_log)
        theirs.norm.weight.copy_(ours.out_norm.weight)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
    return theirs


def test_forward_equals_qwen3_next_gated_delta_net():
    """fp32, within 1e-5 relative: 100 tokens (a chunk of 64 and a padded one), two key heads of two value heads
    each; dt_bias and the norm's weight moved off their initial values so that each reaches the output."""
    torch.manual_seed(0)
    config = gdn_config()
    ours = build_gpt_model(config, SINGLE, seed=3).blocks[0].attention
    with torch.no_grad():
        ours.dt_bias.copy_(torch.randn(4))
        ours.out_norm.weight.copy_(1 + 0.1 * torch.randn(12))
    theirs = qwen3_next_gated_delta_net(ours, config)
    hidden = torch.randn(2, 100, config.hidden_size)
    with torch.no_grad():
        expected, got = theirs(hidden), ours(hidden)
    assert got.shape == expected.shape == hidden.shape
    relative = ((got - expected).norm() / expected.norm()).item()
    assert relative < 1e-5, relative


def test_initialisation_is_megatrons():
    """GatedDeltaNet.reset_parameters: dt_bias ones, A_log log(uniform(1, 16)); conv1d nn.Conv1d's
    uniform(+-1/sqrt(width)); in_proj normal(0, --init-method-std); out_proj normal(0, std / sqrt(2 layers))."""
    config = gdn_config(linear_num_key_heads=8, linear_num_value_heads=64, linear_value_head_dim=32)
    gdn = build_gpt_model(config, SINGLE, seed=1).blocks[0].attention
    assert torch.equal(gdn.dt_bias, torch.ones(64))
    a = gdn.A_log.exp()
    assert a.min() >= 1 and a.max() < 16 and a.std() > 3  # uniform(1, 16)'s std is 4.3
    conv, bound = gdn.conv1d.weight, 1 / math.sqrt(4)
    assert conv.shape == (2 * 64 + 64 * 32, 1, 4)
    assert conv.abs().max() <= bound and conv.abs().max() > 0.95 * bound and abs(conv.mean()) < 0.02
    assert gdn.in_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert gdn.out_proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * 2), rel=0.05)


def test_parameter_names_are_megatrons():
    """GatedDeltaNet's state_dict order: its own parameters, then its submodules' in Megatron's order."""
    names = [name for name, _ in build_gpt_model(gdn_config(), SINGLE, seed=1).blocks[0].attention.named_parameters()]
    assert names == ["dt_bias", "A_log", "in_proj.weight", "conv1d.weight", "out_norm.weight", "out_proj.weight"]


def test_linear_attention_freq_places_the_layers():
    """Megatron-Core's get_linear_attention_pattern: N puts attention at each layer i with (i + 1) % N == 0."""
    flags = dict(hybrid_layer_pattern=None, experimental_attention_variant="gated_delta_net")
    assert mixer_symbols(gdn_config(num_layers=8, linear_attention_freq=4, **flags)) == tuple("GGG*GGG*")
    assert mixer_symbols(gdn_config(num_layers=4, linear_attention_freq="[1,0,0,1]", **flags)) == tuple("G**G")
    assert mixer_symbols(gdn_config(num_layers=3, linear_attention_freq=4, **flags)) == tuple("GGG")
    assert mixer_symbols(gdn_config(num_layers=2, hybrid_layer_pattern=None)) == tuple("**")


@pytest.mark.parametrize("overrides, words", [
    (dict(swiglu=False), "add --swiglu"),
    (dict(linear_num_value_heads=3), "must be a multiple of --linear-num-key-heads 2"),
    (dict(linear_conv_kernel_dim=0), "--linear-conv-kernel-dim must be at least 1"),
    (dict(hybrid_layer_pattern=None, experimental_attention_variant="gated_delta_net"),
     "needs --linear-attention-freq"),
    (dict(hybrid_layer_pattern=None, experimental_attention_variant="dsa"), "is not implemented here"),
    (dict(hybrid_layer_pattern=None, experimental_attention_variant="gdn", linear_attention_freq="[1]"),
     "gives 1 values; it needs one 1 (Gated DeltaNet) or 0 (attention) per layer"),
])
def test_refused_in_one_line(overrides, words):
    with pytest.raises(ConfigError, match=None) as error:
        gdn_config(**overrides).validate()
    assert words in str(error.value) and "\n" not in str(error.value)


def test_tensor_parallel_takes_whole_key_heads():
    with pytest.raises(ConfigError, match="--linear-num-key-heads 2 is not divisible by --tensor-model-parallel-size 4"):
        gdn_config().validate_tensor_parallel(4)
    gdn_config().validate_tensor_parallel(2)
    gdn_config(swiglu=False, hybrid_layer_pattern="*-*-").validate_tensor_parallel(4)  # no G layer: no refusal


def test_reset_attention_mask_is_said_not_to_reach_the_gdn_layers():
    """Megatron-Core's GatedDeltaNet takes attention_mask and reads none ("TODO: Deal with attention_mask"): its
    state runs over the whole sequence, and so does ours, said once at the start."""
    from arguments.parser import parse_config
    from training.run_settings import resolve_run_settings

    def notes(*flags):
        return [note for note in resolve_run_settings(parse_config(list(flags)), 128, 1, 1, "cpu").notes
                if "Gated DeltaNet" in note]

    assert notes("--hybrid-layer-pattern", "G-*-", "--swiglu") == []
    assert notes("--hybrid-layer-pattern", "*-*-", "--reset-attention-mask") == []
    (line,) = notes("--hybrid-layer-pattern", "G-*-", "--swiglu", "--reset-attention-mask")
    assert line.startswith("> --reset-attention-mask does not reach the Gated DeltaNet (`G`) layers")


def test_whether_some_layer_is_gdn_needs_no_tuple_per_layer():
    """A dry run may ask for 10^12 layers: the check over the GPT flags' GDN layers reads the frequency alone."""
    def settings(**values):
        return gdn_config(hybrid_layer_pattern=None, experimental_attention_variant="gated_delta_net", **values).gdn

    assert settings(linear_attention_freq=4).has_layers(10 ** 12)
    assert not settings(linear_attention_freq=1).has_layers(10 ** 12)  # attention at every layer
    assert settings(linear_attention_freq="[0,1]").has_layers(2) and not settings(
        linear_attention_freq="[0,0]").has_layers(2)
    assert not gdn_config().gdn.has_layers(10 ** 12)  # no variant: the pattern's `G`s are the GDN layers


def test_flags_and_defaults_are_megatron_lms():
    """megatron/training/arguments.py @ d98e8a64 (harvested in arguments/megatron/flags_harvested.json): the
    --linear-* sizes' dests and defaults (conv 4, key/value head dims 128, 16 key and 32 value heads),
    --linear-attention-freq without a default, and the variant's choices (gdn, gdn2, dsa, gated_delta_net)."""
    import dataclasses
    import json
    from pathlib import Path

    from gpt.gdn_settings import GatedDeltaNetSettings

    harvested = json.loads((Path(__file__).parents[2] / "arguments/megatron/flags_harvested.json").read_text())["flags"]
    ours = {field.name: field.default for field in dataclasses.fields(GatedDeltaNetSettings)}
    for name, default in ours.items():
        flag = harvested["--" + name.replace("_", "-")]
        assert flag["shapes"][0]["dest"] == name
        assert flag.get("defaults", {}).get("megatron-lm") == default, name
    variant = harvested["--experimental-attention-variant"]["shapes"][0]["choices"]
    assert set(variant) == {"gdn", "gdn2", "dsa", "gated_delta_net"}
    assert ours["linear_conv_kernel_dim"] == 4 and ours["linear_num_value_heads"] == 32


def _tp2_against_tp1(rank, world_size, sequence_parallel):
    from gpt.parallel_plan import tensor_parallel_plan
    from parallel.config import ParallelismConfig
    from parallel.state import destroy, initialize
    from tests.gpt.test_llama_blocks import check_gradients_are_tp1_slices, tokens_for

    state = initialize("cpu", tensor_parallel_size=2)
    try:
        config = gdn_config(seq_length=80, max_position_embeddings=80, num_attention_heads=4)
        plan = tensor_parallel_plan(state, ParallelismConfig(tensor_model_parallel_size=2,
                                                             sequence_parallel=sequence_parallel))
        ours = build_gpt_model(config, state, seed=11, plan=plan)
        reference = build_gpt_model(config, SINGLE, seed=11)
        tokens = tokens_for(config)
        with torch.no_grad():
            difference = (ours(tokens[:, :-1], tokens[:, 1:]) - reference(tokens[:, :-1], tokens[:, 1:])).abs().max()
        check_gradients_are_tp1_slices(ours, reference, tokens, state)
        return difference.item()
    finally:
        destroy(state)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_gdn_at_tp2_equals_tp1(sequence_parallel):
    """Megatron-Core's GatedDeltaNet under TP: each rank one query/key head with its two value heads (in_proj
    column-parallel, conv1d, dt_bias and A_log split with them, out_proj row-parallel). Per-token losses equal the
    TP 1 model's (<= 1e-6) and each rank's gradients are its slices of TP 1's (the gated norm's gain the whole: its
    gradient summed over the ranks' heads)."""
    assert all(difference <= 1e-6 for difference in run_distributed(_tp2_against_tp1, 2, sequence_parallel,
                                                                     timeout=300))


def test_generation_with_a_kv_cache_is_refused_in_one_line_and_runs_without():
    from gpt.generation import generate
    from gpt.sampling import Sampling

    model = build_gpt_model(gdn_config(), SINGLE, seed=1).eval()
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ConfigError, match="Gated DeltaNet .* keep no decoding state here"):
        generate(model, prompt, 2, Sampling(top_k=1))
    assert generate(model, prompt, 2, Sampling(top_k=1), use_cache=False).shape == (1, 2)


def test_a_torch_dist_save_writes_megatron_lms_layout(tmp_path):
    """Megatron-Core's GatedDeltaNet names (checkpoint/torch_dist/names.py; tests/checkpoint/
    test_torch_dist_mamba_gdn.py): --ckpt-format torch_dist with `G` layers writes Megatron-LM's layout, with no
    start line; multi-token prediction beside the GPT path's Gated DeltaNet layers saves this project's format."""
    from arguments.parser import parse_config

    def unwritten(*flags):
        return parse_config([*flags, "--swiglu", "--ckpt-format", "torch_dist", "--save", str(tmp_path)]) \
            .megatron_format_unwritten() or ""

    gpt_path = ("--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "2",
                "--num-layers", "2")
    assert unwritten("--hybrid-layer-pattern", "G-*-") == "" and unwritten(*gpt_path) == ""
    assert "multi-token prediction beside --experimental-attention-variant" in unwritten(
        *gpt_path, "--mtp-num-layers", "1", "--position-embedding-type", "rope")
