"""What real runs of the experiment points measured, read from their metrics.jsonl.

run.py gives every point a directory RUNS_DIR/PROFILE/FIGURE/POINT/ with a launch.json naming the
figure, profile and point; pretrain_gpt.py writes metrics.jsonl beside it. A run counts as measured
once it logged a training record after the warm-up; its iteration time and TFLOP/s are the medians
of those records (tflops_per_gpu counts the recompute, as the predictions' hardware FLOPs do), its
memory the largest `memory_bytes` (CUDA's max_memory_allocated on a GPU).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from zero.perf_calibration import LAUNCH_FILE, WARMUP_RECORDS


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
    try:
        launch = json.loads((metrics.parent / LAUNCH_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(launch, dict) or not {"figure", "profile", "point"} <= set(launch):
        return None
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
        for metrics in sorted(Path(directory).rglob("metrics.jsonl")):
            run = read_run(metrics)
            if run is not None:
                found[(run.figure, run.profile, run.point)] = run
    return found
