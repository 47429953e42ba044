"""NemotronH (families/nemotron_h/): a tiny `M*-M-` folder made and saved by transformers (NemotronHForCausalLM, fp32,
Megatron's Mamba initial ranges for A and dt so the decays are a trained model's): the model --init-from-hf reads
gives transformers' logits over a sequence that crosses a Mamba chunk; `pretrain_gpt.py --init-from-hf` trains it,
scripts/tools/convert_to_hf.py exports it, and transformers' own class loads the export with the run's loss on the next
batch. What its blocks cannot compute is refused in one line."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import pretrain_gpt
from base.errors import ConfigError
from gpt.mamba_settings import MambaSettings
from tests.checkpoint.hf_random import fill_random
from tests.checkpoint.test_hf_folder_is_the_model import RUN, transformers_loss

VOCAB, SEQ = 320, MambaSettings.CHUNK_SIZE + 40  # two chunks, the second one padded


# `E` layers: DeepSeek-V3's router with its groups and scaling, relu2 experts and a shared expert
MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, moe_shared_expert_intermediate_size=40,
           n_group=2, topk_group=1, routed_scaling_factor=2.5)
PATTERNS = {"M*-M-": {}, "M*EM-E": MOE}


def nemotron_h_folder(path: Path, pattern: str = "M*-M-", **changes) -> Path:
    from transformers import NemotronHConfig, NemotronHForCausalLM

    # time_step_min: fp32's smallest normal number, as the export writes it (transformers would clamp dt at it)
    config = NemotronHConfig(vocab_size=VOCAB, hidden_size=32, hybrid_override_pattern=pattern, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=8, intermediate_size=48, mamba_num_heads=8,
                             mamba_head_dim=8, ssm_state_size=8, n_groups=2, max_position_embeddings=SEQ,
                             time_step_min=torch.finfo(torch.float32).tiny, bos_token_id=None, eos_token_id=None,
                             pad_token_id=None, **{**PATTERNS.get(pattern, {}), **changes})
    model = NemotronHForCausalLM(config)
    fill_random(model, seed=3, scale=0.2)
    generator = torch.Generator().manual_seed(4)
    low, high = math.log(MambaSettings.DT_MIN), math.log(MambaSettings.DT_MAX)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn(buffer.shape, generator=generator) * 0.1)
        for name, param in model.named_parameters():
            if name.endswith("A_log"):  # A from U[1, 16], dt log-uniform in [dt_min, dt_max]: MambaMixer's ranges
                param.copy_(torch.log(torch.rand(param.shape, generator=generator) * 15 + 1))
            elif name.endswith("gate.weight"):  # the router's logits spread over the experts
                param.mul_(5)
            elif name.endswith("dt_bias"):
                dt = torch.exp(torch.rand(param.shape, generator=generator) * (high - low) + low)
                param.copy_(dt + torch.log(-torch.expm1(-dt)))
    model.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_folder_read_by_init_from_hf_gives_transformers_logits(tmp_path, pattern):
    from transformers import NemotronHForCausalLM

    from arguments.parser import parse_arguments
    from checkpoint.hf.source import load_hf_weights
    from checkpoint.router_state import restore_expert_biases
    from gpt.model import build_gpt_model
    from parallel.state import ParallelState

    folder = nemotron_h_folder(tmp_path / "hf", pattern)
    parsed = parse_arguments(["--init-from-hf", str(folder), "--seq-length", str(SEQ), "--device", "cpu"])
    config = dataclasses.replace(parsed.config.model, vocab_size=VOCAB)  # the run's tokenizer sets it
    blocks = {"M*-M-": 3, "M*EM-E": 4}[pattern]  # a mixer and the MLP after it are one block
    assert (config.hybrid_layer_pattern, config.num_layers, config.mlp.activation) == (pattern, blocks, "squared_relu")
    state = ParallelState(device=torch.device("cpu"))
    weights = load_hf_weights(folder, config, state)
    ours = build_gpt_model(config, state, seed=1).eval()
    biases = {name: weights.pop(name) for name in list(weights) if name.endswith("router.expert_bias")}
    assert set(weights) == {name for name, _ in ours.named_parameters()}
    assert len(biases) == 2 * bool(config.moe)
    tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    theirs = NemotronHForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in ours.named_parameters():
            param.copy_(weights[name])
        restore_expert_biases(ours, {name: bias.tolist() for name, bias in biases.items()}, torch.device("cpu"))
        got, expected = ours(tokens)[..., :VOCAB], theirs(tokens).logits
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max(), (got - expected).abs().max()


@pytest.mark.slow
@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_folder_trains_and_exports_as_nemotron_h_with_the_runs_loss(tmp_path, monkeypatch, pattern):
    from transformers import AutoModelForCausalLM

    import training.prepare
    from scripts.tools import convert_to_hf

    folder = nemotron_h_folder(tmp_path / "hf", pattern)
    built = []
    build_data = training.prepare.build_data
    monkeypatch.setattr("training.prepare.build_data", lambda *args: built.append(build_data(*args)) or built[-1])
    metrics, checkpoints = tmp_path / "m.jsonl", tmp_path / "checkpoints"
    assert pretrain_gpt.main(["--init-from-hf", str(folder), *RUN, "--train-iters", "2", "--lr", "1e-3",
                              "--lr-warmup-iters", "0", "--seq-length", str(SEQ), "--save", str(checkpoints),
                              "--save-interval", "1", "--data-cache-dir", str(tmp_path / "cache"),
                              "--metrics-file", str(metrics)]) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    batches = iter(built[0].make_train_loader(0))  # the run's micro-batches (documents of varied lengths)
    first, second = next(batches)["tokens"], next(batches)["tokens"]
    assert first.shape == (2, SEQ + 1)
    assert math.isclose(records[0]["loss"], transformers_loss(folder, first), rel_tol=1e-6)

    exported = tmp_path / "exported"
    assert convert_to_hf.main([str(checkpoints / "iter_0000001"), str(exported)]) == 0
    written = json.loads((exported / "config.json").read_text())
    kinds = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    assert (written["model_type"], written["layers_block_type"]) == ("nemotron_h", [kinds[s] for s in pattern])
    model = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32)
    assert type(model).__name__ == "NemotronHForCausalLM"
    assert records[1]["loss"] != records[0]["loss"]
    assert math.isclose(records[1]["loss"], transformers_loss(exported, second), rel_tol=1e-6)


@pytest.mark.parametrize("pattern, change, named", [
    ("M*E", {"moe_latent_size": 16}, "moe_latent_size 16"),
    ("M*E", {"norm_topk_prob": False}, "norm_topk_prob false"),
    ("M*-", {"use_bias": True}, "use_bias true"),
    ("M*-", {"conv_kernel": 3}, "conv_kernel 3"),
    ("M*-", {"mlp_hidden_act": "silu"}, "mlp_hidden_act 'silu'"),
    ("M*-", {"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon 1e-06"),
])
def test_what_the_blocks_cannot_compute_is_refused_in_one_line(pattern, change, named, tmp_path):
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings

    folder = nemotron_h_folder(tmp_path / "hf", pattern)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ConfigError) as error:
        architecture_settings(read_hf_config(folder))
    assert named in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_a_releases_dt_clamp_and_old_names_are_read_and_said(tmp_path):
    """A released config.json names the pattern hybrid_override_pattern and the groups mamba_n_groups; its
    time_step_min 0.001, which transformers clamps dt at and Megatron's MambaMixer does not, is said at start-up."""
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings

    folder = nemotron_h_folder(tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    config = {key: value for key, value in config.items() if key not in ("layers_block_type", "n_groups")}
    (folder / "config.json").write_text(json.dumps({**config, "hybrid_override_pattern": "M-*-",
                                                    "mamba_n_groups": 4, "time_step_min": 0.001}))
    read = read_hf_config(folder)
    settings = {name: given.value for name, given in architecture_settings(read).items()}
    assert (settings["hybrid_layer_pattern"], settings["num_layers"], settings["mamba_num_groups"]) == ("M-*-", 2, 4)
    assert any("time_step_min 0.001" in note and "do not" in note for note in read.notes), read.notes


def test_an_export_that_is_no_nemotron_h_names_its_flags(tmp_path):
    from arguments.parser import parse_config
    from checkpoint.hf.folders import check_convertible

    config = parse_config(["--hybrid-layer-pattern", "M*-", "--hidden-size", "32", "--num-attention-heads", "4",
                           "--vocab-size", "64", "--mamba-head-dim", "8", "--mamba-num-groups", "2",
                           "--mamba-state-dim", "8", "--swiglu"]).model
    with pytest.raises(ConfigError) as refused:
        check_convertible(config, "scripts/tools/convert_to_hf.py")
    message = str(refused.value)
    assert "as a NemotronHForCausalLM this one would need" in message and "no --swiglu" in message, message
    assert "--untie-embeddings-and-output-weights" in message and "\n" not in message


def test_one_part_blocks_another_family_claims_are_refused_not_dropped():
    """A `+E+` model (MLA, DeepSeek-V3's router) is DeepSeek-V3's, whose class has no one-part blocks: refused in one
    line rather than written as a DeepSeek-V3 without its lone `+` block's missing MLP."""
    from arguments.parser import parse_config
    from checkpoint.hf.folders import check_convertible
    from families.registry import family_of

    config = parse_config(["--hybrid-layer-pattern", "+E+", "--hidden-size", "32", "--num-attention-heads", "4",
                           "--vocab-size", "64", "--multi-latent-attention", "--kv-lora-rank", "8", "--num-experts",
                           "4", "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                           "--moe-shared-expert-intermediate-size", "32", "--swiglu", "--normalization", "RMSNorm",
                           "--disable-bias-linear", "--position-embedding-type", "rope"]).model
    assert family_of(config).model_type == "deepseek_v3"
    with pytest.raises(ConfigError) as refused:
        check_convertible(config, "scripts/tools/convert_to_hf.py")
    assert "are no Hugging Face family here" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow
def test_the_folder_at_tp2_with_sequence_parallel_trains_as_tp1(tmp_path, corpus_cache_300):
    """Each part of in_proj and the conv (z, x, B, C, dt) split on its own over the ranks as the folder is read: TP 2
    with --sequence-parallel gives TP 1's losses and gradient norms over the same 2 ranks."""
    from tests.training.test_moe_families_parallel import assert_equal_runs, run_variants

    folder = nemotron_h_folder(tmp_path / "hf")
    runs = run_variants(tmp_path, folder, corpus_cache_300, {
        "tp1": ["--seq-length", str(SEQ)],
        "tp2_sp": ["--seq-length", str(SEQ), "--tensor-model-parallel-size", "2", "--sequence-parallel"]})
    assert_equal_runs(runs, "tp1")
