"""Megatron-LM's torch_dist checkpoints continued here (issue 62, item 1): `--load` of a Megatron-LM save folder.

The fixtures tests/fixtures/megatron_* were written by megatron-core 0.16.1's own code on CPU
(scripts/megatron_checkpoint_fixtures.py, in the benchmark venv: GPTModel on the local spec, its DDP, its optimizer
and scheduler, dist_checkpointing.save with the state dict megatron/training/checkpointing.py builds) at iteration
2, over tests/fixtures/megatron_data (written by its IndexedDatasetBuilder); the same driver resumed each from its
checkpoint and recorded the iteration-3 loss Megatron-Core computed (megatron_losses.json: `losses`, and the same
run uninterrupted in `uninterrupted_losses`). The six: TP 1 with the plain optimizer (GPT-2's block); TP 2 with
SwiGLU, GQA, RMSNorm and rope (plain optimizer); the distributed optimizer's dp_reshardable layout at TP 2 x DP 2;
its fully_reshardable layout at TP 1 x DP 2; dp_reshardable over two pipeline stages (the tied embedding on both,
loaded here on one); a mixture of experts (4 experts, top 2, SequentialMLP on the local spec, plain optimizer).

- The quick tests read the files: told apart from ours by content, our TP 1 model's names and shapes, the weights
  every layout holds read alike (a dp_reshardable bucket's fp32 master equals the model tensor it belongs to, which
  proves the rebuilt bucket layout element by element), the progress, and the refusals: a truncated chunk file,
  a linked-out file and a common.pt or DCP index that would run code are each refused in one line, exit 2.
- The slow test is the proof: pretrain_gpt.py with the fixture's Megatron-LM flags and --load trains iteration 3
  and logs the loss Megatron-Core computed, within 1e-5 relative (fp32; attention and the reductions run in
  another order); the TP 2 checkpoints at TP 1 here, the TP 2 one also at TP 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from checkpoint.megatron_common import is_megatron_checkpoint
from checkpoint.megatron_names import our_placements
from checkpoint.megatron_source import MegatronSource
from tests.readme import ROOT as REPO_ROOT

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NAMES = ("megatron_tp1", "megatron_tp2_swiglu_gqa", "megatron_distopt_dp_reshardable",
         "megatron_distopt_fully_reshardable", "megatron_pp2_distopt_dp_reshardable", "megatron_moe_sequential")


def record(name: str) -> dict:
    return json.loads((FIXTURES / name / "megatron_losses.json").read_text())


def iteration_dir(name: str) -> Path:
    return FIXTURES / name / "iter_0000002"


def our_flags(name: str, tensor_parallel: int = 1) -> list[str]:
    """The fixture's Megatron-LM flags at another TP size, on one pipeline stage."""
    flags = list(record(name)["flags"])
    for layout_flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size"):
        if layout_flag in flags:
            at = flags.index(layout_flag)
            del flags[at:at + 2]
    return flags + ["--tensor-model-parallel-size", str(tensor_parallel)]


def test_a_megatron_folder_is_told_from_ours_by_content():
    assert is_megatron_checkpoint(iteration_dir("megatron_tp1"))
    assert not is_megatron_checkpoint(FIXTURES / "checkpoint_84ae2c6" / "iter_0000002")


@pytest.mark.parametrize("name", NAMES)
def test_the_source_is_our_tp1_model_by_name_and_shape(name):
    from arguments.parser import parse_config
    from gpt.model import GPTModel
    from parallel.state import ParallelState

    config = parse_config(our_flags(name))
    model = GPTModel(config.model, ParallelState(device=torch.device("cpu")))
    ours = {n: tuple(p.shape) for n, p in model.named_parameters()}
    source = MegatronSource(iteration_dir(name))
    for key in source.keys():
        assert {n: info.shape for n, info in source.tensors(key).items()} == ours, key
    progress = source.progress()
    assert (progress.iteration, progress.consumed_samples, progress.schedule_samples, progress.optimizer_step) == \
        (2, 8, 8, 2)


@pytest.mark.parametrize("name", ["megatron_distopt_dp_reshardable", "megatron_distopt_fully_reshardable",
                                  "megatron_pp2_distopt_dp_reshardable"])
def test_the_distributed_optimizers_fp32_master_is_the_model_tensor_element_for_element(name):
    """An fp32 run's master weights are its weights: read through the optimizer's layout (the buckets of each TP
    rank, rebuilt here; or the per-parameter states), each of our tensors equals the model tensor Megatron-Core
    saved under its own key, in every region a rank might ask."""
    from checkpoint.dcp_reader import DcpReader

    source = MegatronSource(iteration_dir(name))
    assert source.layout == name.rsplit("_", 2)[-2] + "_reshardable"
    reader = DcpReader(iteration_dir(name))
    model = {}
    for key, md in reader.tensors().items():
        if not key.startswith("optimizer."):
            model.update(our_placements(key, tuple(md.size), "swiglu" in " ".join(record(name)["flags"])))
    assert sorted(model) == sorted(source.tensors("master"))
    for ours, placement in model.items():
        whole = tuple(slice(0, n) for n in placement.shape)
        expected = reader.read(placement.key, placement.region(whole)).reshape(placement.shape)
        assert torch.equal(source.read("master", ours, whole), expected), ours
        middle = tuple(slice(n // 3, n - n // 3) if n > 2 else slice(0, n) for n in placement.shape)
        assert torch.equal(source.read("master", ours, middle), expected[middle]), ours
        for moment in ("exp_avg", "exp_avg_sq"):
            values = source.read(moment, ours, whole)
            assert torch.isfinite(values).all() and values.abs().sum() > 0, (ours, moment)


# ---- refused in one line ---------------------------------------------------------------------------------

def _resume(tmp_path: Path, checkpoint: Path, name: str = "megatron_tp1"):
    import pretrain_gpt
    from tests.reliability_helpers import run_main

    return run_main(pretrain_gpt.main, our_flags(name) + ["--load", checkpoint, "--device", "cpu",
                                                          "--data-cache-dir", tmp_path / "cache",
                                                          "--metrics-file", tmp_path / "metrics.jsonl"])


@pytest.fixture
def megatron_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # the flags' --data-path is the repository's fixture data
    return Path(shutil.copytree(FIXTURES / "megatron_tp1", tmp_path / "megatron"))


def test_a_truncated_chunk_file_is_refused_in_one_line(tmp_path, megatron_copy):
    victim = megatron_copy / "iter_0000002" / "__0_1.distcp"
    with open(victim, "r+b") as file:
        file.truncate(victim.stat().st_size // 2)
    outcome = _resume(tmp_path, megatron_copy)
    outcome.one_error_line(str(victim), "truncated")


def test_a_file_linked_out_of_the_checkpoint_is_refused_in_one_line(tmp_path, megatron_copy):
    victim = megatron_copy / "iter_0000002" / "__0_0.distcp"
    outside = tmp_path / "elsewhere.distcp"
    shutil.move(victim, outside)
    os.symlink(outside, victim)
    outcome = _resume(tmp_path, megatron_copy)
    outcome.one_error_line(str(victim), "points outside the checkpoint")


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("touch ran-code-from-a-checkpoint",))


@pytest.mark.parametrize("victim", ["common.pt", ".metadata"])
def test_a_pickle_that_would_run_code_is_refused_and_not_run(tmp_path, megatron_copy, victim):
    path = megatron_copy / "iter_0000002" / victim
    if victim == "common.pt":
        torch.save({"iteration": 2, "args": argparse.Namespace(num_layers=2, exploit=_RunsCode())}, path)
    else:
        path.write_bytes(pickle.dumps(_RunsCode()))
    outcome = _resume(tmp_path, megatron_copy)
    outcome.one_error_line(str(path))
    assert "posix.system" in outcome.err or "system" in outcome.err
    assert not (REPO_ROOT / "ran-code-from-a-checkpoint").exists()


# ---- the next loss is Megatron's ------------------------------------------------------------------------------

def _iteration_3_loss(tmp_path: Path, name: str, flags: list[str]) -> tuple[float, str]:
    import pretrain_gpt
    from tests.reliability_helpers import metrics_records, run_main

    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    metrics = tmp_path / f"{name}.jsonl"
    outcome = run_main(pretrain_gpt.main, flags + ["--load", checkpoint, "--device", "cpu", "--log-interval", "1",
                                                   "--data-cache-dir", tmp_path / "cache", "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err[-3000:]
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert sorted(losses) == [3]
    return losses[3], outcome.out


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_pretrain_gpt_continues_a_megatron_checkpoint_to_megatrons_next_loss_at_tp1(tmp_path, monkeypatch, name):
    monkeypatch.chdir(REPO_ROOT)
    expected = record(name)
    assert expected["losses"]["3"] == expected["uninterrupted_losses"]["3"]  # Megatron's own resume is exact
    loss, out = _iteration_3_loss(tmp_path, name, our_flags(name))
    assert "> loading Megatron-LM torch_dist checkpoint" in out
    assert "resuming after iteration 2 (8 samples consumed)" in out
    assert loss == pytest.approx(expected["losses"]["3"], rel=1e-5, abs=0)


def resume_at_tp2(rank: int, world_size: int, checkpoint: str, cache: str, metrics: str) -> None:
    import pretrain_gpt

    os.chdir(REPO_ROOT)  # the flags' --data-path is the repository's fixture data
    assert pretrain_gpt.main(our_flags("megatron_tp2_swiglu_gqa", 2) + [
        "--load", checkpoint, "--device", "cpu", "--log-interval", "1", "--data-cache-dir", cache,
        "--metrics-file", metrics]) == 0


@pytest.mark.slow
def test_the_tp2_checkpoint_continues_at_tp2(tmp_path):
    from tests.distributed import run_distributed
    from tests.reliability_helpers import metrics_records

    name = "megatron_tp2_swiglu_gqa"
    checkpoint = shutil.copytree(FIXTURES / name, tmp_path / name)
    metrics = tmp_path / "metrics.jsonl"
    run_distributed(resume_at_tp2, 2, str(checkpoint), str(tmp_path / "cache"), str(metrics), timeout=300)
    losses = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert sorted(losses) == [3]
    assert losses[3] == pytest.approx(record(name)["losses"]["3"], rel=1e-5, abs=0)


def test_a_padded_vocabulary_is_named_at_the_load():
    """Megatron-Core's softmax takes the padding rows' logits, ours leaves them out: a checkpoint whose vocabulary
    is padded beyond the real ids is said to continue with other losses (here 101 real ids in its 128 rows)."""
    from arguments.parser import parse_config
    from checkpoint.megatron_resume import _vocabulary_padding
    from gpt.model import GPTModel
    from parallel.state import ParallelState
    from training.run_settings import model_vocabulary

    source = MegatronSource(iteration_dir("megatron_tp1"))
    for vocab, padding in ((127, 0), (100, 27)):
        flags = our_flags("megatron_tp1")
        flags[flags.index("--vocab-size") + 1] = str(vocab)
        config = parse_config(flags)
        # the model's vocabulary as a run decides it: NullTokenizer's ids and its end-of-document id
        model_config = dataclasses.replace(config.model, vocab_size=model_vocabulary(config, vocab + 1))
        model = GPTModel(model_config, ParallelState(device=torch.device("cpu")))
        assert _vocabulary_padding(source, model) == padding
