"""Checkpoints that resume exactly and fail safely (issue 6), through the Python API.

Round trip of every piece of state (weights, fp32 master, Adam moments and step, the four RNG streams);
`load_optimizer=False` and `finetune`; a save killed midway (a child process that `os._exit`s while
writing) and a save that fails (disk full) both leave the previous checkpoint and `latest` untouched;
loading never unpickles anything, and every damaged file is reported by name; a checkpoint of another
model shape lists its mismatched keys; `--keep-last` pruning; and (slow, gloo) a checkpoint saved at
DP=4 stage 2 resumes bit-exactly at DP=2 stage 3, DP=2 stage 1 and single-process stage 0.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import random
import re
import shlex
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from arguments.config import PretrainConfig
from checkpoint import writer as file_writer
from checkpoint.file_names import model_file, optimizer_file, rng_file
from checkpoint.format import (
    LATEST_FILE,
    METADATA_FILE,
    OPTIMIZER_KEYS,
    STAGING_SUFFIX,
    TRACKER_FILE,
    CheckpointError,
    iteration_dir_name,
    prune,
    resolve_checkpoint,
)
from checkpoint.lineage import RunIdentity
from checkpoint.ours import sharded as checkpointing
from checkpoint.ours.sharded import load_checkpoint, prune_checkpoints, save_checkpoint
from checkpoint.ours.source import consolidate
from gpt.model import GPTModel
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState, destroy, initialize
from tests.distributed import run_distributed
from tests.zero_harness import ZeroHarness

REPO = Path(__file__).resolve().parents[2]
VOCAB = 500
OPTIM = optimizer_file(0, 0)
RNG = rng_file(0, 0)


# ---- helpers ----------------------------------------------------------------------------------

def make_config(stage: int = 0, num_layers: int = 2, hidden_size: int = 64, reduce_bucket_size=None):
    config = PretrainConfig()
    model = dataclasses.replace(config.model, vocab_size=VOCAB, num_layers=num_layers, hidden_size=hidden_size,
                                num_attention_heads=4, seq_length=32, max_position_embeddings=32)
    bucket = {} if reduce_bucket_size is None else {"reduce_bucket_size": reduce_bucket_size}
    return dataclasses.replace(config, model=model, zero=dataclasses.replace(config.zero, stage=stage, **bucket))


def cpu_state() -> ParallelState:
    return ParallelState(device=torch.device("cpu"))


def build(config, state, seed: int, with_rng: bool = True):
    """(model, optimizer, rng) as pretrain_gpt builds them; `seed` picks the initial weights."""
    rng = TensorParallelRNG(seed, state) if with_rng else None
    model = GPTModel(config.model, state, rng=rng)
    seeded = dataclasses.replace(config, training=dataclasses.replace(config.training, seed=seed))
    return model, ZeroHarness.from_config(model, seeded, state, blocks=model.blocks), rng


def train_steps(model, optimizer, steps: int, data_seed: int) -> None:
    generator = torch.Generator().manual_seed(data_seed)
    for _ in range(steps):
        tokens = torch.randint(0, VOCAB, (2, 33), generator=generator)
        optimizer.zero_grad()
        loss = model(tokens[:, :-1], tokens[:, 1:]).mean()
        optimizer.backward(loss)
        optimizer.step()


def names_by_id(model) -> dict[int, str]:
    return {id(param): name for name, param in model.named_parameters()}


def full_weights(model, optimizer) -> dict[str, torch.Tensor]:
    """Every parameter's whole value (stage 3 gathers each chunk)."""
    names = names_by_id(model)
    weights = {}
    for unit in optimizer.layout.units:
        with optimizer.gathered_parameters(unit):
            for slot in unit.slots:
                weights[names[id(slot.param)]] = slot.param.detach().clone()
    return weights


def optimizer_snapshot(optimizer) -> dict:
    snapshot = {key: getattr(optimizer, key).detach().clone() for key in OPTIMIZER_KEYS}
    snapshot["adam_step"] = optimizer.adam_step
    return snapshot


def draw_from_every_stream(rng: TensorParallelRNG) -> dict:
    """A few numbers from each stream a checkpoint restores (Gaussian first: both Python and NumPy
    cache the second value of a pair, and that cache is part of their state)."""
    draws = {"python_gauss": random.gauss(0.0, 1.0), "numpy_gauss": float(np.random.standard_normal()),
             "python": [random.random() for _ in range(4)], "numpy": np.random.rand(4).tolist(),
             "torch": torch.rand(4)}
    with rng.fork():
        draws["tensor_parallel"] = torch.rand(4)
    return draws


def assert_same_draws(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        if torch.is_tensor(expected[key]):
            assert torch.equal(actual[key], expected[key]), key
        else:
            assert actual[key] == expected[key], key


def assert_tensors_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        assert torch.equal(actual[key], expected[key]), key


def file_hashes(directory: Path) -> dict[str, str]:
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def set_manifest_size(iteration_dir: Path, name: str) -> None:
    """Make metadata.json's manifest agree with the file's current size, so only the format check
    can stop it."""
    metadata = json.loads((iteration_dir / METADATA_FILE).read_text())
    metadata["files"][name] = (iteration_dir / name).stat().st_size
    (iteration_dir / METADATA_FILE).write_text(json.dumps(metadata))


@pytest.fixture
def saved(tmp_path):
    """A stage-0 model trained 1 step and saved at iteration 7 (56 samples) under tmp_path/ckpt."""
    config, state = make_config(), cpu_state()
    model, optimizer, rng = build(config, state, seed=1)
    train_steps(model, optimizer, 1, data_seed=0)
    path = save_checkpoint(tmp_path / "ckpt", 7, 56, model, optimizer, rng, config, state)
    return dict(config=config, state=state, model=model, optimizer=optimizer, rng=rng, path=path,
                save_dir=tmp_path / "ckpt", snapshot=optimizer_snapshot(optimizer),
                weights=full_weights(model, optimizer))


def fresh(saved, seed=2):
    return build(saved["config"], saved["state"], seed=seed)


# ---- 1. round trip ----------------------------------------------------------------------------

@pytest.mark.parametrize("stage", [0, 2, 3])
def test_round_trip_restores_weights_optimizer_and_every_rng_stream(tmp_path, stage):
    config, state = make_config(stage), cpu_state()
    model, optimizer, rng = build(config, state, seed=1)
    train_steps(model, optimizer, 2, data_seed=0)
    # Move every stream off its seed, and leave a cached Gaussian in Python's and NumPy's.
    random.seed(11), np.random.seed(11)
    random.gauss(0.0, 1.0), np.random.standard_normal()
    with rng.fork():
        torch.rand(3)
    expected = optimizer_snapshot(optimizer)
    weights = full_weights(model, optimizer)
    assert expected["adam_step"] == 2 and expected["exp_avg"].abs().sum() > 0

    path = save_checkpoint(tmp_path / "ckpt", 7, 56, model, optimizer, rng, config, state)
    assert path == tmp_path / "ckpt" / "iter_0000007"
    assert (tmp_path / "ckpt" / LATEST_FILE).read_text() == "iter_0000007\n"
    expected_draws = draw_from_every_stream(rng)

    model2, optimizer2, rng2 = build(config, state, seed=2)
    random.seed(99), np.random.seed(99)
    assert not torch.equal(optimizer2.master, expected["master"])
    resume = load_checkpoint(tmp_path / "ckpt", model2, optimizer2, rng2, state)

    assert (resume.iteration, resume.consumed_samples, resume.path) == (7, 56, path)
    assert_tensors_equal({key: getattr(optimizer2, key) for key in OPTIMIZER_KEYS},
                         {key: expected[key] for key in OPTIMIZER_KEYS})
    assert optimizer2.adam_step == 2
    assert_tensors_equal(full_weights(model2, optimizer2), weights)
    assert_same_draws(draw_from_every_stream(rng2), expected_draws)


def test_load_without_optimizer_takes_weights_only(saved):
    model, optimizer, rng = fresh(saved)
    assert saved["snapshot"]["exp_avg"].any() and saved["snapshot"]["adam_step"] == 1
    resume = load_checkpoint(saved["save_dir"], model, optimizer, rng, saved["state"], load_optimizer=False)
    assert (resume.iteration, resume.consumed_samples) == (7, 56)
    assert torch.equal(optimizer.master, saved["snapshot"]["master"])
    assert_tensors_equal(full_weights(model, optimizer), saved["weights"])
    assert not optimizer.exp_avg.any() and not optimizer.exp_avg_sq.any()
    assert optimizer.adam_step == 0


def test_finetune_starts_at_iteration_zero_with_fresh_optimizer_and_rng(saved):
    model, optimizer, rng = fresh(saved)
    before = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate(), rng.get_states())
    resume = load_checkpoint(saved["save_dir"], model, optimizer, rng, saved["state"], finetune=True)
    assert (resume.iteration, resume.consumed_samples) == (0, 0)
    assert torch.equal(optimizer.master, saved["snapshot"]["master"])
    assert_tensors_equal(full_weights(model, optimizer), saved["weights"])
    assert not optimizer.exp_avg.any() and not optimizer.exp_avg_sq.any() and optimizer.adam_step == 0
    assert torch.equal(torch.get_rng_state(), before[0])
    assert np.array_equal(np.random.get_state()[1], before[1])
    assert random.getstate() == before[2]
    assert torch.equal(rng.get_states()["tensor_parallel_cpu"], before[3]["tensor_parallel_cpu"])


def test_checkpoint_saved_without_a_tensor_parallel_rng_loads_into_a_run_with_one(tmp_path):
    """save_checkpoint(rng=None) is supported (it stores the default torch stream only); a run with a
    TensorParallelRNG must still be able to load it."""
    config, state = make_config(), cpu_state()
    model, optimizer, _ = build(config, state, seed=1, with_rng=False)
    train_steps(model, optimizer, 1, data_seed=0)
    save_checkpoint(tmp_path / "ckpt", 3, 6, model, optimizer, None, config, state)
    expected_torch = torch.rand(4)

    model2, optimizer2, rng2 = build(config, state, seed=2)
    resume = load_checkpoint(tmp_path / "ckpt", model2, optimizer2, rng2, state)
    assert resume.iteration == 3
    assert torch.equal(optimizer2.master, optimizer.master)
    assert torch.equal(torch.rand(4), expected_torch)


# ---- 2. a save killed midway ------------------------------------------------------------------

CRASHING_SAVE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    import checkpoint.ours.sharded as checkpointing
    import checkpoint.writer as writer
    from tests.checkpoint.test_checkpoint_safety import build, cpu_state, make_config

    original, calls = writer.save_tensors, []

    def save_then_die(path, tensors, metadata=None):
        calls.append(path)
        if len(calls) == 1:  # the model file is written in full ...
            return original(path, tensors, metadata)
        with open(path, "wb") as f:  # ... the optimizer file only in part, then the process dies
            f.write(b"\\x00" * 1000)
            f.flush()
            os.fsync(f.fileno())
        os._exit(1)

    writer.save_tensors = save_then_die  # the writer of every checkpoint file (checkpoint/writer.py)
    config, state = make_config(), cpu_state()
    model, optimizer, rng = build(config, state, seed=1)
    checkpointing.save_checkpoint({save_dir!r}, 10, 80, model, optimizer, rng, config, state)
    sys.exit(0)  # not reached
""")


def test_save_killed_midway_leaves_the_previous_checkpoint(saved, tmp_path):
    config, state, save_dir = saved["config"], saved["state"], tmp_path / "crash"
    # The fixture's state as iteration 5: the checkpoint the crash must not disturb.
    save_checkpoint(save_dir, 5, 40, saved["model"], saved["optimizer"], saved["rng"], config, state)
    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000005", LATEST_FILE, TRACKER_FILE]
    hashes = file_hashes(save_dir / "iter_0000005")

    child = subprocess.run([sys.executable, "-c", CRASHING_SAVE.format(repo=str(REPO), save_dir=str(save_dir))],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert child.returncode == 1, child.stderr

    partial = save_dir / ("iter_0000010" + STAGING_SUFFIX)
    assert partial.is_dir()
    assert (partial / model_file(0)).is_file() and (partial / OPTIM).stat().st_size == 1000
    assert not (save_dir / "iter_0000010").exists()
    assert (save_dir / LATEST_FILE).read_text() == "iter_0000005\n"
    assert file_hashes(save_dir / "iter_0000005") == hashes

    assert resolve_checkpoint(save_dir) == save_dir / "iter_0000005"
    model, optimizer, rng = fresh(saved)
    resume = load_checkpoint(save_dir, model, optimizer, rng, state)
    assert (resume.iteration, resume.consumed_samples) == (5, 40)
    assert_tensors_equal({key: getattr(optimizer, key) for key in OPTIMIZER_KEYS},
                         {key: saved["snapshot"][key] for key in OPTIMIZER_KEYS})
    with pytest.raises(CheckpointError, match="never finished"):
        resolve_checkpoint(partial)
    with pytest.raises(CheckpointError, match=re.escape(partial.name)):
        load_checkpoint(partial, model, optimizer, rng, state)

    # The next save that succeeds clears the stale staging directory.
    save_checkpoint(save_dir, 10, 80, model, optimizer, rng, config, state)
    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000005", "iter_0000010", LATEST_FILE, TRACKER_FILE]
    assert resolve_checkpoint(save_dir) == save_dir / "iter_0000010"


# ---- 3. a save that fails ---------------------------------------------------------------------

def disk_full_at_call(number: int, write):
    """`write` (a save_tensors) that fails at its `number`-th call as a full disk does: part of the file is
    written, then ENOSPC."""
    calls = []

    def disk_full(path, tensors, metadata=None):
        calls.append(path)
        if len(calls) == number:
            Path(path).write_bytes(b"\x00" * 100)  # what fit before the disk filled up
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(path, tensors, metadata)
    return disk_full


@pytest.mark.parametrize("where", ["second_file", "metadata"])
def test_failed_save_raises_and_leaves_the_previous_checkpoint(saved, monkeypatch, where):
    config, state, save_dir = saved["config"], saved["state"], saved["save_dir"]
    latest_bytes = (save_dir / LATEST_FILE).read_bytes()
    hashes = file_hashes(saved["path"])

    if where == "second_file":
        # checkpoint/writer.py writes every file
        monkeypatch.setattr(file_writer, "save_tensors", disk_full_at_call(2, file_writer.save_tensors))
    else:
        def disk_full(path, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(checkpointing, "write_text_atomic", disk_full)

    with pytest.raises(CheckpointError, match="No space left on device") as failure:
        save_checkpoint(save_dir, 8, 64, saved["model"], saved["optimizer"], saved["rng"], config, state)
    assert "iteration 8" in str(failure.value)
    monkeypatch.undo()

    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000007", LATEST_FILE, TRACKER_FILE]  # no .partial
    assert (save_dir / LATEST_FILE).read_bytes() == latest_bytes
    assert file_hashes(saved["path"]) == hashes
    model, optimizer, rng = fresh(saved)
    assert load_checkpoint(save_dir, model, optimizer, rng, state).iteration == 7
    assert torch.equal(optimizer.master, saved["snapshot"]["master"])


# ---- 4. loading never runs code -----------------------------------------------------------------

class Payload:
    """Unpickling this runs a shell command that creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def test_the_payload_is_live(tmp_path):
    """The control: torch.load of the same kind of file (unsafe mode) does run it."""
    marker = tmp_path / "control-marker"
    torch.save({"master": Payload(marker)}, tmp_path / "payload.pt")
    torch.load(tmp_path / "payload.pt", weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("target", [OPTIM, RNG])
def test_pickle_in_place_of_a_checkpoint_file_is_refused_unexecuted(saved, tmp_path, target):
    marker = tmp_path / "pwned"
    path = saved["path"] / target
    torch.save({"master": Payload(marker), "exp_avg": Payload(marker), "exp_avg_sq": Payload(marker)}, path)
    set_manifest_size(saved["path"], target)

    model, optimizer, rng = fresh(saved)
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ".*not a valid safetensors"):
        load_checkpoint(saved["save_dir"], model, optimizer, rng, saved["state"])
    if target == OPTIM:
        with pytest.raises(CheckpointError, match=re.escape(str(path))):
            consolidate(saved["path"], OPTIMIZER_KEYS)
    assert not marker.exists()


# ---- 5. damaged files ---------------------------------------------------------------------------

def _truncate(iteration_dir: Path) -> None:
    path = iteration_dir / OPTIM
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _truncate_and_fix_manifest(iteration_dir: Path) -> None:
    _truncate(iteration_dir)
    set_manifest_size(iteration_dir, OPTIM)


def _corrupt_header(iteration_dir: Path) -> None:
    with open(iteration_dir / OPTIM, "r+b") as f:
        f.write(bytes(range(0xF0, 0x100)))


def _delete(iteration_dir: Path) -> None:
    (iteration_dir / OPTIM).unlink()


@pytest.mark.parametrize("damage, message", [
    (_truncate, "truncated or corrupt"),
    (_truncate_and_fix_manifest, "not a valid safetensors file"),
    (_corrupt_header, "not a valid safetensors file"),
    (_delete, "missing from the checkpoint"),
])
def test_damaged_optimizer_file_is_reported_by_name(saved, damage, message):
    damage(saved["path"])
    model, optimizer, rng = fresh(saved)
    master = optimizer.master.clone()
    with pytest.raises(CheckpointError, match=re.escape(str(saved["path"] / OPTIM)) + ".*" + message):
        load_checkpoint(saved["save_dir"], model, optimizer, rng, saved["state"])
    assert torch.equal(optimizer.master, master)  # nothing half-loaded


def test_corrupt_metadata_is_reported_by_name(saved):
    metadata = saved["path"] / METADATA_FILE
    metadata.write_text(metadata.read_text()[:200])
    model, optimizer, rng = fresh(saved)
    with pytest.raises(CheckpointError, match=re.escape(str(metadata)) + ".*corrupt"):
        load_checkpoint(saved["save_dir"], model, optimizer, rng, saved["state"])


def test_wrong_format_version_is_reported(saved):
    metadata_path = saved["path"] / METADATA_FILE
    metadata = json.loads(metadata_path.read_text())
    metadata["format_version"] = 2
    metadata_path.write_text(json.dumps(metadata))
    model, optimizer, rng = fresh(saved)
    with pytest.raises(CheckpointError, match="format version 2; this code reads version 1"):
        load_checkpoint(saved["save_dir"], model, optimizer, rng, saved["state"])


@pytest.mark.parametrize("key", ["parameters", "optimizer_shards", "tensor_parallel_size"])
def test_metadata_missing_a_field_is_reported_by_name(saved, key):
    """Valid JSON of the right version that lacks a field the loader needs (a hand-edited or
    half-written-by-another-tool file) is a CheckpointError naming metadata.json, not a KeyError."""
    metadata_path = saved["path"] / METADATA_FILE
    metadata = json.loads(metadata_path.read_text())
    del metadata[key]
    metadata_path.write_text(json.dumps(metadata))
    model, optimizer, rng = fresh(saved)
    with pytest.raises(CheckpointError, match=re.escape(str(metadata_path))):
        load_checkpoint(saved["save_dir"], model, optimizer, rng, saved["state"])


@pytest.mark.parametrize("problem", ["no_fragment_table", "fragments_past_the_end"])
def test_optimizer_file_with_a_bad_fragment_table_is_reported_by_name(saved, problem):
    """A well-formed safetensors file of the recorded size whose fragment table is missing or points
    past its tensors must be a CheckpointError naming the file (today: KeyError / RuntimeError)."""
    from checkpoint.format import save_tensors

    path, optimizer = saved["path"] / OPTIM, saved["optimizer"]
    if problem == "no_fragment_table":
        save_tensors(path, {key: getattr(optimizer, key) for key in OPTIMIZER_KEYS})
    else:
        names = names_by_id(saved["model"])
        fragments = [[names[id(f.slot.param)], f.param_offset, f.partition_offset, f.numel]
                     for f in optimizer.layout.fragments()]
        half = optimizer.master.numel() // 2
        save_tensors(path, {key: getattr(optimizer, key)[:half] for key in OPTIMIZER_KEYS},
                     {"fragments": fragments})
    set_manifest_size(saved["path"], OPTIM)
    model, optimizer2, rng = fresh(saved)
    with pytest.raises(CheckpointError, match=re.escape(str(path))):
        load_checkpoint(saved["save_dir"], model, optimizer2, rng, saved["state"])


# ---- 6. another model's checkpoint ------------------------------------------------------------

def test_checkpoint_of_another_model_shape_lists_the_mismatched_keys(tmp_path):
    state = cpu_state()
    three = make_config(num_layers=3)
    model, optimizer, rng = build(three, state, seed=1)
    save_checkpoint(tmp_path / "three", 1, 2, model, optimizer, rng, three, state)
    two = make_config(num_layers=2)
    model, optimizer, rng = build(two, state, seed=1)
    save_checkpoint(tmp_path / "two", 1, 2, model, optimizer, rng, two, state)

    model, optimizer, rng = build(two, state, seed=2)
    master = optimizer.master.clone()
    with pytest.raises(CheckpointError) as failure:
        load_checkpoint(tmp_path / "three", model, optimizer, rng, state)
    message = str(failure.value)
    assert "mismatched keys" in message
    for suffix in ("attention.query_key_value.weight", "mlp.dense_4h_to_h.bias", "input_layernorm.weight"):
        assert f"blocks.2.{suffix}: in the checkpoint but not in this model" in message
    assert "blocks.1." not in message
    assert torch.equal(optimizer.master, master)

    model, optimizer, rng = build(three, state, seed=2)
    with pytest.raises(CheckpointError, match=r"blocks\.2\.mlp\.dense_h_to_4h\.weight: missing from the checkpoint"):
        load_checkpoint(tmp_path / "two", model, optimizer, rng, state)

    narrow = make_config(hidden_size=32)
    model, optimizer, rng = build(narrow, state, seed=2)
    with pytest.raises(CheckpointError) as failure:
        load_checkpoint(tmp_path / "two", model, optimizer, rng, state)
    message = str(failure.value)
    assert "word_embeddings.weight: checkpoint shape [512, 64], model shape [512, 32]" in message
    assert "blocks.0.attention.query_key_value.weight: checkpoint shape [192, 64], model shape [96, 32]" in message


# ---- 7. --keep-last and re-saving an iteration ------------------------------------------------

RUN = RunIdentity("a" * 32, "b" * 32)  # the lineage --keep-last prunes within


def test_keep_last_prunes_old_checkpoints_but_never_latest(saved, tmp_path):
    config, state = saved["config"], saved["state"]
    model, optimizer, rng = saved["model"], saved["optimizer"], saved["rng"]
    save_dir = tmp_path / "pruned"
    for iteration in range(1, 5):
        save_checkpoint(save_dir, iteration, 8 * iteration, model, optimizer, rng, config, state, identity=RUN)
        prune_checkpoints(save_dir, 2, state, RUN.run_id)
    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000003", "iter_0000004", LATEST_FILE, TRACKER_FILE]
    assert resolve_checkpoint(save_dir) == save_dir / "iter_0000004"

    kept = tmp_path / "kept"
    for iteration in range(1, 5):
        save_checkpoint(kept, iteration, 8 * iteration, model, optimizer, rng, config, state, identity=RUN)
        prune_checkpoints(kept, None, state, RUN.run_id)  # no --keep-last: keep everything
    assert len([p for p in kept.iterdir() if p.is_dir()]) == 4
    (kept / LATEST_FILE).write_text("iter_0000001\n")  # e.g. a run resumed from an older checkpoint
    prune_checkpoints(kept, 2, state, RUN.run_id)
    assert sorted(p.name for p in kept.iterdir()) == ["iter_0000001", "iter_0000003", "iter_0000004", LATEST_FILE, TRACKER_FILE]
    assert resolve_checkpoint(kept) == kept / "iter_0000001"


def test_keep_last_orders_checkpoints_by_iteration_number(tmp_path):
    """iter_NNNNNNN has 7 digits; iteration 10,000,000 has 8, and must count as newer than 9,999,999."""
    for iteration in (9_999_999, 10_000_000, 10_000_001):
        directory = tmp_path / iteration_dir_name(iteration)
        directory.mkdir()
        (directory / METADATA_FILE).write_text(json.dumps({"run_id": RUN.run_id}))
    (tmp_path / LATEST_FILE).write_text(iteration_dir_name(10_000_001) + "\n")
    prune(tmp_path, 2, RUN.run_id)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_10000000", "iter_10000001", LATEST_FILE]


def test_saving_the_same_iteration_twice_replaces_it(saved):
    config, state, save_dir = saved["config"], saved["state"], saved["save_dir"]
    model, optimizer, rng = saved["model"], saved["optimizer"], saved["rng"]
    train_steps(model, optimizer, 1, data_seed=3)
    second = optimizer_snapshot(optimizer)
    assert not torch.equal(second["master"], saved["snapshot"]["master"])
    save_checkpoint(save_dir, 7, 60, model, optimizer, rng, config, state)
    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000007", LATEST_FILE, TRACKER_FILE]

    model2, optimizer2, rng2 = fresh(saved)
    resume = load_checkpoint(save_dir, model2, optimizer2, rng2, state)
    assert (resume.iteration, resume.consumed_samples) == (7, 60)
    assert optimizer2.adam_step == 2
    assert_tensors_equal({key: getattr(optimizer2, key) for key in OPTIMIZER_KEYS},
                         {key: second[key] for key in OPTIMIZER_KEYS})


def test_crash_while_re_saving_an_iteration_falls_back_to_its_old_copy(saved):
    """`commit` moves the old copy of a re-saved iteration aside before moving the new one in; a
    crash between the two renames leaves `latest` naming a missing directory and the old copy whole."""
    save_dir = saved["save_dir"]
    retired = save_dir / "iter_0000007.old-4242"
    os.replace(save_dir / "iter_0000007", retired)
    assert resolve_checkpoint(save_dir) == retired
    model2, optimizer2, rng2 = fresh(saved)
    assert load_checkpoint(save_dir, model2, optimizer2, rng2, saved["state"]).iteration == 7
    # The next save of that iteration puts a new copy in place and clears the old one away.
    save_checkpoint(save_dir, 7, 56, saved["model"], saved["optimizer"], saved["rng"], saved["config"],
                    saved["state"])
    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000007", LATEST_FILE, TRACKER_FILE]


# ---- 8. elastic re-partitioning (gloo) --------------------------------------------------------

ELASTIC_BUCKET = 20000


def partition_record(model, optimizer, with_weights: bool = False) -> dict:
    """This rank's flat optimizer partitions and its fragment table, as plain picklable values."""
    names = names_by_id(model)
    record = {"fragments": [(names[id(f.slot.param)], f.param_offset, f.partition_offset, f.numel)
                            for f in optimizer.layout.fragments()],
              "shapes": {name: list(param.shape) for name, param in model.named_parameters()},
              "partitioned": optimizer.partitioned, "adam_step": optimizer.adam_step}
    record.update({key: getattr(optimizer, key).detach().numpy().copy() for key in OPTIMIZER_KEYS})
    if with_weights:
        record["weights"] = {name: w.numpy().copy() for name, w in full_weights(model, optimizer).items()}
    return record


def reassemble(records: list[dict]) -> dict[str, dict[str, torch.Tensor]]:
    """{key: {name: whole tensor}} from every rank's partition; each element must be covered once."""
    if not records[0]["partitioned"]:
        records = records[:1]  # stage 0: every rank holds the same, whole partition
    shapes = records[0]["shapes"]
    whole = {key: {name: torch.full(shape, float("nan")) for name, shape in shapes.items()}
             for key in OPTIMIZER_KEYS}
    covered = defaultdict(int)
    for record in records:
        for name, param_offset, partition_offset, numel in record["fragments"]:
            for key in OPTIMIZER_KEYS:
                values = torch.from_numpy(record[key][partition_offset:partition_offset + numel])
                whole[key][name].view(-1)[param_offset:param_offset + numel] = values
            covered[name] += numel
    for name, shape in shapes.items():
        assert covered[name] == torch.Size(shape).numel(), name
    return whole


def elastic_save(rank, world_size, save_dir):
    state = initialize("cpu", 1)
    try:
        config = make_config(stage=2, reduce_bucket_size=ELASTIC_BUCKET)
        model, optimizer, rng = build(config, state, seed=1)
        train_steps(model, optimizer, 2, data_seed=100 + rank)  # each DP rank its own batches
        assert len(optimizer.layout.units) > 2
        save_checkpoint(save_dir, 2, 2 * 2 * world_size, model, optimizer, rng, config, state)
        return partition_record(model, optimizer)
    finally:
        destroy(state)


def elastic_load(rank, world_size, save_dir, stages):
    state = initialize("cpu", 1)
    try:
        results = {}
        for stage in stages:
            config = make_config(stage=stage, reduce_bucket_size=ELASTIC_BUCKET)
            model, optimizer, rng = build(config, state, seed=5)
            resume = load_checkpoint(save_dir, model, optimizer, rng, state)
            results[stage] = (resume.iteration, resume.consumed_samples,
                              partition_record(model, optimizer, with_weights=True))
        return results
    finally:
        destroy(state)


@pytest.mark.slow
def test_elastic_resume_recuts_the_optimizer_state_exactly(tmp_path):
    save_dir = tmp_path / "ckpt"
    saved_records = run_distributed(elastic_save, 4, str(save_dir), timeout=300)
    assert all(record["partitioned"] for record in saved_records)
    expected = reassemble(saved_records)
    metadata = json.loads((save_dir / "iter_0000002" / METADATA_FILE).read_text())
    assert (metadata["data_parallel_size"], metadata["zero_stage"]) == (4, 2)
    assert len(metadata["optimizer_shards"]) == 4
    # The offline consolidation reads the same whole tensors back from the files.
    for key, tensors in consolidate(save_dir / "iter_0000002", OPTIMIZER_KEYS).items():
        assert_tensors_equal(tensors, expected[key])

    loaded = run_distributed(elastic_load, 2, str(save_dir), (3, 1), timeout=300)
    runs = {f"dp2-stage{stage}": [rank_results[stage] for rank_results in loaded] for stage in (3, 1)}
    model, optimizer, rng = build(make_config(stage=0, reduce_bucket_size=ELASTIC_BUCKET), cpu_state(), seed=5)
    resume = load_checkpoint(save_dir, model, optimizer, rng, cpu_state())
    runs["single-stage0"] = [(resume.iteration, resume.consumed_samples,
                              partition_record(model, optimizer, with_weights=True))]

    for run, ranks in runs.items():
        assert all((iteration, consumed) == (2, 16) for iteration, consumed, _ in ranks), run
        records = [record for _, _, record in ranks]
        assert all(record["adam_step"] == 2 for record in records), run
        whole = reassemble(records)
        for key in OPTIMIZER_KEYS:
            assert_tensors_equal(whole[key], expected[key])
        for record in records:  # fp32: the published weights are the master weights
            assert_tensors_equal({name: torch.from_numpy(w) for name, w in record["weights"].items()},
                                 expected["master"])
