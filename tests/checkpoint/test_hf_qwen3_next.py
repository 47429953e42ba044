"""Qwen3-Next (families/qwen3_next/) against transformers 5.24's Qwen3NextForCausalLM (models/qwen3_next/
modeling_qwen3_next.py, its torch path) on a tiny random folder saved by transformers: Gated DeltaNet and gated
attention layers, MoE layers with a gated shared expert and one dense layer, partial rotary, fp32, 80 positions (the
DeltaNet scans a chunk of 64 and a padded one).

`--init-from-hf` reads it as `--hybrid-layer-pattern GE*-GE*E` with Qwen3-Next's settings, and our logits are
transformers'; a run started from it trains, scripts/tools/convert_to_hf.py's export loads in transformers with no code
of ours, and transformers' loss on the next batch is the loss our run logged for it."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

import pretrain_gpt
from arguments.config import PretrainConfig
from base.errors import ConfigError
from base.options import replace_settings
from tests.checkpoint.test_hf_folder_is_the_model import RUN, VOCAB, transformers_loss
from tests.checkpoint.test_hf_llama import CPU, build, our_logits

POSITIONS = 80
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]
QWEN3_NEXT = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=96, layer_types=LAYER_TYPES, linear_num_key_heads=2, linear_num_value_heads=4,
    linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=4, moe_intermediate_size=32,
    shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2, mlp_only_layers=[1],
    max_position_embeddings=POSITIONS, rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
    eos_token_id=None, pad_token_id=None,
    rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})


def qwen3_next_folder(path, **changes):
    """A Qwen3NextForCausalLM with every weight random (~N(0, 0.2); the DeltaNet's gated norm, which stores the gain
    itself, around 1), saved by transformers."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    model = Qwen3NextForCausalLM(Qwen3NextConfig(**{**QWEN3_NEXT, **changes}))
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            gain = name.endswith("linear_attn.norm.weight")
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + (1.0 if gain else 0.0))
    model.save_pretrained(str(path))
    return path


def test_a_folder_reads_as_its_pattern_and_gives_transformers_logits(tmp_path):
    """fp32, within 1e-5 relative, over all 80 positions of two sequences."""
    from transformers import Qwen3NextForCausalLM

    from arguments.parser import parse_config
    from checkpoint.hf.source import initialize_from_hf

    folder = qwen3_next_folder(tmp_path / "hf")
    read = parse_config(["--init-from-hf", str(folder)]).model
    assert read.hybrid_layer_pattern == "GE*-GE*E"
    assert (read.norms.apply_layernorm_1p, read.attention.attention_output_gate, read.attention.qk_layernorm,
            read.positions.rotary_percent, read.head_dim) == (True, True, True, 0.5, 16)
    assert (read.gdn.linear_num_key_heads, read.gdn.linear_num_value_heads, read.gdn.linear_key_head_dim,
            read.gdn.linear_value_head_dim, read.gdn.linear_conv_kernel_dim) == (2, 4, 8, 12, 4)
    assert (read.moe.num_experts, read.moe.router_topk, read.moe.ffn_hidden_size,
            read.moe.shared_expert_intermediate_size, read.moe.shared_expert_gate, read.moe.router_pre_softmax) == \
        (4, 2, 32, 48, True, False)
    config = PretrainConfig()
    config = dataclasses.replace(config, model=replace_settings(read, vocab_size=VOCAB, hidden_dropout=0.0,
                                                                attention_dropout=0.0))
    model, optimizer = build(config)
    initialize_from_hf(optimizer, model, folder, config.model, CPU)
    tokens = torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(1))
    theirs_model = Qwen3NextForCausalLM.from_pretrained(str(folder), attn_implementation="eager",
                                                        dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = theirs_model(tokens).logits
    relative = ((our_logits(model, tokens) - theirs).norm() / theirs.norm()).item()
    assert relative < 1e-5, relative


@pytest.mark.slow
def test_a_folder_trains_and_its_export_gives_our_loss(tmp_path, monkeypatch):
    """`pretrain_gpt.py --init-from-hf DIR` trains 3 iterations on the embedded corpus (documents of varied lengths,
    80 tokens a row) saving after 2; the export of that checkpoint loads as a Qwen3NextForCausalLM with every weight
    in place, and transformers' loss on iteration 3's batch is the loss the run logged for it, within 1e-6."""
    from transformers import AutoModelForCausalLM

    import training.prepare
    from scripts.tools import convert_to_hf

    folder = qwen3_next_folder(tmp_path / "hf")
    built = []
    build_data = training.prepare.build_data
    monkeypatch.setattr("training.prepare.build_data", lambda *args: built.append(build_data(*args)) or built[-1])
    metrics, checkpoints = tmp_path / "m.jsonl", tmp_path / "checkpoints"
    argv = ["--init-from-hf", str(folder), *RUN, "--train-iters", "3", "--lr", "1e-3", "--lr-warmup-iters", "0",
            "--save", str(checkpoints), "--save-interval", "2", "--data-cache-dir", str(tmp_path / "cache"),
            "--metrics-file", str(metrics)]
    assert pretrain_gpt.main(argv) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [record["iteration"] for record in records] == [1, 2, 3]
    batches = iter(built[0].make_train_loader(0))  # the run's micro-batches: one an iteration
    first, _, third = (next(batches)["tokens"] for _ in range(3))
    assert third.shape == (2, POSITIONS + 1)
    assert math.isclose(records[0]["loss"], transformers_loss(folder, first), rel_tol=1e-6)

    exported = tmp_path / "exported"
    assert convert_to_hf.main([str(checkpoints / "iter_0000002"), str(exported)]) == 0
    written = json.loads((exported / "config.json").read_text())
    assert (written["model_type"], written["layer_types"], written["mlp_only_layers"]) == \
        ("qwen3_next", LAYER_TYPES, [1])
    model, loading = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32,
                                                          output_loading_info=True)
    assert type(model).__name__ == "Qwen3NextForCausalLM"
    assert not any(loading.values()), loading  # no missing, unexpected or mismatched weight
    assert records[2]["loss"] != records[0]["loss"]
    assert math.isclose(records[2]["loss"], transformers_loss(exported, third), rel_tol=1e-6)


@pytest.mark.parametrize("change, named", [
    ({"layer_types": ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]},
     "layer_types must name one of linear_attention, full_attention for each of the 4 layers"),
    ({"layer_types": LAYER_TYPES[:3]}, "found 3 entries"),
    ({"attention_bias": True}, "attention_bias true"),
])
def test_a_field_the_blocks_cannot_compute_is_refused_in_one_line(change, named, tmp_path):
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings

    folder = qwen3_next_folder(tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ConfigError) as error:
        architecture_settings(read_hf_config(folder))
    assert named in str(error.value) and "\n" not in str(error.value)


def test_an_older_file_without_layer_types_reads_as_transformers_does(tmp_path):
    """The released config.json: full_attention_interval and a top-level partial_rotary_factor (else 0.25)."""
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings

    folder = qwen3_next_folder(tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    del config["layer_types"]
    config.update(full_attention_interval=2, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    (folder / "config.json").write_text(json.dumps(config))
    settings = architecture_settings(read_hf_config(folder))
    assert (settings["hybrid_layer_pattern"].value, settings["rotary_percent"].value) == ("GE*-GE*E", 0.25)
    (folder / "config.json").write_text(json.dumps({**config, "partial_rotary_factor": 0.5}))
    assert architecture_settings(read_hf_config(folder))["rotary_percent"].value == 0.5


@pytest.mark.parametrize("change, named", [
    (dict(apply_layernorm_1p=False), "--apply-layernorm-1p"),
    (dict(attention_output_gate=False), "--attention-output-gate"),
    (dict(moe_shared_expert_gate=False), "--moe-shared-expert-gate"),
    (dict(hybrid_layer_pattern="GE+-GE+E"), "a --hybrid-layer-pattern of `G` (Gated DeltaNet) and `*` (attention) "
                                            "layers alone"),
])
def test_a_model_qwen3_next_cannot_hold_is_refused_in_one_line(change, named, tmp_path):
    from arguments.parser import parse_config
    from checkpoint.hf.folders import check_convertible

    read = parse_config(["--init-from-hf", str(qwen3_next_folder(tmp_path / "hf"))]).model
    check_convertible(read, "the Hugging Face export")
    with pytest.raises(ConfigError) as error:
        check_convertible(replace_settings(read, **change), "the Hugging Face export")
    assert named in str(error.value) and "Qwen3NextForCausalLM" in str(error.value) and "\n" not in str(error.value)
