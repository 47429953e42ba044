"""What real runs of the experiment points measured, read from their metrics.jsonl.

A run (run.py's RUNS_DIR/PROFILE/FIGURE/POINT/ with its launch.json) counts once it logged a record past the warm-up:
its time and TFLOP/s are those records' medians, its memory the largest `memory_bytes`. A --runs tree is walked, not
trusted: a FIFO, a device, an oversized file or a runaway tree is one line."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from base.errors import ConfigError
from base.input_files import check_input_file, irregularity
from planner.perf_calibration import LAUNCH_FILE, WARMUP_RECORDS

METRICS_FILE = "metrics.jsonl"
# A run logging every iteration for a million iterations writes about 0.5 GB.
MAX_METRICS_BYTES = 2**31
# run.py's layout is RUNS/PROFILE/FIGURE/POINT: a few hundred directories for every figure.
MAX_RUN_DIRECTORIES = 100_000


@dataclass
class Measured:
    figure: str
    profile: str
    point: str
    directory: Path
    iterations: int                      # training records logged
    iteration_s: Optional[float]         # median after the warm-up; None if the run never got past it
    tflops_per_gpu: Optional[float]
    memory_bytes: Optional[int]
    memory_records: list[dict] = field(default_factory=list)  # --report-memory, one per rank

    @property
    def completed(self) -> bool:
        return self.iteration_s is not None


def read_run(metrics: Path) -> Optional[Measured]:
    """The run in `metrics`' directory, or None when it has no launch.json of run.py's (not ours)."""
    launch_path = metrics.parent / LAUNCH_FILE
    if irregularity(launch_path) is not None or launch_path.stat().st_size > 2**20:
        return None  # run.py writes a regular file of a few hundred bytes
    try:
        launch = json.loads(launch_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(launch, dict) or not {"figure", "profile", "point"} <= set(launch):
        return None
    check_input_file(metrics, "--runs", MAX_METRICS_BYTES, fix="a run's metrics.jsonl must be a regular file")
    records = []
    for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
    training = [r for r in records if "iter_time_s" in r and "split" not in r]
    steady = training[WARMUP_RECORDS:]
    memory = [rank for r in records if isinstance(r.get("memory"), list) for rank in r["memory"]]
    peaks = [r["memory_bytes"] for r in training if "memory_bytes" in r]
    return Measured(launch["figure"], launch["profile"], launch["point"], metrics.parent, len(training),
                    statistics.median(r["iter_time_s"] for r in steady) if steady else None,
                    statistics.median(r["tflops_per_gpu"] for r in steady) if steady else None,
                    max(peaks) if peaks else None, memory)


def read_runs(directories: Iterable[str]) -> dict[tuple[str, str, str], Measured]:
    """Every run.py run under `directories`, keyed by (figure, profile, point)."""
    found = {}
    for directory in directories:
        for metrics in metrics_files(Path(directory)):
            run = read_run(metrics)
            if run is not None:
                found[(run.figure, run.profile, run.point)] = run
    return found


def metrics_files(directory: Path) -> list[Path]:
    """Every metrics.jsonl below `directory`, in path order, the walk bounded by MAX_RUN_DIRECTORIES
    (symbolic links to directories are not followed, so a link cycle cannot make it endless)."""
    found, visited = [], 0
    for root, subdirectories, files in os.walk(directory):
        visited += 1
        if visited > MAX_RUN_DIRECTORIES:
            raise ConfigError(f"--runs {directory}: more than {MAX_RUN_DIRECTORIES:,} directories below it "
                              f"(MAX_RUN_DIRECTORIES in measurements.py); give run.py's --runs-dir")
        if METRICS_FILE in files:
            found.append(Path(root) / METRICS_FILE)
    return sorted(found)


def measured_points(figure: str, rows_by_profile: dict, fig6_measured: Optional[dict] = None) -> int:
    """How many marks of `figure` are measured on a GPU (the rest are predictions): its points whose run
    completed, Figure 6's largest completed run per configuration, Figure 7's runs that logged memory."""
    if figure == "fig6":
        return len(fig6_measured or {})
    rows = [row for rows in rows_by_profile.values() for row in rows if row.measured is not None]
    if figure == "fig7":
        return sum(1 for row in rows if row.measured.memory_bytes)
    return sum(1 for row in rows if row.measured.completed)


def provenance(measured: int, cpu_source: Optional[str] = None) -> str:
    """Where a figure's marks come from, in one line (under its title, and its caption in report.md), so
    that a figure of predictions is never read as a result."""
    source = ("PREDICTED by the planner (memory) and the performance model (time), not measured: no measured "
              "run" if measured == 0 else
              f"predicted by the planner and the performance model, with {measured} measured "
              f"point{'s' if measured != 1 else ''} (black)")
    return source + (f"; the right panel is measured on a CPU ({cpu_source})" if cpu_source else "")
