"""The launch path under bad inputs (issue 33, problems 9-11 and the fuzz test's launch part).

- Environment: every variable parallel/state.py reads (torchrun's RANK, WORLD_SIZE, LOCAL_RANK,
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
