"""The offline checkpoint tools: zero_to_fp32 exports exactly the live master weights, and
reshard_checkpoint rewrites a checkpoint for another TP size that resumes where the original stopped.

Checkpoints come from `save_checkpoint` on tiny models trained a few steps on seeded token batches,
dropout off. The vocabulary (300) pads to 384 rows at TP=1 and to 512 at TP=2, so resharding between
them appends and drops padding rows. The multi-process runs are two launches: DP=2 (stage 3, bf16)
and TP=2 x DP=2, which saves a bf16 stage 2 checkpoint, saves and reloads an fp32 one, and loads the
TP=1 checkpoint resharded to TP=2.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from math import prod
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from arguments.config import PretrainConfig
from base.options import replace_settings
from checkpoint.file_names import optimizer_file
from checkpoint.format import (
    LATEST_FILE,
    OPTIMIZER_KEYS,
    TOKENIZER_DIR,
    read_metadata,
    resolve_checkpoint,
)
from checkpoint.ours.sharded import load_checkpoint, parameter_names, save_checkpoint
from checkpoint.ours.source import consolidate
from gpt.model import GPTModel
from parallel.random import TensorParallelRNG
from parallel.sharding import record_of
from parallel.state import ParallelState, destroy, initialize
from scripts.tools import reshard_checkpoint, zero_to_fp32
from scripts.tools.reshard_checkpoint import WORD_EMBEDDING, reshard
from scripts.tools.zero_to_fp32 import export_fp32
from tests.distributed import run_distributed
from tests.zero_harness import ZeroHarness

REPO_ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
VOCAB = 300
ROWS = {1: 384, 2: 512}  # the padded vocabulary at TP=1 and TP=2
BATCH = 4  # sequences per global batch
TRAIN_STEPS = 2
RESUME_STEP = 10  # the batch the step after loading takes


def quiet(*args, **kwargs) -> None:
    pass


# ---- training and saving (in the test process and in gloo ranks) -----------------------------

def tiny_config(tp: int = 1, stage: int = 1, bf16: bool = False) -> PretrainConfig:
    c = PretrainConfig()
    m = replace_settings(c.model, vocab_size=VOCAB, make_vocab_size_divisible_by=128, num_layers=2, hidden_size=64,
                         num_attention_heads=4, seq_length=32, max_position_embeddings=32, hidden_dropout=0.0,
                         attention_dropout=0.0)
    training = replace_settings(c.training, bf16=bf16, seed=7)
    parallel = dataclasses.replace(c.parallel, tensor_model_parallel_size=tp)
    # several buckets/units, so parameters straddle partitions
    zero = dataclasses.replace(c.zero, stage=stage, reduce_bucket_size=20000)
    return dataclasses.replace(c, model=m, training=training, parallel=parallel, zero=zero)


def tokens_for(step: int) -> torch.Tensor:
    """The global batch of step `step`: seq_length + 1 token ids per sequence."""
    return torch.randint(0, VOCAB, (BATCH, 33), generator=torch.Generator().manual_seed(1000 + step))


def build(config: PretrainConfig, state: ParallelState):
    rng = TensorParallelRNG(config.training.seed, state)
    model = GPTModel(config.model, state, rng=rng)
    return model, ZeroHarness.from_config(model, config, state, blocks=model.blocks), rng


def mean_loss(model, config, state, tokens: torch.Tensor) -> torch.Tensor:
    """This rank's share of the global batch (split over DP) through the model; the mean loss."""
    tokens = tokens.chunk(state.data_parallel_size)[state.data_parallel_rank]
    dtype = torch.bfloat16 if config.training.mixed_precision.bf16 else torch.float32
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        return model(tokens[:, :-1], tokens[:, 1:]).mean()


def average_over_data_parallel(tensor: torch.Tensor, state) -> torch.Tensor:
    """Mean of `tensor` over DP x CP, in place."""
    if state.data_context_parallel_size > 1:
        state.comm.all_reduce(tensor, state.data_context_parallel_group, "dp")
        tensor /= state.data_context_parallel_size
    return tensor


def train_step(model, optimizer, config, state, step: int) -> float:
    """One step; the global batch's loss (averaged over DP)."""
    optimizer.zero_grad()
    loss = mean_loss(model, config, state, tokens_for(step))
    optimizer.backward(loss)
    optimizer.step()
    return average_over_data_parallel(loss.detach().float().clone(), state).item()


def partition_record(model, optimizer, state) -> dict:
    """This rank's fp32 master partition, its fragments by parameter name, and every parameter's
    TP-local shape and split dimension: enough for the test to build the whole tensors itself."""
    names = parameter_names(model)
    slots = [slot for unit in optimizer.layout.units for slot in unit.slots]
    return {"tp": state.tensor_parallel_rank, "dp": state.data_parallel_rank,
            "master": optimizer.master.numpy().copy(),
            "fragments": [(names[id(f.slot.param)], f.param_offset, f.partition_offset, f.numel)
                          for f in optimizer.layout.fragments()],
            "params": {names[id(s.param)]: (list(s.shape), record_of(s.param).split_dim)
                       for s in slots}}


def train_and_save(state, config, save_dir, steps: int = TRAIN_STEPS, tokenizer=None) -> dict:
    model, optimizer, rng = build(config, state)
    for step in range(steps):
        train_step(model, optimizer, config, state, step)
    save_checkpoint(save_dir, steps, steps * BATCH, model, optimizer, rng, config, state, tokenizer=tokenizer)
    return partition_record(model, optimizer, state)


def load_and_step(state, config, path) -> dict:
    """Load a checkpoint into a fresh model/optimizer; the weights it restored (TP-local, fp32, stages
    0-2), then the loss of one step on a fixed batch and the loss on that batch after the step."""
    model, optimizer, rng = build(config, state)
    load_checkpoint(path, model, optimizer, rng, state)
    weights = {name: (p.detach().float().numpy().copy(), record_of(p).split_dim)
               for name, p in model.named_parameters()}
    step_loss = train_step(model, optimizer, config, state, RESUME_STEP)
    with torch.no_grad():
        after = mean_loss(model, config, state, tokens_for(RESUME_STEP)).detach().float().clone()
    return {"tp": state.tensor_parallel_rank, "dp": state.data_parallel_rank, "weights": weights,
            "losses": [step_loss, average_over_data_parallel(after, state).item()]}


def dp2_stage3_ranks(rank, world_size, save_dir):
    state = initialize("cpu", 1)
    try:
        return train_and_save(state, tiny_config(tp=1, stage=3, bf16=True), save_dir, steps=3)
    finally:
        destroy(state)


def tp2_dp2_ranks(rank, world_size, work, tp1_resharded_to_tp2):
    state = initialize("cpu", 2)
    try:
        bf16 = train_and_save(state, tiny_config(tp=2, stage=2, bf16=True), work / "bf16-tp2", steps=3)
        train_and_save(state, tiny_config(tp=2, stage=1), work / "fp32-tp2")
        original = load_and_step(state, tiny_config(tp=2, stage=1), work / "fp32-tp2")
        resharded = load_and_step(state, tiny_config(tp=2, stage=2), tp1_resharded_to_tp2)
        return {"bf16": bf16, "original": original, "resharded": resharded}
    finally:
        destroy(state)


# ---- expected values, built without the checkpoint code ---------------------------------------

def whole_from_partitions(records: list[dict]) -> dict[str, torch.Tensor]:
    """Every rank's master partition put back into whole tensors by its fragments."""
    flats: dict[tuple[int, str], torch.Tensor] = {}
    params = {}
    for record in records:
        params.update(record["params"])
        for name, param_offset, partition_offset, numel in record["fragments"]:
            shape, _ = record["params"][name]
            flat = flats.setdefault((record["tp"], name), torch.full((prod(shape),), float("nan")))
            flat[param_offset:param_offset + numel] = torch.from_numpy(
                record["master"][partition_offset:partition_offset + numel])
    return join_tensor_parallel({(tp, name): (flat.view(params[name][0]), params[name][1])
                                 for (tp, name), flat in flats.items()})


def join_tensor_parallel(pieces: dict[tuple[int, str], tuple[torch.Tensor, int | None]]) -> dict[str, torch.Tensor]:
    """{(tp rank, name): (local tensor, split dim)} -> {name: whole tensor}; replicated parameters must
    agree across TP ranks."""
    tp_size = 1 + max(tp for tp, _ in pieces)
    whole = {}
    for name in sorted({name for _, name in pieces}):
        locals_, dim = zip(*(pieces[(tp, name)] for tp in range(tp_size)))
        if dim[0] is None:
            assert all(torch.equal(locals_[0], other) for other in locals_), name
            whole[name] = locals_[0]
        else:
            whole[name] = torch.cat(locals_, dim[0])
        assert not whole[name].isnan().any(), f"{name}: elements no fragment covered"
    return whole


def weights_of(results: list[dict]) -> dict[str, torch.Tensor]:
    """Whole weights from the TP-local ones every rank of `load_and_step` returned (DP rank 0's)."""
    return join_tensor_parallel({(r["tp"], name): (torch.from_numpy(w), dim)
                                 for r in results if r["dp"] == 0 for name, (w, dim) in r["weights"].items()})


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    with safe_open(str(path), framework="pt") as f:
        return {key: f.get_tensor(key) for key in f.keys()}, f.metadata()


def assert_equal_modulo_padding(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> None:
    """Equal tensors, except that the word embeddings may have different numbers of zero padding rows."""
    assert ours.keys() == theirs.keys()
    for name in ours:
        a, b = ours[name], theirs[name]
        if name == WORD_EMBEDDING:
            rows = min(len(a), len(b))
            assert a[rows:].count_nonzero() == 0 and b[rows:].count_nonzero() == 0
            a, b = a[:rows], b[:rows]
        assert torch.equal(a, b), name


def assert_consolidated_equal(original: Path, resharded: Path) -> None:
    ours = consolidate(resolve_checkpoint(original), OPTIMIZER_KEYS)
    theirs = consolidate(resolve_checkpoint(resharded), OPTIMIZER_KEYS)
    for key in OPTIMIZER_KEYS:
        assert_equal_modulo_padding(ours[key], theirs[key])


def assert_losses_close(losses: list[float], reference: list[float]) -> None:
    assert losses == pytest.approx(reference, rel=1e-5, abs=0)


class StubTokenizer:
    """What save_checkpoint asks of a tokenizer: `save(directory)`."""

    def save(self, path: str) -> None:
        Path(path).mkdir(parents=True)
        (Path(path) / "tokenizer.json").write_text('{"stub": true}\n')


@pytest.fixture(scope="module")
def single_process_checkpoint(tmp_path_factory):
    """A bf16 TP=1 checkpoint with a tokenizer, and the partition record of the live optimizer. Shared
    by the tests of this module: a test that damages it works on a copy."""
    save_dir = tmp_path_factory.mktemp("single") / "ckpt"
    state = ParallelState(device=CPU)
    record = train_and_save(state, tiny_config(tp=1, stage=1, bf16=True), save_dir, steps=3,
                            tokenizer=StubTokenizer())
    return save_dir, record


# ---- zero_to_fp32 -----------------------------------------------------------------------------

def test_zero_to_fp32_exports_the_master_weights(single_process_checkpoint, tmp_path, capsys):
    save_dir, record = single_process_checkpoint
    out = tmp_path / "export"
    out.mkdir()
    assert zero_to_fp32.main([str(save_dir), str(out)]) == 0
    assert "read optim_tp00_dp000.safetensors (1/1)" in capsys.readouterr().out
    assert [p.name for p in out.iterdir()] == ["model_fp32.safetensors"]  # no temporary file left
    tensors, metadata = read_safetensors(out / "model_fp32.safetensors")
    expected = whole_from_partitions([record])
    assert tensors.keys() == expected.keys()
    for name, tensor in expected.items():
        assert tensors[name].dtype == torch.float32 and torch.equal(tensors[name], tensor), name
    assert tensors[WORD_EMBEDDING].shape == (ROWS[1], 64)
    assert json.loads(metadata["iteration"]) == 3 and json.loads(metadata["vocab_size"]) == VOCAB
    assert metadata["format"] == "pt"
    assert json.loads(metadata["model_config"])["num_layers"] == 2


def test_zero_to_fp32_failure_leaves_no_partial_file(single_process_checkpoint, tmp_path, monkeypatch, capsys):
    save_dir, _ = single_process_checkpoint
    out = tmp_path / "model.safetensors"
    assert zero_to_fp32.main([str(save_dir), str(out)]) == 0  # the previous export, which --overwrite may replace
    previous = out.read_bytes()

    def fail_midway(path, tensors, metadata=None):
        path.write_bytes(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(zero_to_fp32, "save_tensors", fail_midway)
    assert zero_to_fp32.main([str(save_dir), str(out), "--overwrite"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "No space left on device" in error
    assert out.read_bytes() == previous
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]


def test_zero_to_fp32_without_a_checkpoint_exits_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "iter_0000005.partial").mkdir()
    cases = {"empty": "no checkpoint here", "missing": "no checkpoint here",
             "iter_0000005.partial": "never finished"}
    for name, expected in cases.items():
        assert zero_to_fp32.main([str(tmp_path / name), str(tmp_path / "out.safetensors")]) == 2
        error = capsys.readouterr().err
        assert error.startswith("zero_to_fp32.py: error: ") and error.count("\n") == 1, error
        assert expected in error, error
    assert not (tmp_path / "out.safetensors").exists()


def test_zero_to_fp32_names_a_truncated_partition(single_process_checkpoint, tmp_path, capsys):
    save_dir = shutil.copytree(single_process_checkpoint[0], tmp_path / "ckpt")
    partition = resolve_checkpoint(save_dir) / optimizer_file(0, 0)
    partition.write_bytes(partition.read_bytes()[:-100])
    assert zero_to_fp32.main([str(save_dir), str(tmp_path / "out.safetensors")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and optimizer_file(0, 0) in error and "truncated" in error
    assert not (tmp_path / "out.safetensors").exists()


@pytest.fixture(scope="module")
def dp2_stage3(tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("dp2-stage3") / "ckpt"
    return save_dir, run_distributed(dp2_stage3_ranks, 2, save_dir, timeout=300)


@pytest.mark.slow
def test_zero_to_fp32_equals_the_master_of_dp2_stage3(dp2_stage3, tmp_path):
    save_dir, records = dp2_stage3
    exported, _ = read_safetensors(export_fp32(save_dir, tmp_path / "out.safetensors", log=quiet))
    expected = whole_from_partitions(records)
    assert exported.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(exported[name], tensor), name
    # The master is not what bf16 can hold: the export did not come from the bf16 model files.
    assert any(not torch.equal(t, t.bfloat16().float()) for t in exported.values())

    # The same TP size is a re-layout from DP=2 stage 3 to one partition, with the same state.
    reshard(save_dir, tmp_path / "relayout", 1, log=quiet)
    assert read_metadata(resolve_checkpoint(tmp_path / "relayout"))["data_parallel_size"] == 1
    assert_consolidated_equal(save_dir, tmp_path / "relayout")


# ---- reshard_checkpoint: single process -------------------------------------------------------

def test_reshard_tp1_to_tp2_and_back(single_process_checkpoint, tmp_path):
    save_dir, _ = single_process_checkpoint
    source = resolve_checkpoint(save_dir)
    assert reshard_checkpoint.main([str(save_dir), str(tmp_path / "tp2"), "--tensor-model-parallel-size", "2"]) == 0
    final = tmp_path / "tp2" / source.name
    assert (tmp_path / "tp2" / LATEST_FILE).read_text().strip() == source.name
    assert not list((tmp_path / "tp2").glob("*.partial"))

    before, after = read_metadata(source), read_metadata(final)
    for key in ("iteration", "consumed_samples", "adam_step", "loss_scaler", "lr", "precision"):
        assert after[key] == before[key], key
    assert after["tensor_parallel_size"] == 2 and after["data_parallel_size"] == 1
    assert after["config"]["training"]["tensor_model_parallel_size"] == 2
    assert after["rng_files"] == []
    assert after["parameters"][WORD_EMBEDDING]["shape"] == [ROWS[2], 64]
    assert {n: e for n, e in after["parameters"].items() if n != WORD_EMBEDDING} == \
           {n: e for n, e in before["parameters"].items() if n != WORD_EMBEDDING}
    assert after["files"] == {p.name: p.stat().st_size for p in final.glob("*.safetensors")}
    assert len(after["files"]) == 4  # model and optimizer file of each of the two TP ranks
    assert (final / TOKENIZER_DIR / "tokenizer.json").read_text() == '{"stub": true}\n'
    assert_consolidated_equal(save_dir, final)

    # The model files hold each TP rank's slice of the master weights in the training dtype.
    master = consolidate(final, ("master",))["master"]
    for tp in range(2):
        weights, _ = read_safetensors(final / f"model_tp{tp:02d}.safetensors")
        for name, weight in weights.items():
            dim = after["parameters"][name]["tensor_parallel_dim"]
            piece = master[name] if dim is None else master[name].chunk(2, dim)[tp]
            assert weight.dtype == torch.bfloat16 and torch.equal(weight, piece.bfloat16()), name

    # Back to TP=1: the original tensors, padding rows included.
    reshard(tmp_path / "tp2", tmp_path / "tp1", 1, log=quiet)
    back = consolidate(resolve_checkpoint(tmp_path / "tp1"), OPTIMIZER_KEYS)
    original = consolidate(source, OPTIMIZER_KEYS)
    for key in OPTIMIZER_KEYS:
        assert all(torch.equal(back[key][name], original[key][name]) for name in original[key]), key


def test_reshard_to_the_same_size_resumes_exactly(tmp_path):
    state = ParallelState(device=CPU)
    config = tiny_config(tp=1, stage=0)
    train_and_save(state, config, tmp_path / "ckpt")
    reshard(tmp_path / "ckpt", tmp_path / "relayout", 1, log=quiet)
    original = load_and_step(state, config, tmp_path / "ckpt")
    relayout = load_and_step(state, tiny_config(tp=1, stage=2), tmp_path / "relayout")
    assert original["losses"] == relayout["losses"]
    assert all(torch.equal(torch.from_numpy(original["weights"][name][0]), torch.from_numpy(w))
               for name, (w, _) in relayout["weights"].items())


def test_reshard_errors_are_one_line(single_process_checkpoint, tmp_path, capsys):
    save_dir, _ = single_process_checkpoint
    (tmp_path / "a_file").write_text("")
    cases = {
        "no checkpoint here": [str(tmp_path / "empty"), str(tmp_path / "out"), "--tensor-model-parallel-size", "2"],
        "attention heads": [str(save_dir), str(tmp_path / "out"), "--tensor-model-parallel-size", "3"],
        "is a file": [str(save_dir), str(tmp_path / "a_file"), "--tensor-model-parallel-size", "2"],
        "being read": [str(save_dir), str(save_dir), "--tensor-model-parallel-size", "2"],
    }
    (tmp_path / "empty").mkdir()
    for expected, argv in cases.items():
        assert reshard_checkpoint.main(argv) == 2, expected
        error = capsys.readouterr().err
        assert error.startswith("reshard_checkpoint.py: error: ") and error.count("\n") == 1, error
        assert expected in error
    assert not (tmp_path / "out").exists()
    assert read_metadata(resolve_checkpoint(save_dir))["tensor_parallel_size"] == 1


def test_reshard_failure_leaves_no_staging_and_no_latest(single_process_checkpoint, tmp_path, monkeypatch):
    save_dir, _ = single_process_checkpoint
    writes = []

    def fail_on_second(path, tensors, metadata=None):
        writes.append(path)
        if len(writes) == 2:
            raise OSError(28, "No space left on device")
        path.write_bytes(b"x")
        return 1

    monkeypatch.setattr(reshard_checkpoint, "save_tensors", fail_on_second)
    assert reshard_checkpoint.main([str(save_dir), str(tmp_path / "out"), "--tensor-model-parallel-size", "2"]) == 2
    assert list((tmp_path / "out").iterdir()) == []


# ---- reshard_checkpoint: loading at the new TP size -------------------------------------------

@pytest.fixture(scope="module")
def tp_runs(tmp_path_factory):
    """The TP=1 original (saved, resharded to TP=2, and reloaded here) and the TP=2 x DP=2 launch."""
    work = tmp_path_factory.mktemp("tp-runs")
    state = ParallelState(device=CPU)
    train_and_save(state, tiny_config(tp=1), work / "fp32-tp1")
    reshard(work / "fp32-tp1", work / "fp32-tp1-to-tp2", 2, log=quiet)
    tp1_original = load_and_step(state, tiny_config(tp=1), work / "fp32-tp1")
    ranks = run_distributed(tp2_dp2_ranks, 4, work, work / "fp32-tp1-to-tp2", timeout=600)
    return work, tp1_original, ranks


@pytest.mark.slow
def test_zero_to_fp32_equals_the_master_of_tp2_dp2_stage2(tp_runs, tmp_path):
    work, _, ranks = tp_runs
    exported, metadata = read_safetensors(export_fp32(work / "bf16-tp2", tmp_path / "out.safetensors", log=quiet))
    expected = whole_from_partitions([r["bf16"] for r in ranks])
    assert exported.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(exported[name], tensor), name
    assert exported[WORD_EMBEDDING].shape == (ROWS[2], 64)  # the padding it was saved with
    assert any(not torch.equal(t, t.bfloat16().float()) for t in exported.values())
    assert json.loads(metadata["iteration"]) == 3


@pytest.mark.slow
def test_reshard_tp1_to_tp2_loads_and_trains_on(tp_runs):
    work, tp1_original, ranks = tp_runs
    assert_consolidated_equal(work / "fp32-tp1", work / "fp32-tp1-to-tp2")
    master = consolidate(resolve_checkpoint(work / "fp32-tp1"), ("master",))["master"]
    assert_equal_modulo_padding(weights_of([r["resharded"] for r in ranks]), master)
    for r in ranks:
        assert_losses_close(r["resharded"]["losses"], tp1_original["losses"])


@pytest.mark.slow
def test_reshard_tp2_to_tp1_loads_and_trains_on(tp_runs, tmp_path):
    work, _, ranks = tp_runs
    reshard(work / "fp32-tp2", tmp_path / "tp1", 1, log=quiet)
    assert_consolidated_equal(work / "fp32-tp2", tmp_path / "tp1")
    state = ParallelState(device=CPU)
    resharded = load_and_step(state, tiny_config(tp=1), tmp_path / "tp1")
    master = consolidate(resolve_checkpoint(work / "fp32-tp2"), ("master",))["master"]
    assert_equal_modulo_padding(weights_of([resharded]), master)
    assert resharded["weights"][WORD_EMBEDDING][0].shape == (ROWS[1], 64)
    # The original reloaded at TP=2 x DP=2 took the same step from the same state.
    original_losses = ranks[0]["original"]["losses"]
    assert all(r["original"]["losses"] == original_losses for r in ranks)
    assert_losses_close(resharded["losses"], original_losses)


# ---- the command lines ------------------------------------------------------------------------

def run_script(name: str, *argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "tools" / name), *map(str, argv)],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def test_command_lines(single_process_checkpoint, tmp_path):
    save_dir, record = single_process_checkpoint
    done = run_script("zero_to_fp32.py", save_dir, tmp_path / "out.safetensors")
    assert done.returncode == 0, done.stderr
    assert "wrote" in done.stdout
    exported, _ = read_safetensors(tmp_path / "out.safetensors")
    assert all(torch.equal(exported[n], t) for n, t in whole_from_partitions([record]).items())

    done = run_script("reshard_checkpoint.py", resolve_checkpoint(save_dir), tmp_path / "tp2",
                      "--tensor-model-parallel-size", "2")
    assert done.returncode == 0, done.stderr
    assert read_metadata(resolve_checkpoint(tmp_path / "tp2"))["tensor_parallel_size"] == 2

    done = run_script("reshard_checkpoint.py", tmp_path / "nothing", tmp_path / "tp4",
                      "--tensor-model-parallel-size", "4")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no checkpoint here" in done.stderr, done.stderr
