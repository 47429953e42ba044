"""The launch path under bad inputs (issue 33, problems 9-11 and the fuzz test's launch part).

- Environment: every variable parallel/launch_environment.py reads (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, MASTER_PORT; SLURM's SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
  SLURM_JOB_NODELIST), each given malformed or inconsistent values beside otherwise valid launch
  variables: one line naming the variable, exit 2, nothing created. Half of torchrun's pair
  (WORLD_SIZE without RANK) is refused instead of training silently as one process. The values are
  those torchrun itself would never write: torchrun sets RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE
  as decimal integers together (torch/distributed/elastic/agent/server/local_elastic_agent.py,
  `_start_workers`: "RANK": str(worker.global_rank), "WORLD_SIZE": str(worker.world_size), ...), so
  anything else was typed by a person or a script.
- A rank SIGKILLed under scripts/launch.py (torchrun's agent, which stops the survivor with SIGTERM
  before the survivor's heartbeat can speak): launch.py's one line names the rank, its local rank and
  host, and the signal; non-zero exit; within the heartbeat timeout.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pretrain_gpt
from tests.reliability_helpers import TINY, run_main

REPO = Path(__file__).resolve().parents[2]

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "TORCHELASTIC_RUN_ID",
                    "TORCHELASTIC_USE_AGENT_STORE", "ZERO_GPT_EXIT_STATUS_DIR")
TORCHRUN = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "29500"}
SLURM = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "node[1-2]"}
NOT_NUMBERS = ["abc", "", " ", "-1", "1.5", "nan", "1e3", "0x1", "\u00b2", "1 2"]


def environment_cases() -> list[tuple[str, dict, str]]:
    """(name, environment, the variable the line must name); every environment is invalid."""
    cases = []
    for base in (TORCHRUN, SLURM):
        for variable in base:
            if variable in ("SLURM_JOB_NODELIST", "MASTER_PORT"):
                continue
            for value in NOT_NUMBERS:
                cases.append((f"{variable}={value!r}", {**base, variable: value}, variable))
    for variable in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS"):
        base = SLURM if variable.startswith("SLURM") else TORCHRUN
        cases.append((f"{variable}=0", {**base, variable: "0"}, variable))
    for variable, count in (("RANK", "WORLD_SIZE"), ("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        base = SLURM if variable.startswith("SLURM") else TORCHRUN
        for value in (base[count], "99999999999999999999"):
            cases.append((f"{variable}={value} with {count}={base[count]}", {**base, variable: value}, variable))
    for port in ["0", "65536", "99999999", "abc", "", "-5", "80.5"]:
        for base in (TORCHRUN, SLURM):
            cases.append((f"MASTER_PORT={port!r} ({'SLURM' if base is SLURM else 'torchrun'})",
                          {**base, "MASTER_PORT": port}, "MASTER_PORT"))
    for nodelist in ["node[1-", "node]1", "n[a-b]", "n[1-x]", "n[[1]]", ","]:
        cases.append((f"SLURM_JOB_NODELIST={nodelist!r}", {**SLURM, "SLURM_JOB_NODELIST": nodelist},
                      "SLURM_JOB_NODELIST"))
    without_nodelist = {key: value for key, value in SLURM.items() if key != "SLURM_JOB_NODELIST"}
    cases.append(("SLURM without a nodelist", without_nodelist, "SLURM_JOB_NODELIST"))
    # Half of torchrun's pair: today this trains as one process while the user asked for two.
    cases.append(("WORLD_SIZE without RANK", {"WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "WORLD_SIZE"))
    cases.append(("RANK without WORLD_SIZE", {"RANK": "1"}, "RANK"))
    return cases


CASES = environment_cases()


def test_the_environment_fuzz_covers_every_variable_the_launch_reads():
    named = {variable for _, _, variable in CASES}
    assert named == {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "SLURM_PROCID",
                     "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST"}
    assert len(CASES) >= 80


@pytest.mark.parametrize("name, environment, variable", CASES, ids=[case[0] for case in CASES])
def test_a_bad_launch_variable_is_one_line_naming_it_exit_2_and_nothing_created(
        tmp_path, monkeypatch, name, environment, variable):
    for key in LAUNCH_VARIABLES:
        monkeypatch.delenv(key, raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    work = tmp_path / "work"
    work.mkdir()
    outcome = run_main(pretrain_gpt.main, TINY + ["--data-cache-dir", work / "cache", "--save", work / "checkpoints",
                                                  "--metrics-file", work / "metrics.jsonl"])
    line = outcome.one_error_line(variable)
    assert line.startswith("pretrain_gpt.py: error: "), line
    assert list(work.iterdir()) == [], (name, sorted(work.rglob("*")))


# ---- a rank SIGKILLed under scripts/launch.py ---------------------------------------------------------
# torchrun's agent reacts to a dead worker by stopping the others (torch/distributed/elastic/agent/
# server/api.py, SimpleElasticAgent._invoke_run: on WorkerState.FAILED with no restarts left it returns
# the RunResult, and launch_agent raises ChildFailedError; LocalElasticAgent._stop_workers -> _shutdown ->
# PContext.close(death_sig=SIGTERM), then SIGKILL after the shutdown timeout). The agent polls every
# --monitor-interval (0.1 s), so the survivor is gone long before its own heartbeat could speak; the
# ChildFailedError's failures (multiprocessing/errors/__init__.py, ProcessFailure: local_rank, exitcode
# < 0 for a signal) are what launch.py turns into its line.

HEARTBEAT_TIMEOUT_S = 10
LAUNCH_RUN = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
              "--max-position-embeddings", "32", "--train-iters", "100000", "--seed", "1", "--log-interval", "1",
              "--eval-iters", "0", "--tokenizer-vocab-size", "512", "--device", "cpu", "--global-batch-size", "8",
              "--micro-batch-size", "4", "--zero-stage", "2", "--heartbeat-timeout-seconds", str(HEARTBEAT_TIMEOUT_S)]


def worker_with_rank(launcher_pid: int, rank: int) -> int:
    """The pid of the launcher's child whose environment says RANK=`rank` (torchrun starts the ranks
    as the launcher's own children)."""
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children").read_text().split()
    for pid in map(int, children):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if f"RANK={rank}".encode() in environ:
            return pid
    raise LookupError(f"no child with RANK={rank}")


def wait_for_training(metrics_file: Path, launcher, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (metrics_file.exists() and metrics_file.read_text().count("\n") >= 3):
        assert launcher.poll() is None, "the launch ended before training"
        assert time.monotonic() < deadline, "no training after 180 s"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("killed_rank", [1, 0])
def test_a_rank_killed_under_launch_py_is_named_in_one_line(tmp_path, corpus_cache, killed_rank):
    metrics = tmp_path / "metrics.jsonl"
    env = {key: value for key, value in os.environ.items() if key not in LAUNCH_VARIABLES}
    env.update(WANDB_MODE="disabled")
    launcher = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "launch.py"), "--standalone", "--nproc_per_node", "2",
         str(REPO / "pretrain_gpt.py"), *LAUNCH_RUN, "--data-cache-dir", corpus_cache, "--metrics-file", str(metrics)],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_training(metrics, launcher)
        os.kill(worker_with_rank(launcher.pid, killed_rank), signal.SIGKILL)
        killed_at = time.monotonic()
        _, err = launcher.communicate(timeout=120)
        exited_after = time.monotonic() - killed_at
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGTERM)  # torchrun forwards it to the ranks
            launcher.communicate(timeout=60)
    assert launcher.returncode != 0
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.fullmatch(rf"launch\.py: error: rank {killed_rank} \(local rank {killed_rank} on host \S+\) died: "
                        r"killed by SIGKILL; torchrun stopped the other ranks", lines[0]), lines[0]
    print(f"kill to launch.py's exit: {exited_after:.1f} s")
    assert exited_after < HEARTBEAT_TIMEOUT_S
