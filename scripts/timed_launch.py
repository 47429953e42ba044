"""One pretrain_gpt.py launch and what its first rank's metrics file holds, for the scripts that time steps or compare
losses (bench/search_vs_measured.py, bench/probe_host_overhead.py, tools/layout_fuzz.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from arguments.config import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Launched:
    returncode: int
    records: list          # the metrics file's training-step records (those with an iter_time_s), in order
    last_error: str        # the last line of stderr, or of stdout where stderr is empty


def launch(argv: Sequence[str], ranks: int, scratch: Path, one_thread: bool = True,
           timeout_s: Optional[float] = None) -> Launched:
    """pretrain_gpt.py with `argv` on `ranks` ranks (scripts/launch.py where more than one: gloo on the CPU; one
    rank needs no launcher, whose torchrun arguments follow this repository's pinned torch), run in `scratch`;
    `one_thread`: OMP_NUM_THREADS=1. A launch past `timeout_s` is stopped and reported with returncode 124."""
    metrics = scratch / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    launcher = [] if ranks == 1 else [str(REPO_ROOT / "scripts" / "launch.py"), "--standalone", "--nproc_per_node",
                                      str(ranks)]
    env = {**os.environ, "WANDB_MODE": "disabled", **({"OMP_NUM_THREADS": "1"} if one_thread else {})}
    try:
        result = subprocess.run([sys.executable, *launcher, str(REPO_ROOT / "pretrain_gpt.py"), *argv,
                                 "--metrics-file", str(metrics)], cwd=scratch, capture_output=True, text=True,
                                env=env, timeout=timeout_s)
        returncode, output = result.returncode, (result.stderr.strip() or result.stdout.strip())
    except subprocess.TimeoutExpired:
        returncode, output = 124, f"stopped after {timeout_s:g} s"
    return Launched(returncode, step_records(metrics), (output.splitlines() or ["(no output)"])[-1])


def step_records(metrics: Path) -> list:
    """The training-step records of a metrics file (those with an iter_time_s), in order; none where it is absent."""
    if not metrics.exists():
        return []
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line]
    return [record for record in records if "iter_time_s" in record]


def step_times(argv: Sequence[str], ranks: int, scratch: Path, what: str, one_thread: bool = True) -> list[float]:
    """Each step's iter_time_s of `launch`; a failed launch raises ConfigError naming `what` and its last error line."""
    launched = launch(argv, ranks, scratch, one_thread)
    if launched.returncode != 0:
        raise ConfigError(f"{what} failed ({launched.returncode}): {launched.last_error}")
    return [record["iter_time_s"] for record in launched.records]
