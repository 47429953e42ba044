"""The routers' expert bias is checked as every tensor is, before any weight is loaded (issue 110 item 3).

Megatron-Core keeps it as TopKRouter's persistent buffer `expert_bias`, fp32, of shape [num_experts] per layer
(megatron/core/transformer/moe/router.py, Router.__init__: `register_buffer('expert_bias', torch.zeros(
num_moe_experts))`; its `local_tokens_per_expert` is not persistent, and zero between iterations); its sharded state
dict stacks the layers' into `decoder.layers.mlp.router.expert_bias` [num_layers, num_experts], or keeps each under
`decoder.layers.<layer>.` where the layers differ (--moe-layer-freq) and in HybridModel's layout. A tiny MoE run
(--num-experts 4, sigmoid scores, the expert bias on) saves with --ckpt-format torch_dist in each layout; DCP itself
then rewrites the bias (tests/torch_dist_damage.py rewrite_tensors), and the same command resumes.

Before: 1 or 3 rows for 2 layers resumed (a layer's bias reset to 0 under a note, or a row dropped), a NaN trained
silently (the bias only chooses experts: the loss never diverges), a 1-D or 3-D tensor ended in a traceback after
the weights were loaded. Now each is one line naming the tensor and both shapes or the bad value, exit 2, nothing
trained and the checkpoint as it was; so is a router's bias missing from a resume that routes with one, in this
project's format too (a --finetune starts it at 0, said in a note).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import pretrain_gpt
from checkpoint.format import resolve_checkpoint
from tests.reliability_helpers import metrics_records, run_main, snapshot
from tests.torch_dist_damage import rewrite_tensors

STACKED = "decoder.layers.mlp.router.expert_bias"
ARGV = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "127", "--mock-data", "--device", "cpu", "--seed", "1",
        "--eval-iters", "0", "--log-interval", "1", "--lr-decay-iters", "4", "--num-experts", "4",
        "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-bias-update-rate", "0.05"]
# layout -> its flags: Megatron-Core's stacked layers, a layer of its own key (a dense first layer), HybridModel's
LAYOUTS = {"stacked": [], "per-layer": ["--moe-layer-freq", "[0,1]"], "hybrid": ["--hybrid-layer-pattern", "*E*E"]}


def _nan_at(shape: tuple[int, ...], at: tuple[int, ...]) -> torch.Tensor:
    values = torch.zeros(shape)
    values[at] = float("nan")
    return values


def _train(workdir: Path, *extra):
    return run_main(pretrain_gpt.main, [*ARGV, "--metrics-file", workdir / "metrics.jsonl", *extra])


@pytest.fixture(scope="module")
def saves(tmp_path_factory) -> dict[str, Path]:
    """Each layout's torch_dist save at iteration 2, and this project's format's (key "ours")."""
    work = tmp_path_factory.mktemp("expert-bias")
    found = {}
    for name, flags in {**{layout: [*flags, "--ckpt-format", "torch_dist"] for layout, flags in LAYOUTS.items()},
                        "ours": []}.items():
        outcome = _train(work, *flags, "--save", work / name, "--train-iters", "2")
        assert outcome.code == 0, outcome.err[-3000:]
        found[name] = work / name
    return found


def _refused(saves, layout: str, tmp_path: Path, damage, *words: str) -> str:
    """The save of `layout` copied and damaged, resumed by its own command: one line holding `words`, exit 2,
    no iteration trained, the checkpoint untouched."""
    checkpoint = Path(shutil.copytree(saves[layout], tmp_path / "ck"))
    damage(resolve_checkpoint(checkpoint))
    before = snapshot(checkpoint)
    flags = [*LAYOUTS.get(layout, []), *(["--ckpt-format", "torch_dist"] if layout in LAYOUTS else [])]
    outcome = _train(tmp_path, *flags, "--save", checkpoint, "--load", checkpoint, "--train-iters", "4")
    line = outcome.one_error_line(*words)
    metrics = tmp_path / "metrics.jsonl"
    assert not metrics.exists() or not [r for r in metrics_records(metrics) if "loss" in r]
    assert snapshot(checkpoint) == before
    return line


def _rewrite(key: str, values):
    return lambda iteration_dir: rewrite_tensors(iteration_dir, {key: values})


@pytest.mark.parametrize("values, said", [
    (torch.zeros(1, 4), "is [1, 4]; its args' 2 layers (num_layers) x 4 experts (num_experts) make [2, 4]"),
    (torch.zeros(3, 4), "is [3, 4]; its args' 2 layers (num_layers) x 4 experts (num_experts) make [2, 4]"),
    (torch.zeros(4), "is [4]; its args' 2 layers (num_layers) x 4 experts (num_experts) make [2, 4]"),
    (torch.zeros(2, 4, 1), "is [2, 4, 1]; its args' 2 layers (num_layers) x 4 experts (num_experts) make [2, 4]"),
    (_nan_at((2, 4), (1, 2)), "holds nan at [1, 2]: an expert bias must be finite"),
    (None, "holds no blocks.0.mlp.router.expert_bias, and this run routes with it (--moe-router-enable-expert-bias)"),
], ids=["1 row", "3 rows", "1-D", "3-D", "NaN", "missing"])
def test_a_stacked_expert_bias_of_another_shape_a_nan_or_none_is_one_line_before_any_weight(saves, tmp_path, values,
                                                                                          said):
    line = _refused(saves, "stacked", tmp_path, _rewrite(STACKED, values), said)
    assert (STACKED in line) == (values is not None)


@pytest.mark.parametrize("layout, key, values, said", [
    ("per-layer", "decoder.layers.1.mlp.router.expert_bias", torch.zeros(3),
     "is [3]; a router's bias holds one value per expert, 4 experts (num_experts): [4]"),
    ("per-layer", "decoder.layers.1.mlp.router.expert_bias", torch.zeros(1, 4), "is [1, 4]"),
    ("per-layer", "decoder.layers.1.mlp.router.expert_bias", _nan_at((4,), (3,)), "holds nan at [3]"),
    ("hybrid", "decoder.layers.3.mlp.router.expert_bias", torch.zeros(5), "is [5]"),
    ("hybrid", "decoder.layers.1.mlp.router.expert_bias", torch.full((4,), float("inf")), "holds inf at [0]"),
], ids=["per-layer 3 values", "per-layer 2-D", "per-layer NaN", "hybrid 5 values", "hybrid inf"])
def test_a_layers_own_expert_bias_is_checked_alike(saves, tmp_path, layout, key, values, said):
    _refused(saves, layout, tmp_path, _rewrite(key, values), key, said)


def test_a_bias_under_a_layer_that_holds_no_router_is_refused(saves, tmp_path):
    """HybridModel's layer 0 of `*E*E` is an attention layer: a bias under it would be routed by no router here
    (it was read as block None's)."""
    def move(iteration_dir: Path) -> None:
        values = torch.zeros(4)
        rewrite_tensors(iteration_dir, {"decoder.layers.1.mlp.router.expert_bias": None,
                                        "decoder.layers.0.mlp.router.expert_bias": values})

    _refused(saves, "hybrid", tmp_path, move, "its decoder.layers.0.mlp.router.expert_bias is [4]",
             "layer 0 is not an MoE layer of its args' pattern '*E*E'")


def _drop_from_metadata(name: str):
    def damage(iteration_dir: Path) -> None:
        path = iteration_dir / "metadata.json"
        metadata = json.loads(path.read_text())
        del metadata["expert_bias"][name]
        path.write_text(json.dumps(metadata))
    return damage


def test_this_projects_format_refuses_a_missing_bias_and_a_finetune_starts_it_at_zero(saves, tmp_path):
    name = "blocks.1.mlp.router.expert_bias"
    _refused(saves, "ours", tmp_path, _drop_from_metadata(name), f"holds no {name}, and this run routes with it")
    finetune = _train(tmp_path, "--load", tmp_path / "ck", "--finetune", "--train-iters", "1")
    assert finetune.code == 0, finetune.err[-3000:]
    assert f"holds no {name}; the expert bias starts at 0" in finetune.out


@pytest.mark.parametrize("flags", [
    ["--moe-layer-freq", "[0,1]", "--mtp-num-layers", "1", "--position-embedding-type", "rope"],
    ["--hybrid-layer-pattern", "*E*-/*-", "--position-embedding-type", "rope"],
    ["--moe-layer-freq", "2"]], ids=["dense first, MoE MTP", "hybrid, dense MTP", "every other layer"])
def test_the_routers_a_config_names_are_the_built_models(flags):
    """The export checks a checkpoint's biases against the model its config builds, without building it."""
    from arguments.parser import parse_config
    from checkpoint.router_state import biased_routers, configured_biased_routers
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    model = parse_config([*ARGV, *flags]).model
    built = biased_routers(GPTModel(model, ParallelState(device=torch.device("cpu"))))
    assert configured_biased_routers(model) == built and built


def test_a_bias_that_is_not_a_list_of_numbers_is_one_line():
    from base.errors import CheckpointError
    from checkpoint.router_state import check_expert_biases

    wanted = {"blocks.0.mlp.router.expert_bias": 2}
    for values, said in (([[1.0], [2.0, 3.0]], "is not a list of numbers"), (["a", "b"], "is not a list of numbers"),
                         ([0.0, float("-inf")], "holds -inf at expert 1")):
        with pytest.raises(CheckpointError, match=said):
            check_expert_biases({"blocks.0.mlp.router.expert_bias": values}, wanted, "ck", required=False)
    assert check_expert_biases({}, wanted, "ck", required=False) == ["blocks.0.mlp.router.expert_bias"]


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    """A tiny DeepSeek-V3 folder (its e_score_correction_bias is our expert bias), and a run of ours started from it
    and saved after one iteration."""
    from tests.checkpoint.moe_family_folders import family_folder
    from tests.checkpoint.test_hf_folder_is_the_model import RUN

    work = tmp_path_factory.mktemp("deepseek-bias")
    folder = family_folder("deepseek_v3", work / "hf")
    outcome = run_main(pretrain_gpt.main, ["--init-from-hf", folder, *RUN, "--data-cache-dir", work / "cache",
                                           "--metrics-file", work / "m.jsonl", "--save", work / "ck"])
    assert outcome.code == 0, outcome.err[-3000:]
    return folder, work


def test_a_hugging_face_folders_nan_bias_is_one_line_at_init(deepseek, tmp_path):
    from safetensors.torch import load_file, save_file

    from tests.checkpoint.test_hf_folder_is_the_model import RUN

    folder, work = deepseek
    damaged = Path(shutil.copytree(folder, tmp_path / "hf"))
    tensors = load_file(damaged / "model.safetensors")
    key = "model.layers.1.mlp.gate.e_score_correction_bias"
    tensors[key][2] = float("nan")
    save_file(tensors, damaged / "model.safetensors", metadata={"format": "pt"})
    outcome = run_main(pretrain_gpt.main, ["--init-from-hf", damaged, *RUN, "--data-cache-dir", work / "cache",
                                           "--metrics-file", tmp_path / "m.jsonl"])
    outcome.one_error_line("its blocks.1.mlp.router.expert_bias holds nan at expert 2")
    assert not (tmp_path / "m.jsonl").exists() or not metrics_records(tmp_path / "m.jsonl")


def test_the_export_checks_the_saved_bias_before_reading_a_weight(deepseek, tmp_path):
    from scripts.tools import convert_to_hf

    _, work = deepseek
    checkpoint = Path(shutil.copytree(work / "ck", tmp_path / "ck"))
    path = resolve_checkpoint(checkpoint) / "metadata.json"
    metadata = json.loads(path.read_text())
    name = "blocks.1.mlp.router.expert_bias"
    metadata["expert_bias"][name] = metadata["expert_bias"][name][:5]
    path.write_text(json.dumps(metadata))
    exported = run_main(convert_to_hf.main, [resolve_checkpoint(checkpoint), tmp_path / "hf"])
    exported.one_error_line(f"its {name} is [5]; this router has 8 experts (--num-experts), one value each: [8]")
    assert not (tmp_path / "hf").exists()
