"""--async-save through the Python API (checkpoint/ours/async_save.py), on one process unless named.

The files a background save writes are byte for byte those of a synchronous save of the same state (metadata.json
but its time stamp); what it writes is the state at the save, though training goes on while the writer writes;
nothing is committed (metadata.json, `latest`, Megatron's tracker file) until every rank's writer is done; a
failed write (disk full) is reported at the commit as the synchronous save reports it, and leaves the previous
checkpoint; an abandoned save (an error's exit) commits nothing and stops the writer; and (slow, 2 gloo ranks) a
write that fails on one rank fails the commit on both, naming that rank.

Megatron-LM, the reference (megatron/core/dist_checkpointing/strategies/async_utils.py, AsyncCallsQueue):
`maybe_finalize_async_calls` finalizes a call only when `is_current_async_call_done` says, by an all-reduce of
each rank's "still writing", that no rank is; its finalize functions then write the metadata and the tracker file.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from checkpoint import writer as file_writer
from checkpoint.format import LATEST_FILE, METADATA_FILE, STAGING_SUFFIX, TRACKER_FILE, CheckpointError
from checkpoint.ours import async_save
from checkpoint.ours.async_save import WRITER_THREAD_NAME, AsyncCheckpointSaver
from checkpoint.ours.sharded import load_checkpoint, save_checkpoint
from tests.checkpoint.test_checkpoint_safety import (
    VOCAB,
    build,
    cpu_state,
    disk_full_at_call,
    make_config,
    optimizer_snapshot,
    train_steps,
)
from tests.distributed import run_distributed


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(path.relative_to(directory)): path.read_bytes() for path in sorted(directory.rglob("*"))
            if path.is_file()}


def without_time_stamp(text: bytes) -> dict:
    metadata = json.loads(text)
    metadata.pop("saved_at")
    return metadata


class SlowWrites:
    """The background writer's file writes (checkpoint/writer.py's save_tensors on the writer thread), each held
    until `release` is set (or after `delay` seconds); other threads' writes (a synchronous save) go as usual."""

    def __init__(self, monkeypatch, delay: float = None) -> None:
        self.release, self.delay, self.written = threading.Event(), delay, []
        self.started = threading.Event()  # the writer thread is inside its first file's write
        self.original = file_writer.save_tensors
        monkeypatch.setattr(file_writer, "save_tensors", self)

    def __call__(self, path, tensors, metadata=None):
        if threading.current_thread().name != WRITER_THREAD_NAME:
            return self.original(path, tensors, metadata)
        self.started.set()
        if self.delay is not None:
            time.sleep(self.delay)
        else:
            assert self.release.wait(60), "the test never released the writer"
        self.written.append(Path(path).name)
        return self.original(path, tensors, metadata)


@pytest.fixture
def trained():
    config, state = make_config(stage=1), cpu_state()
    model, optimizer, rng = build(config, state, seed=1)
    train_steps(model, optimizer, 1, data_seed=0)
    return config, state, model, optimizer, rng


@pytest.mark.parametrize("stage", [pytest.param(0, marks=pytest.mark.smoke), 3])
def test_background_and_synchronous_saves_write_the_same_bytes(tmp_path, stage):
    config, state = make_config(stage=stage), cpu_state()
    model, optimizer, rng = build(config, state, seed=1)
    train_steps(model, optimizer, 1, data_seed=0)
    rng_state = torch.get_rng_state()
    synchronous = save_checkpoint(tmp_path / "sync", 3, 24, model, optimizer, rng, config, state)
    torch.set_rng_state(rng_state)  # nothing draws in between; said so the two saves see the same streams
    saver = AsyncCheckpointSaver(state)
    saver.save(tmp_path / "async", 3, 24, model, optimizer, rng, config)
    background = saver.wait()
    saver.close()
    assert background == tmp_path / "async" / "iter_0000003"
    sync_files, async_files = files_of(synchronous), files_of(background)
    assert sorted(sync_files) == sorted(async_files)
    for name in sync_files:
        if name == METADATA_FILE:
            assert without_time_stamp(async_files[name]) == without_time_stamp(sync_files[name])
        else:
            assert async_files[name] == sync_files[name], name
    assert (tmp_path / "async" / TRACKER_FILE).read_text() == "3\n"


def test_training_goes_on_while_the_writer_writes_and_the_files_hold_the_state_at_the_save(tmp_path, trained,
                                                                                            monkeypatch, capsys):
    config, state, model, optimizer, rng = trained
    save_dir = tmp_path / "ck"
    save_checkpoint(save_dir, 1, 8, model, optimizer, rng, config, state)
    at_save = optimizer_snapshot(optimizer)
    writes = SlowWrites(monkeypatch)
    saver = AsyncCheckpointSaver(state)
    saver.save(save_dir, 2, 16, model, optimizer, rng, config)  # returns with the writer held at its first file

    train_steps(model, optimizer, 2, data_seed=5)  # the live partition moves on meanwhile
    assert not torch.equal(optimizer.master, at_save["master"])
    assert saver.poll(3) is None  # still writing: nothing committed
    assert (save_dir / LATEST_FILE).read_text() == "iter_0000001\n"
    assert (save_dir / TRACKER_FILE).read_text() == "1\n"
    assert (save_dir / f"iter_0000002{STAGING_SUFFIX}").is_dir() and not (save_dir / "iter_0000002").exists()

    writes.release.set()
    deadline = time.monotonic() + 60
    while (committed := saver.poll(4)) is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    saver.close()
    assert committed == save_dir / "iter_0000002" and (save_dir / LATEST_FILE).read_text() == "iter_0000002\n"
    assert (save_dir / TRACKER_FILE).read_text() == "2\n"
    out = capsys.readouterr().out
    assert "staged checkpoint at iteration 2" in out and "committed before iteration 4" in out, out

    fresh_model, fresh_optimizer, fresh_rng = build(config, state, seed=2)
    assert load_checkpoint(save_dir, fresh_model, fresh_optimizer, fresh_rng, state).iteration == 2
    for key in ("master", "exp_avg", "exp_avg_sq"):
        assert torch.equal(getattr(fresh_optimizer, key), at_save[key]), key
    assert fresh_optimizer.adam_step == at_save["adam_step"]


def test_a_save_waits_for_the_previous_one_to_be_committed(tmp_path, trained, monkeypatch):
    config, state, model, optimizer, rng = trained
    writes = SlowWrites(monkeypatch, delay=0.2)
    saver = AsyncCheckpointSaver(state)
    saver.save(tmp_path / "ck", 1, 8, model, optimizer, rng, config)
    committed = saver.save(tmp_path / "ck", 2, 16, model, optimizer, rng, config)
    assert committed == tmp_path / "ck" / "iter_0000001"  # before iteration 2's began
    assert writes.written[:3] == ["model_tp00.safetensors", "optim_tp00_dp000.safetensors",
                                  "rng_tp00_dp000.safetensors"]
    assert saver.wait() == tmp_path / "ck" / "iter_0000002"
    saver.close()
    assert (tmp_path / "ck" / LATEST_FILE).read_text() == "iter_0000002\n"


def test_a_failed_background_write_fails_the_commit_and_leaves_the_previous_checkpoint(tmp_path, trained,
                                                                                       monkeypatch):
    config, state, model, optimizer, rng = trained
    save_dir = tmp_path / "ck"
    save_checkpoint(save_dir, 7, 56, model, optimizer, rng, config, state)
    before = files_of(save_dir)
    monkeypatch.setattr(file_writer, "save_tensors", disk_full_at_call(2, file_writer.save_tensors))
    saver = AsyncCheckpointSaver(state)
    saver.save(save_dir, 8, 64, model, optimizer, rng, config)  # training is not told until the commit
    with pytest.raises(CheckpointError, match="No space left on device") as failure:
        saver.wait()
    saver.close()
    assert "saving iteration 8 failed (rank 0: OSError" in str(failure.value)
    assert "the previous checkpoint and 'latest' are untouched" in str(failure.value)
    assert files_of(save_dir) == before  # no .partial left, iteration 7 and both pointers as they were


def test_an_abandoned_save_commits_nothing_and_the_writer_stops(tmp_path, trained, monkeypatch):
    config, state, model, optimizer, rng = trained
    save_dir = tmp_path / "ck"
    save_checkpoint(save_dir, 1, 8, model, optimizer, rng, config, state)
    writes = SlowWrites(monkeypatch)
    saver = AsyncCheckpointSaver(state)
    saver.save(save_dir, 2, 16, model, optimizer, rng, config)
    # the error comes while the first file is being written, and that file is finished (on a loaded machine the
    # writer thread had not begun it 0.2 s after the save and wrote nothing: a CI failure)
    assert writes.started.wait(60)
    threading.Timer(0.2, writes.release.set).start()
    saver.abandon()
    assert not saver.writer.alive
    assert WRITER_THREAD_NAME not in [thread.name for thread in threading.enumerate()]
    assert writes.written == ["model_tp00.safetensors"]  # and nothing after it
    assert (save_dir / LATEST_FILE).read_text() == "iter_0000001\n" and not (save_dir / "iter_0000002").exists()
    assert not (save_dir / f"iter_0000002{STAGING_SUFFIX}" / METADATA_FILE).exists()


@pytest.mark.parametrize("stage", [1, 3])
def test_the_planner_counts_what_a_rank_stages(tmp_path, stage, capsys):
    """The planner's dry run of the same settings (planner/dry_run.py, the meta model's counts) against the bytes a
    live save staged: one rank writes every file, so they differ only by the RNG states' allowance."""
    from planner.dry_run import Cluster, dry_run

    config, state = make_config(stage=stage), cpu_state()
    config = dataclasses.replace(config, checkpoint=dataclasses.replace(
        config.checkpoint, save=str(tmp_path / "ck"), async_save=True, use_persistent_ckpt_worker=True))
    planned = dry_run(config, Cluster(1, 1, None, "cpu"), vocab_size=VOCAB)
    model, optimizer, rng = build(config, state, seed=1)
    train_steps(model, optimizer, 1, data_seed=0)
    saver = AsyncCheckpointSaver(state)
    saver.save(tmp_path / "ck", 1, 8, model, optimizer, rng, config)
    staged = saver.pending.staged_bytes
    saver.wait()
    saver.close()
    assert staged <= planned.checkpoint_staging_bytes <= staged + async_save.RNG_STATE_BYTES
    assert planned.host_total_bytes >= planned.checkpoint_staging_bytes > 0
    assert f"{staged / 2**20:.1f} MiB copied to host memory" in capsys.readouterr().out


# ---- two ranks -----------------------------------------------------------------------------------

def _one_rank_fails_its_write(rank: int, world_size: int, save_dir: str) -> str:
    from parallel.state import initialize

    config = make_config(stage=2)
    state = initialize("cpu", 1)
    model, optimizer, rng = build(config, state, seed=1)
    train_steps(model, optimizer, 1, data_seed=0)
    saver = AsyncCheckpointSaver(state)
    saver.save(save_dir, 1, 8, model, optimizer, rng, config)
    assert saver.wait() == Path(save_dir) / "iter_0000001"  # both ranks' files in: committed
    if rank == 1:
        def disk_full(path, tensors, metadata=None):
            raise OSError(errno.ENOSPC, "No space left on device")
        file_writer.save_tensors = disk_full
    saver.save(save_dir, 2, 16, model, optimizer, rng, config)
    try:
        saver.wait()
    except CheckpointError as error:
        return str(error)
    finally:
        saver.close()
    return "no error"


@pytest.mark.slow
def test_a_write_that_fails_on_one_rank_fails_the_commit_on_every_rank(tmp_path):
    errors = run_distributed(_one_rank_fails_its_write, 2, str(tmp_path / "ck"), timeout=180)
    assert errors[0] == errors[1]
    assert errors[0].startswith("saving iteration 2 failed (rank 1: OSError: [Errno 28] No space left on device)")
    assert (tmp_path / "ck" / LATEST_FILE).read_text() == "iter_0000001\n"
    assert sorted(path.name for path in (tmp_path / "ck").iterdir()) == ["iter_0000001", LATEST_FILE, TRACKER_FILE]


def test_the_finite_check_before_a_save_counts_what_isfinite_counts(monkeypatch):
    """checkpoint/finite_check.py count_non_finite proves a chunk clean by its sum (or, for a cast, its smallest and largest
    values) before counting element by element: against the plain count, on chunks whose sum overflows with no bad
    element, with NaN and inf, and with values beyond fp16's and bf16's ranges."""
    from checkpoint import finite_check

    monkeypatch.setattr(finite_check, "NON_FINITE_CHECK_CHUNK", 64)
    generator = torch.Generator().manual_seed(0)
    cases = [torch.randn(1000, generator=generator), torch.full((300,), 3e38),  # the sum overflows, nothing is bad
             torch.randn(500, generator=generator) * 1e5, torch.zeros(0)]
    poisoned = torch.randn(1000, generator=generator)
    poisoned[[3, 64, 65, 999]] = torch.tensor([float("nan"), float("inf"), -float("inf"), float("nan")])
    cases += [poisoned, torch.tensor([65519.0, 65520.0, -70000.0, 1.0])]  # fp16: 65520 and beyond round to inf
    for tensor in cases:
        for dtype in (None, torch.float16, torch.bfloat16):
            plain = int((~torch.isfinite(tensor if dtype is None else tensor.to(dtype))).sum())
            assert finite_check.count_non_finite(tensor, as_dtype=dtype) == plain, (tensor[:4], dtype)


def test_a_safetensors_file_is_a_function_of_what_it_holds(tmp_path):
    """safetensors writes its header's metadata in a Rust HashMap's order, random at each call: checkpoint/format.py
    save_tensors sorts it, so two saves of the same tensors and metadata are the same bytes (and hashes)."""
    from safetensors import safe_open

    from checkpoint.format import save_tensors

    tensors = {"b": torch.arange(3.0), "a": torch.ones(2, dtype=torch.bfloat16)}
    metadata = {"numpy": ["MT19937", 3, 0, 0.5], "python": [3, [1, 2], None], "fragments": [["x", 0, 0, 3]]}
    written = set()
    for attempt in range(12):
        save_tensors(tmp_path / f"{attempt}.safetensors", tensors, metadata)
        written.add((tmp_path / f"{attempt}.safetensors").read_bytes())
    assert len(written) == 1
    with safe_open(str(tmp_path / "0.safetensors"), "pt") as reader:
        assert {key: json.loads(value) for key, value in reader.metadata().items() if key != "format"} == metadata
        assert torch.equal(reader.get_tensor("b"), tensors["b"])
