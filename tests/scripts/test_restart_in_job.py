"""Issue 69, item 5: torchrun's own restart (scripts/launch.py --max-restarts) resumes the job from its latest
checkpoint with every loss equal to the uninterrupted run's.

The launch is torchrun's static rendezvous (`--nnodes 1 --master_addr --master_port`, how Megatron-LM's scripts
launch): its agent keeps one store for every restart (torch's static_tcp_rendezvous.py), which is where each
restart failed in gloo's connectFullMesh before parallel/attempt_store.py. The fault comes from outside: the test
watches the metrics file for iteration 5 and signals rank 1's process, found among the launcher's children by its
RANK (never by name).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability_helpers import TINY, metrics_records

REPO = Path(__file__).resolve().parents[2]
TWELVE = TINY + ["--tokenizer-vocab-size", "512", "--micro-batch-size", "1", "--train-iters", "12",
                 "--save-interval", "2"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_environment() -> dict[str, str]:
    from tests.training.test_launch_fuzz import LAUNCH_VARIABLES

    environment = {key: value for key, value in os.environ.items() if key not in LAUNCH_VARIABLES}
    return {**environment, "WANDB_MODE": "disabled"}


def start(workdir: Path, corpus_cache: str, launch_flags: list[str], train_flags: list[str]) -> subprocess.Popen:
    """scripts/launch.py, static rendezvous, 2 ranks, a save every 2 iterations to workdir/ck (also --load)."""
    command = [sys.executable, str(REPO / "scripts" / "launch.py"), *launch_flags, "--nnodes", "1", "--nproc_per_node",
               "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(REPO / "pretrain_gpt.py"),
               *TWELVE, "--data-cache-dir", corpus_cache, "--save", str(workdir / "ck"), "--load", str(workdir / "ck"),
               "--metrics-file", str(workdir / "metrics.jsonl"), *train_flags]
    return subprocess.Popen(command, cwd=workdir, env=launch_environment(), stdout=open(workdir / "out", "w"),
                            stderr=open(workdir / "err", "w"))


def losses(path: Path) -> dict[int, float]:
    """iteration -> training loss; a record a later incarnation wrote again for the same iteration wins."""
    return {record["iteration"]: record["loss"] for record in metrics_records(path)
            if "loss" in record and "split" not in record and "memory" not in record}


def rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the launcher's child that runs `rank` (torchrun's agent runs inside the launcher's process)."""
    for listing in Path(f"/proc/{launcher.pid}/task").glob("*/children"):
        for pid in listing.read_text().split():
            environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environment:
                return int(pid)
    raise AssertionError(f"no child of the launcher runs rank {rank}")


def fault_at(launcher: subprocess.Popen, metrics: Path, iteration: int, rank: int, signum: int,
             timeout_s: float = 120) -> int:
    """Signal `rank` once the metrics file holds `iteration`'s record; its pid."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.poll() is None:
        if metrics.exists() and iteration in losses(metrics):
            pid = rank_pid(launcher, rank)
            os.kill(pid, signum)
            return pid
        time.sleep(0.02)
    raise AssertionError(f"iteration {iteration} never came (exit {launcher.poll()})")


def finish(launcher: subprocess.Popen, workdir: Path, timeout_s: float = 180) -> tuple[int, str, str]:
    try:
        code = launcher.wait(timeout=timeout_s)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    return code, (workdir / "out").read_text(), (workdir / "err").read_text()


@pytest.fixture(scope="module")
def uninterrupted(corpus_cache, tmp_path_factory) -> dict[int, float]:
    work = tmp_path_factory.mktemp("uninterrupted")
    code, out, err = finish(start(work, corpus_cache, [], []), work)
    assert code == 0, err[-3000:]
    straight = losses(work / "metrics.jsonl")
    assert sorted(straight) == list(range(1, 13))
    return straight


@pytest.mark.slow
def test_a_rank_killed_at_iteration_5_is_restarted_by_torchrun_and_the_job_resumes(corpus_cache, uninterrupted,
                                                                                   tmp_path):
    launcher = start(tmp_path, corpus_cache, ["--max-restarts", "2"], [])
    fault_at(launcher, tmp_path / "metrics.jsonl", 5, rank=1, signum=signal.SIGKILL)
    code, out, err = finish(launcher, tmp_path)
    assert code == 0, (err[-3000:], out[-3000:])
    assert "Connection refused" not in err and "connectFullMesh" not in err, err[-3000:]
    assert "resuming after iteration 4" in out or "resuming after iteration 6" in out, out[-3000:]
    assert losses(tmp_path / "metrics.jsonl") == uninterrupted
