"""One pretrain_gpt.py launch timed step by step, for the measuring scripts (scripts/search_vs_measured.py,
scripts/probe_host_overhead.py): each step's iter_time_s from rank 0's metrics file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from arguments.config import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent


def step_times(argv: Sequence[str], ranks: int, scratch: Path, what: str, one_thread: bool = True) -> list[float]:
    """pretrain_gpt.py with `argv` on `ranks` ranks (scripts/launch.py where more than one: gloo on the CPU; one
    rank needs no launcher, whose torchrun arguments follow this repository's pinned torch), run in `scratch`;
    `one_thread`: OMP_NUM_THREADS=1. A failed launch raises ConfigError naming `what` and its last error line."""
    metrics = scratch / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    launcher = [] if ranks == 1 else [str(REPO_ROOT / "scripts" / "launch.py"), "--standalone", "--nproc_per_node",
                                      str(ranks)]
    env = {**os.environ, "WANDB_MODE": "disabled", **({"OMP_NUM_THREADS": "1"} if one_thread else {})}
    result = subprocess.run([sys.executable, *launcher, str(REPO_ROOT / "pretrain_gpt.py"), *argv, "--metrics-file",
                             str(metrics)], cwd=scratch, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConfigError(f"{what} failed ({result.returncode}): {tail}")
    return [json.loads(line)["iter_time_s"] for line in metrics.read_text(encoding="utf-8").splitlines() if line]
