"""The MoE families people start from (issue 63), each a tiny random folder saved by transformers
(tests/checkpoint/moe_family_folders.py): `pretrain_gpt.py --init-from-hf DIR` with no shape flag trains it, its
iteration 1 loss is transformers' on that iteration's tokens, and scripts/convert_to_hf.py's export of the checkpoint
saved after one step loads in transformers as the same class, its loss on iteration 2's tokens the one our run logged
at iteration 2 (computed with the weights and the routers' expert biases after step 1), to 1e-5 relative.

transformers' modeling file of each family is the spec (Qwen3MoeForCausalLM, DeepseekV3ForCausalLM, GptOssForCausalLM,
OlmoeForCausalLM, Glm4MoeForCausalLM); what each maps to is in arguments/hf_families/ (the settings) and
checkpoint/hf_families/ (the weights)."""

from __future__ import annotations

import json
import math

import pytest
import torch

import pretrain_gpt
from tests.checkpoint.moe_family_folders import FAMILIES, POSITIONS, family_folder
from tests.checkpoint.test_hf_folder_is_the_model import RUN, transformers_loss


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_folder_trains_from_its_loss_and_exports_as_its_class(family, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    import training.prepare
    from scripts import convert_to_hf

    folder = family_folder(family, tmp_path / "hf")
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
    model = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32)
    assert type(model).__name__ == FAMILIES[family][1]
    assert records[1]["loss"] != records[0]["loss"]
    assert math.isclose(records[1]["loss"], transformers_loss(exported, second), rel_tol=1e-5)
