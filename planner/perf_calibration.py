"""Fit the performance model's constants to measured runs (`python -m zero.perf_model --calibrate FILE...`): each run, a
metrics.jsonl with its launch.json or a benchmark_gpu.py --json output, is planned again, and a few Gauss-Newton steps
fit GEMM_EFFICIENCY and ELEMENTWISE_PASSES; DP_OVERLAP is fitted only where some run sends DP traffic."""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import yaml

from arguments.config import ConfigError, PretrainConfig
from arguments.parser import parse_config
from planner.dry_run import Cluster, RankPlan, dry_run
from planner.perf_model import Constants, Hardware, predict

WARMUP_RECORDS = 2  # the first records hold the first iterations' allocations and caches
LAUNCH_FILE = "launch.json"
GPT2_VOCAB = 50257
# the reducer starts each bucket's reduction as backward fills it, so on a GPU all of it can hide: 1.0 until a multi-GPU
# run measures otherwise
DP_OVERLAP_BY_DESIGN = 1.0
OVERLAP_GRID = np.linspace(0.0, 1.0, 21)


@dataclass
class Observation:
    name: str
    config: PretrainConfig
    world_size: int
    gpus_per_node: int
    vocab_size: int
    measured_s: float
    plan: Optional[RankPlan] = None


def observations_from(path: Path) -> list[Observation]:
    """The runs one FILE holds: the median iter_time_s after WARMUP_RECORDS, or a benchmark's eager rows."""
    if path.name.endswith(".jsonl"):
        return [_metrics_observation(path)]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"--calibrate {path}: cannot read it ({error})") from None
    if not isinstance(data, dict) or "rows" not in data:
        raise ConfigError(f"--calibrate {path}: neither a metrics.jsonl nor a scripts/bench/benchmark_gpu.py --json output")
    found = []
    for row in data["rows"]:
        if row.get("impl") != "ours" or row.get("compiled"):
            continue
        argv = ["--config", row["model"], "--micro-batch-size", str(row["micro_batch_size"]),
                "--gradient-accumulation-steps", str(row["accumulation_steps"]), "--seq-length",
                str(row["seq_length"]), "--bf16", "--hidden-dropout", "0", "--attention-dropout", "0"]
        found.append(Observation(f"{path.name}: {row['model']} {row['micro_batch_size']}x{row['accumulation_steps']}",
                                 parse_config(argv), 1, 1, GPT2_VOCAB, float(row["best_step_s"])))
    if not found:
        raise ConfigError(f"--calibrate {path}: no eager rows of our model in it")
    return found


def _metrics_observation(path: Path) -> Observation:
    launch_path = path.parent / LAUNCH_FILE
    try:
        launch = json.loads(launch_path.read_text(encoding="utf-8"))
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"--calibrate {path}: needs the run's metrics and its {LAUNCH_FILE} ({error})") from None
    times = [r["iter_time_s"] for r in records if "iter_time_s" in r and "split" not in r][WARMUP_RECORDS:]
    if not times:
        raise ConfigError(f"--calibrate {path}: no training records after the first {WARMUP_RECORDS}")
    return Observation(str(path), parse_config(launch["argv"]), int(launch["world_size"]),
                       int(launch["gpus_per_node"]), int(launch["vocab_size"]), statistics.median(times))


def plan_observations(observations: Sequence[Observation], hardware: Hardware) -> None:
    for observation in observations:
        cluster = Cluster(observation.world_size, observation.gpus_per_node, None, hardware.device_type)
        observation.plan = dry_run(observation.config, cluster, observation.vocab_size)


def predicted_seconds(observation: Observation, hardware: Hardware, constants: Constants) -> float:
    local = dataclasses.replace(hardware, gpus_per_node=observation.gpus_per_node)
    return predict(observation.plan, observation.config, observation.vocab_size, observation.world_size,
                   local, constants).iteration_s


def _fit_for_overlap(observations, hardware, overlap: float, start: Constants) -> tuple[Constants, float]:
    """Gauss-Newton on x = 1/GEMM_EFFICIENCY (>= 1) and c = ELEMENTWISE_PASSES (>= 0) for one overlap."""
    x, c = 1.0 / start.gemm_efficiency, start.elementwise_passes
    measured = np.array([o.measured_s for o in observations])

    def times(x_value, c_value):
        constants = Constants(1.0 / x_value, c_value, overlap)
        return np.array([predicted_seconds(o, hardware, constants) for o in observations])

    for _ in range(8):
        base = times(x, c)
        slope_x = (times(x + 0.5, c) - base) / 0.5
        slope_c = (times(x, c + 1.0) - base) / 1.0
        rest = base - slope_x * x - slope_c * c
        x, c = _bounded_least_squares(slope_x / measured, slope_c / measured, (measured - rest) / measured)
    error = float(np.sqrt(np.mean(((times(x, c) - measured) / measured) ** 2)))
    return Constants(1.0 / x, c, overlap), error


def _bounded_least_squares(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """argmin |a x + b c - y| with x >= 1 and c >= 0: the free solution, else the best on an edge."""
    candidates = []
    solution, *_ = np.linalg.lstsq(np.stack([a, b], axis=1), y, rcond=None)
    if solution[0] >= 1.0 and solution[1] >= 0.0:
        candidates.append((float(solution[0]), float(solution[1])))
    candidates.append((max(1.0, float(a @ y / (a @ a))), 0.0))                           # c = 0
    candidates.append((1.0, max(0.0, float(b @ (y - a) / (b @ b))) if b @ b > 0 else 0.0))  # x = 1
    return min(candidates, key=lambda xc: float(np.sum((a * xc[0] + b * xc[1] - y) ** 2)))


def fit_constants(observations: Sequence[Observation], hardware: Hardware) -> tuple[Constants, float, bool]:
    """The constants that best predict the runs (relative error), their RMS relative error, and whether DP_OVERLAP was
    fitted."""
    start = Constants(0.5, 10.0, DP_OVERLAP_BY_DESIGN)
    with_dp = any(sum(o.plan.comm_bytes["dp"].values()) > 1024 for o in observations)
    overlaps = OVERLAP_GRID if with_dp else [DP_OVERLAP_BY_DESIGN]
    best = min((_fit_for_overlap(observations, hardware, float(overlap), start) for overlap in overlaps),
               key=lambda fitted: fitted[1])
    return best[0], best[1], with_dp


def calibrate_command(files: Sequence[str], hardware: Hardware, output: Optional[str], argv: Sequence[str]) -> int:
    observations = [o for name in files for o in observations_from(Path(name))]
    plan_observations(observations, hardware)
    constants, error, overlap_fitted = fit_constants(observations, hardware)
    rows = []
    print(f"calibrated on {hardware.name} from {len(observations)} runs:")
    print("| run | measured (ms) | predicted (ms) | error |\n|---|---:|---:|---:|")
    for observation in observations:
        predicted = predicted_seconds(observation, hardware, constants)
        rows.append({"run": observation.name, "measured_s": round(observation.measured_s, 6),
                     "predicted_s": round(predicted, 6),
                     "relative_error": round(predicted / observation.measured_s - 1, 4)})
        print(f"| {observation.name} | {observation.measured_s * 1e3:.1f} | {predicted * 1e3:.1f} | "
              f"{predicted / observation.measured_s - 1:+.1%} |")
    print(f"GEMM_EFFICIENCY {constants.gemm_efficiency:.4f}, ELEMENTWISE_PASSES {constants.elementwise_passes:.2f}, "
          f"DP_OVERLAP {constants.dp_overlap:.2f}" + ("" if overlap_fitted else " (by design: no run sent DP traffic)")
          + f"; RMS relative error {error:.1%}")
    if output:
        document = {"gemm_efficiency": round(constants.gemm_efficiency, 4),
                    "elementwise_passes": round(constants.elementwise_passes, 2),
                    "dp_overlap": round(constants.dp_overlap, 2), "dp_overlap_fitted": overlap_fitted,
                    "hardware": hardware.name, "rms_relative_error": round(error, 4),
                    "command": "python -m zero.perf_model " + " ".join(argv), "runs": rows}
        Path(output).write_text("# Written by the command below; see planner/perf_calibration.py.\n"
                                + yaml.safe_dump(document, sort_keys=False, width=100), encoding="utf-8")
        print(f"wrote {output}")
    return 0
