"""The MoE families people start from (issue 63), each a tiny random folder saved by transformers
(tests/checkpoint/moe_family_folders.py): `pretrain_gpt.py --init-from-hf DIR` with no shape flag trains it, its
iteration 1 loss is transformers' on that iteration's tokens, and scripts/tools/convert_to_hf.py's export of the
checkpoint saved after one step loads in transformers as the same class, its loss on iteration 2's tokens the one our
run logged at iteration 2 (computed with the weights and the routers' expert biases after step 1), to 1e-5 relative.

transformers' modeling file of each family is the spec (Qwen3MoeForCausalLM, DeepseekV3ForCausalLM, GptOssForCausalLM,
OlmoeForCausalLM, Glm4MoeForCausalLM); what each maps to is in its folder of families/ (config.py the
settings, weights.py the weights)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import pretrain_gpt
from base.errors import ConfigError
from tests.checkpoint.moe_family_folders import FAMILIES, POSITIONS, family_folder
from tests.checkpoint.test_hf_folder_is_the_model import RUN, transformers_loss

# (family, config.json keys changed after save_pretrained): OLMoE's clip_qkv at 0.3 clamps many of this folder's
# q, k and v (its weights ~N(0, 0.2), hidden 64), so the losses tell the clamp from its absence
VARIANTS = [*((family, {}) for family in sorted(FAMILIES)), ("olmoe", {"clip_qkv": 0.3})]


@pytest.mark.slow
@pytest.mark.parametrize("family, change", VARIANTS, ids=[f"{f}{'-' + '-'.join(c) if c else ''}" for f, c in VARIANTS])
def test_a_family_folder_trains_from_its_loss_and_exports_as_its_class(family, change, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    import training.prepare
    from scripts.tools import convert_to_hf

    folder = family_folder(family, tmp_path / "hf")
    written = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**written, **change}))
    built = []
    build_data = training.prepare.build_data
    monkeypatch.setattr("training.prepare.build_data", lambda *args: built.append(build_data(*args)) or built[-1])
    metrics, checkpoints = tmp_path / "m.jsonl", tmp_path / "checkpoints"
    argv = ["--init-from-hf", str(folder), *RUN, "--train-iters", "2", "--lr", "1e-3", "--lr-warmup-iters", "0",
            "--save", str(checkpoints), "--save-interval", "1", "--data-cache-dir", str(tmp_path / "cache"),
            "--metrics-file", str(metrics)]
    assert pretrain_gpt.main(argv) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [record["iteration"] for record in records] == [1, 2]
    batches = iter(built[0].make_train_loader(0))  # the run's micro-batches: one an iteration
    first, second = next(batches)["tokens"], next(batches)["tokens"]
    assert first.shape == (2, POSITIONS + 1)
    assert math.isclose(records[0]["loss"], transformers_loss(folder, first), rel_tol=1e-5)

    exported = tmp_path / "exported"
    assert convert_to_hf.main([str(checkpoints / "iter_0000001"), str(exported)]) == 0
    assert json.loads((exported / "config.json").read_text())["model_type"] == family
    assert {key: json.loads((exported / "config.json").read_text())[key] for key in change} == change
    model = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32)
    assert type(model).__name__ == FAMILIES[family][1]
    assert records[1]["loss"] != records[0]["loss"]
    assert math.isclose(records[1]["loss"], transformers_loss(exported, second), rel_tol=1e-5)


@pytest.mark.parametrize("family, change, named", [
    ("deepseek_v3", {"norm_topk_prob": False}, "norm_topk_prob false"),
    ("deepseek_v3", {"topk_method": "greedy"}, "topk_method 'greedy'"),
    ("deepseek_v3", {"q_lora_rank": None}, "q_lora_rank null"),
    ("glm4_moe", {"n_group": 2, "topk_group": 1, "num_experts_per_tok": 4}, "num_experts_per_tok 4 over topk_group 1"),
    ("gpt_oss", {"swiglu_alpha": 1.5}, "swiglu_alpha 1.5"),
    ("gpt_oss", {"attention_bias": False}, "attention_bias false"),
    ("qwen3_moe", {"use_sliding_window": True}, "use_sliding_window true"),
])
def test_a_field_the_blocks_cannot_compute_is_refused_in_one_line(family, change, named, tmp_path):
    """What the family's transformers model would compute and no setting here gives is named with its value."""
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings

    folder = family_folder(family, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(ConfigError) as error:
        architecture_settings(read_hf_config(folder))
    assert named in str(error.value) and "\n" not in str(error.value)


def test_quantized_weights_are_refused_and_the_mtp_layers_named(tmp_path):
    """A released DeepSeek-V3 folder holds fp8 blocks with their scales and the MTP layer after the decoder: the
    scales are refused in one line; transformers drops the MTP layer, and the start line says so."""
    from safetensors.torch import load_file, save_file

    from arguments.hf_config import read_hf_config
    from checkpoint.hf.folders import read_hf_model

    folder = family_folder("deepseek_v3", tmp_path / "hf")
    assert "num_nextn_predict_layers 1: DeepseekV3ForCausalLM has no multi-token prediction layers" in \
        read_hf_config(folder).notes[0]
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "model.layers.2.mlp.gate.weight": torch.zeros(8, 64)}, str(folder / "model.safetensors"))
    _, state = read_hf_model(folder)  # the MTP layer's tensors (layer 2 of 2) are not read
    assert not any(name.startswith("model.layers.2.") for name in state)
    save_file({**tensors, "model.layers.0.mlp.up_proj.weight_scale_inv": torch.ones(1, 1)},
              str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match="weights are quantized .model.layers.0.mlp.up_proj.weight_scale_inv"):
        read_hf_model(folder)
