"""FP8 loss curves: a 4-layer GPT trained in bf16 and once per FP8 recipe, same seed, data and schedule; each recipe's
final loss against bf16's, and the curves drawn by `python -m training.plot`.

    python scripts/bench/fp8_curves.py OUT_DIR [--iterations 300] [--jobs 1] [-- FLAGS]

Writes OUT_DIR/summary.json and fp8-curves.png."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
# The smallest sensible 4-layer GPT for the FP8 shape rules: every GEMM dimension a multiple of 32 (mxfp8's
# blocks), 512 tokens a micro-batch. Dropout off so that the runs differ by their GEMMs alone.
MODEL = ["--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
         "--max-position-embeddings", "128", "--micro-batch-size", "4", "--global-batch-size", "4",
         "--attention-dropout", "0", "--hidden-dropout", "0"]
SCHEDULE = ["--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "30",
            "--seed", "1234"]
LAST = 10  # the final loss is also reported as the mean of the last LAST iterations


def run_flags(name: str) -> list[str]:
    """The FP8 flags of run `name` ('bf16', or '<recipe>-<format>')."""
    if name == "bf16":
        return []
    recipe, fp8_format = name.rsplit("-", 1)
    return ["--fp8-format", fp8_format, "--fp8-recipe", recipe]


def train(name: str, iterations: int, out_dir: Path, extra: list[str]) -> float:
    """Run `name` to completion; its wall time."""
    metrics = out_dir / f"{name}.jsonl"
    metrics.unlink(missing_ok=True)
    command = [sys.executable, str(REPO / "pretrain_gpt.py"), "--device", "cpu", *MODEL, *SCHEDULE, "--bf16",
               "--train-iters", str(iterations), "--log-interval", "1", "--eval-iters", "0",
               "--metrics-file", str(metrics), *run_flags(name), *extra]
    start = time.monotonic()
    done = subprocess.run(command, cwd=out_dir, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True)
    (out_dir / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"fp8_curves.py: run {name} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    print(f"fp8_curves.py: {name} done in {time.monotonic() - start:.0f} s", flush=True)
    return time.monotonic() - start


def read_run(metrics: Path) -> dict:
    """The losses per iteration, the summed iteration times, and the FP8 guard's counts over the run."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    training = sorted((r for r in records if isinstance(r.get("loss"), float) and "split" not in r),
                      key=lambda r: r["iteration"])
    guard = {key: sum(r.get(key) or 0 for r in training) for key in ("fp8_cast_values", "fp8_saturated",
                                                                      "fp8_flushed")}
    fallbacks = sorted({layer for r in training for layer in (r.get("fp8_high_precision_layers") or [])})
    fallback_iterations = [r["iteration"] for r in training if r.get("fp8_high_precision_layers")]
    return {"iterations": len(training), "losses": [r["loss"] for r in training],
            "training_s": round(sum(r.get("iter_time_s") or 0 for r in training), 1),
            "guard": {**guard, "high_precision_layers": fallbacks, "fallback_iterations": fallback_iterations}}


def compare(run: dict, base: dict) -> dict:
    """The run's final loss (its last value, and the mean of its last LAST) against bf16's at the same
    iterations: a run cut short is compared where it stopped."""
    n = min(run["iterations"], base["iterations"])
    window = slice(max(n - LAST, 0), n)
    last, mean = run["losses"][n - 1], sum(run["losses"][window]) / len(run["losses"][window])
    base_last, base_mean = base["losses"][n - 1], sum(base["losses"][window]) / len(base["losses"][window])
    return {"at_iteration": n, "final_loss": last, "bf16_final_loss": base_last, "final_vs_bf16": last / base_last - 1,
            f"mean_last_{LAST}": mean, f"bf16_mean_last_{LAST}": base_mean,
            f"mean_last_{LAST}_vs_bf16": mean / base_mean - 1}


def summarize(names: list[str], out_dir: Path, command: list[str], loads: dict) -> dict:
    runs = {name: read_run(out_dir / f"{name}.jsonl") for name in names if (out_dir / f"{name}.jsonl").exists()}
    for run in runs.values():
        run.update(compare(run, runs["bf16"]))
    return {"command": " ".join(command), "pretrain_flags": " ".join(["--device", "cpu", *MODEL, *SCHEDULE, "--bf16"]),
            **loads, "runs": runs}


def markdown_table(runs: dict) -> str:
    """One row per run, as docs/fp8.md shows them."""
    rows = [f"| run | iterations | final loss | vs bf16 | mean of the last {LAST} | vs bf16 | high-precision "
            f"fallbacks (iterations) | saturated / cast values | time of the iterations |", "|---" * 9 + "|"]
    for name, run in runs.items():
        fallbacks = run["guard"]["fallback_iterations"]
        rows.append(f"| {name} | {run['at_iteration']} | {run['final_loss']:.4f} | {run['final_vs_bf16']:+.2%} | "
                    f"{run[f'mean_last_{LAST}']:.4f} | {run[f'mean_last_{LAST}_vs_bf16']:+.2%} | "
                    f"{', '.join(map(str, fallbacks)) or 'none'} | "
                    f"{run['guard']['fp8_saturated']:,} / {run['guard']['fp8_cast_values']:,} | "
                    f"{run['training_s']:.0f} s |")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bench/fp8_curves.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--formats", nargs="+", choices=("hybrid", "e4m3"), default=["hybrid"])
    parser.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: summarize and draw the metrics files OUT_DIR holds (a run cut short "
                             "is compared with bf16 at the iteration it reached)")
    ours, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    args.out_dir = args.out_dir.resolve()  # each run's working directory, so its paths are absolute
    args.out_dir.mkdir(parents=True, exist_ok=True)
    names = ["bf16"] + [f"{recipe}-{fmt}" for fmt in args.formats for recipe in args.recipes]
    loads = {"load_average_at_report" if args.report_only else "load_average_before": os.getloadavg()}
    if not args.report_only:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            walls = dict(zip(names, pool.map(lambda name: train(name, args.iterations, args.out_dir, extra), names)))
        loads["load_average_after"], loads["wall_s"] = os.getloadavg(), {k: round(v, 1) for k, v in walls.items()}
    summary = summarize(names, args.out_dir, ["python", "scripts/bench/fp8_curves.py", *argv], loads)
    names = list(summary["runs"])
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plotted = subprocess.run([sys.executable, "-m", "training.plot", *[f"{name}.jsonl" for name in names],
                              "-o", "fp8-curves.png", "--overwrite"], cwd=args.out_dir, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONPATH=str(REPO)))
    if plotted.returncode:
        raise SystemExit(f"fp8_curves.py: training.plot exited {plotted.returncode}: {plotted.stderr.strip()}")
    print(markdown_table(summary["runs"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
