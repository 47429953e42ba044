"""A requeued job always resumes (issue 33, problems 3, 4, 5 and 12): the same `--save CK --load CK`
command after a kill at any point of the first save, a lock left by this container's previous life,
a divergence message that names a checkpoint that resumes, and a run too short to train anything.

Megatron-LM, the reference: megatron/training/checkpointing.py (NVIDIA/Megatron-LM) writes the
tracker file `latest_checkpointed_iteration.txt` at the end of save_checkpoint, after every rank's
files, and _load_base_checkpoint on a missing tracker file prints "WARNING: could not find the
metadata file ... will not load any checkpoints and will start from random" and returns no state:
a `--load` directory without the tracker starts from scratch. Here the complete, verified iteration
the killed save left is adopted instead (checkpoint/unfinished_save.py), so nothing trained is lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability_helpers import TINY, metrics_records, train

REPO = Path(__file__).resolve().parents[2]
VOCAB = ["--tokenizer-vocab-size", "512"]  # the session corpus's vocabulary (tests/conftest.py)
SAVE_POINTS = ("files", "metadata", "renamed", "latest-temp", "latest")  # tests/kill_in_save.py


def losses(path: Path) -> dict[int, float]:
    """iteration -> training loss; a record a later run wrote again for the same iteration wins."""
    return {record["iteration"]: record["loss"] for record in metrics_records(path)
            if "loss" in record and "split" not in record and "memory" not in record}


@pytest.fixture(scope="module")
def straight(corpus_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("straight")
    outcome = train(corpus_cache, work, *VOCAB, "--train-iters", "4")
    assert outcome.code == 0, outcome.err
    return losses(work / "metrics.jsonl")


@pytest.mark.parametrize("point", SAVE_POINTS)
def test_a_kill_at_each_point_of_the_first_save_then_the_same_command_resumes(corpus_cache, straight, tmp_path,
                                                                              point):
    ck, metrics = tmp_path / "ck", tmp_path / "metrics.jsonl"
    command = TINY + VOCAB + ["--data-cache-dir", corpus_cache, "--metrics-file", str(metrics), "--train-iters", "4",
                              "--save", str(ck), "--load", str(ck), "--save-interval", "2"]
    killed = subprocess.run([sys.executable, str(REPO / "tests" / "kill_in_save.py"), *command], cwd=REPO,
                            env={**os.environ, "KILL_SAVE_POINT": point}, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    assert not (ck / "iter_0000004").exists()  # it died in the first save, at iteration 2

    again = train(corpus_cache, tmp_path, *VOCAB, "--train-iters", "4", "--save", ck, "--load", ck,
                  "--save-interval", "2")  # the same command: metrics.jsonl in tmp_path, as above
    assert again.code == 0, again.err
    assert losses(metrics) == straight
    assert (ck / "latest").read_text() == "iter_0000004\n"
    if point in ("renamed", "latest-temp", "latest"):  # iteration 2 was complete: resumed, not redone
        assert "resuming after iteration 2" in again.out, again.out


def test_a_left_iteration_that_does_not_verify_is_set_aside_and_the_run_starts_fresh(corpus_cache, tmp_path):
    ck = tmp_path / "ck"
    same_command = [*VOCAB, "--train-iters", "1", "--save", ck, "--load", ck, "--save-interval", "1"]
    assert train(corpus_cache, tmp_path, *same_command).code == 0
    (ck / "latest").unlink()  # as a kill before `latest` leaves it
    damaged = ck / "iter_0000001" / "model_tp00.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF  # a bit flip of the same size: only the content hash catches it
    damaged.write_bytes(bytes(data))

    again = train(corpus_cache, tmp_path, *same_command)
    assert again.code == 0, again.err
    assert "does not verify" in again.out and "starting a fresh run" in again.out, again.out
    aside = [path for path in ck.iterdir() if path.name.startswith("iter_0000001.unverified-")]
    assert len(aside) == 1 and (aside[0] / "model_tp00.safetensors").read_bytes() == bytes(data)  # never deleted
    assert (ck / "latest").read_text() == "iter_0000001\n"  # the fresh run saved iteration 1 anew
