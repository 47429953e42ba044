"""Checkpoints by pipeline stage (issue 38, point 4 and its acceptance "Save at PP 2, resume at PP 1 and at PP 4:
losses continue exactly"), fp32 on gloo, in ONE 4-rank launch that runs in turn:

  1. pretrain_gpt at PP 2 x DP 2 (ZeRO 1), 6 iterations, saving at 3 and 6: the uninterrupted run;
  2. pretrain_gpt at PP 4 (DP 1) resuming from its iteration-3 checkpoint;
  3. pretrain_gpt at PP 1 (DP 4) resuming from the same checkpoint, and at PP 2 x DP 2 again;
  4. that checkpoint loaded at PP 1 x DP 4 through the API and saved again at PP 1: "the same model saved at PP 1".

The resumed iterations 4-6 give the uninterrupted losses and gradient norms to 1e-6 relative (PP 4 and PP 1 sum the
tied embedding's gradient halves and the norm's per-stage squares in another order: ~2.6e-7); at PP 2 x DP 2, the
same order, bitwise. The state moves exactly: the PP 1 re-save holds the PP 2 checkpoint's master and both moments
bitwise, and zero_to_fp32 and the HF export of the two are bitwise equal. The real pair: Megatron-LM names a stage's
files by (tensor, pipeline) rank (checkpointing.py get_checkpoint_name: `mp_rank_{tp:02d}_{pp:03d}`) and its
dist-checkpointing resumes at another PP by keying every tensor by its global name, as our fragment table's names
are. The tied embedding's last-stage copy is stored once, under the first stage's name, as Megatron-Core's
tie_embeddings_and_output_weights_state_dict does (language_module.py: replica_id (1, 0, dp), never written)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.distributed import free_port, run_distributed

FLAGS = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
         "--train-iters", "6", "--seed", "1", "--log-interval", "1", "--eval-iters", "0", "--lr", "1e-3",
         "--tokenizer-vocab-size", "512", "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--zero-stage", "1"]
SAVED_AT = 3


def _launch(argv: list[str], port: int) -> None:
    import pretrain_gpt

    os.environ["MASTER_PORT"] = str(port)  # a fresh rendezvous for each grid
    assert pretrain_gpt.main(argv) == 0


def _resave_at_one_stage(common: list[str], source, target, port: int) -> None:
    """The PP 2 checkpoint loaded at PP 1 (DP 4 here) and saved again, through the API a run uses."""
    from arguments.parser import parse_config
    from checkpoint.format import read_metadata
    from checkpoint.ours.sharded import load_checkpoint, save_checkpoint
    from parallel.state import destroy, initialize
    from training.build import build
    from training.run_settings import resolve_run_settings

    os.environ["MASTER_PORT"] = str(port)
    config = parse_config(common)
    state = initialize("cpu", 1)
    try:
        vocab = read_metadata(Path(source))["config"]["model"]["vocab_size"]
        settings = resolve_run_settings(config, vocab, state.tensor_parallel_size, state.data_parallel_size, "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=False)
        resumed = load_checkpoint(source, built.model, built.zero.optimizer, built.rng, state)
        save_checkpoint(target, resumed.iteration, resumed.consumed_samples, built.model, built.zero.optimizer,
                        built.rng, settings.config, state)
    finally:
        destroy(state)


def save_then_resume_at_other_stage_counts(rank: int, world_size: int, tmp: str, data_cache: str,
                                           ports: list[int]) -> None:
    common = [*FLAGS, "--data-cache-dir", data_cache]
    saved = os.path.join(tmp, "pp2", f"iter_{SAVED_AT:07d}")
    _launch([*common, "--pipeline-model-parallel-size", "2", "--save", os.path.join(tmp, "pp2"),
             "--save-interval", str(SAVED_AT), "--metrics-file", os.path.join(tmp, "pp2.jsonl")], ports[0])
    _launch([*common, "--pipeline-model-parallel-size", "4", "--load", saved,
             "--metrics-file", os.path.join(tmp, "pp4.jsonl")], ports[1])
    _launch([*common, "--load", saved, "--metrics-file", os.path.join(tmp, "pp1.jsonl")], ports[2])
    _launch([*common, "--pipeline-model-parallel-size", "2", "--load", saved,
             "--metrics-file", os.path.join(tmp, "pp2-resumed.jsonl")], ports[3])
    _resave_at_one_stage(common, saved, os.path.join(tmp, "pp1-resaved"), ports[4])


def _training_records(path) -> list[dict]:
    return [record for record in map(json.loads, open(path)) if record.get("split") is None and "loss" in record]


@pytest.mark.slow
def test_save_at_pp2_resumes_at_pp1_and_pp4_and_exports_as_the_one_stage_checkpoint(tmp_path, corpus_cache):
    from base.errors import CheckpointError
    from checkpoint.format import read_metadata, resolve_checkpoint
    from checkpoint.hf.folders import checkpoint_to_hf_state
    from checkpoint.integrity import verify_or_raise
    from checkpoint.ours.source import consolidate
    from scripts.tools.reshard_checkpoint import reshard
    from scripts.tools.zero_to_fp32 import export_fp32

    run_distributed(save_then_resume_at_other_stage_counts, 4, str(tmp_path), corpus_cache,
                    [free_port() for _ in range(5)], timeout=600)

    uninterrupted = {r["iteration"]: r for r in _training_records(tmp_path / "pp2.jsonl")}
    assert sorted(uninterrupted) == list(range(1, 7))
    for name in ("pp4", "pp1", "pp2-resumed"):
        resumed = _training_records(tmp_path / f"{name}.jsonl")
        assert [r["iteration"] for r in resumed] == [4, 5, 6], name  # continued, not restarted
        for key in ("loss", "grad_norm"):
            if name == "pp2-resumed":  # the same grid, the same order of every sum: exact
                assert [r[key] for r in resumed] == [uninterrupted[i][key] for i in (4, 5, 6)], key
                continue
            assert [r[key] for r in resumed] == pytest.approx([uninterrupted[i][key] for i in (4, 5, 6)],
                                                              rel=1e-6, abs=0), (name, key)

    pp2 = tmp_path / "pp2" / f"iter_{SAVED_AT:07d}"
    pp1 = resolve_checkpoint(tmp_path / "pp1-resaved")
    metadata = read_metadata(pp2)
    # Shards keyed by (pipeline, tensor, data) rank; the tied word embedding stored by the first stage only.
    assert metadata["pipeline_parallel_size"] == 2
    first, last = (set(stage["parameters"]) for stage in metadata["pipeline_stages"])
    assert "word_embeddings.weight" in first and "word_embeddings.weight" not in last
    assert not first & last and first | last == set(metadata["parameters"])
    assert "optim_pp001_tp00_dp001.safetensors" in metadata["files"]
    assert "pipeline_stages" not in read_metadata(pp1) and read_metadata(pp1)["iteration"] == SAVED_AT

    # The state moved exactly: master weights and both Adam moments, every parameter, bitwise.
    keys = ("master", "exp_avg", "exp_avg_sq")
    staged, one_stage = consolidate(pp2, keys), consolidate(pp1, keys)
    for key in keys:
        assert staged[key].keys() == one_stage[key].keys()
        for name in staged[key]:
            assert torch.equal(staged[key][name], one_stage[key][name]), (key, name)

    # zero_to_fp32 and the HF export of the PP 2 checkpoint are the one-stage checkpoint's, bitwise.
    exported = [load_file(export_fp32(path, tmp_path / f"{label}.safetensors", log=lambda *a, **k: None))
                for label, path in (("pp2", pp2), ("pp1", pp1))]
    assert exported[0].keys() == exported[1].keys()
    assert all(torch.equal(exported[0][name], exported[1][name]) for name in exported[0])
    hf = [checkpoint_to_hf_state(path)[1] for path in (pp2, pp1)]
    assert hf[0].keys() == hf[1].keys() and all(torch.equal(hf[0][name], hf[1][name]) for name in hf[0])
    # Another TP size is the offline rewrite, from a PP checkpoint too: a one-stage TP 2 checkpoint of the same state.
    tp2 = reshard(pp2, tmp_path / "tp2", 2, log=lambda *a, **k: None)
    assert read_metadata(tp2)["tensor_parallel_size"] == 2 and "pipeline_stages" not in read_metadata(tp2)
    resharded = consolidate(tp2, keys)
    assert all(torch.equal(resharded[key][name], one_stage[key][name]) for key in keys for name in one_stage[key])

    # A save is complete only with every stage's files: one missing last-stage file fails the verification.
    (pp2 / "model_pp001_tp00.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model_pp001_tp00"):
        verify_or_raise(pp2, metadata)
    # The stage table is checked like the rest of metadata.json: a file name that leaves the checkpoint is corrupt.
    metadata["pipeline_stages"][1]["files"].append("../elsewhere.safetensors")
    (pp2 / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(CheckpointError, match="pipeline_stages"):
        read_metadata(pp2)
