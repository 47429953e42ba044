#!/usr/bin/env python
"""One GPU, one call, the whole speed table: this project's pretrain_gpt.py eager, compiled, with CUDA graphs and each
FP8 recipe, beside Megatron-LM's own pretrain_gpt.py on the same command line; one JSON naming the device, torch
and the commit.

    python scripts/bench/gpu_side_by_side.py --list     # the runs and their command lines, nothing run

Megatron-LM runs without Transformer Engine or apex, and every ratio to it says so."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from base.errors import ConfigError, OneLineArgumentParser, run_tool  # noqa: E402

# Megatron-LM's flags for the table (the side-by-side kit's run.sh): mock data, bf16, Megatron's torch-only path.
COMMON = ("--tokenizer-type NullTokenizer --mock-data --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine "
          "--lr-warmup-iters 2 --weight-decay 0.1 --clip-grad 1.0 --bf16 --attention-dropout 0 --hidden-dropout 0 "
          "--log-interval 1 --log-throughput --eval-iters 0 --eval-interval 100000 --seed 1234 "
          "--transformer-impl local --no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-rope-fusion "
          "--no-persist-layer-norm").split()
MOCK_DATA = ("--tokenizer-type", "NullTokenizer", "--mock-data")
CONVERGENCE_ITERATIONS = 200


@dataclass(frozen=True)
class Shape:
    name: str
    flags: tuple[str, ...]
    tiny: tuple[str, ...]  # the same options at a CPU test's size


def _flags(text: str) -> tuple[str, ...]:
    return tuple(text.split())


LLAMA_BLOCK = "--position-embedding-type rope --rotary-base 500000 --normalization RMSNorm --swiglu " \
              "--disable-bias-linear --untie-embeddings-and-output-weights --group-query-attention"
SHAPES = (
    Shape("llama-1.2b", _flags(
        f"--num-layers 16 --hidden-size 2048 --ffn-hidden-size 8192 --num-attention-heads 32 --num-query-groups 8 "
        f"--kv-channels 64 --seq-length 2048 --max-position-embeddings 2048 {LLAMA_BLOCK} --vocab-size 128000 "
        f"--micro-batch-size 2 --global-batch-size 16"), _flags(
        f"--num-layers 2 --hidden-size 64 --ffn-hidden-size 256 --num-attention-heads 4 --num-query-groups 2 "
        f"--kv-channels 16 --seq-length 64 --max-position-embeddings 64 {LLAMA_BLOCK} --vocab-size 1024 "
        f"--micro-batch-size 2 --global-batch-size 4")),
    Shape("gpt2-1.5b", _flags(
        "--num-layers 48 --hidden-size 1600 --num-attention-heads 16 --seq-length 1024 --max-position-embeddings 1024 "
        "--vocab-size 50257 --micro-batch-size 4 --global-batch-size 16"), _flags(
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 "
        "--vocab-size 1024 --micro-batch-size 2 --global-batch-size 4")),
    # the host-bound row: micro-batch 1, about 1.5 ms of an H200's work each
    Shape("gpt2-124m-mbs1", _flags(
        "--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --max-position-embeddings 1024 "
        "--vocab-size 50257 --micro-batch-size 1 --global-batch-size 8"), _flags(
        "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 "
        "--vocab-size 1024 --micro-batch-size 1 --global-batch-size 4")),
)

FP8 = ("--fp8-format", "hybrid", "--fp8-recipe")
# (name, this project's extra flags, the shapes it runs on); "megatron" is Megatron-LM's own pretrain_gpt.py.
SPEED = (
    ("megatron", (), ("llama-1.2b", "gpt2-1.5b", "gpt2-124m-mbs1")),
    ("eager", (), ("llama-1.2b", "gpt2-1.5b", "gpt2-124m-mbs1")),
    ("compile", ("--compile",), ("llama-1.2b", "gpt2-1.5b", "gpt2-124m-mbs1")),
    ("cuda-graphs", ("--cuda-graph-impl", "local"), ("llama-1.2b", "gpt2-1.5b", "gpt2-124m-mbs1")),
    ("fp8-tensorwise", (*FP8, "tensorwise"), ("llama-1.2b",)),
    ("fp8-tensorwise-compile", (*FP8, "tensorwise", "--compile"), ("llama-1.2b",)),
    ("fp8-delayed-compile", (*FP8, "delayed", "--compile"), ("llama-1.2b",)),
    ("fp8-blockwise-compile", (*FP8, "blockwise", "--compile"), ("llama-1.2b",)),
    # MXFP8's block-scaled GEMMs are Blackwell's; on a Hopper they are emulated K block by K block (docs/fp8.md)
    ("fp8-mxfp8-compile", (*FP8, "mxfp8", "--compile"), ("llama-1.2b",)),
)
# The loss check: 200 iterations of the Llama shape on the embedded corpus (its own tokenizer, so no
# --vocab-size, no mock data), each FP8 recipe against bf16, compiled on both sides.
CONVERGENCE = (
    ("compile", ("--compile",), ("llama-1.2b",)),
    ("fp8-tensorwise-compile", (*FP8, "tensorwise", "--compile"), ("llama-1.2b",)),
    ("fp8-delayed-compile", (*FP8, "delayed", "--compile"), ("llama-1.2b",)),
    ("fp8-blockwise-compile", (*FP8, "blockwise", "--compile"), ("llama-1.2b",)),
)
TABLES = {"speed": SPEED, "convergence": CONVERGENCE}
BASELINE = {"speed": "eager", "convergence": "compile"}


@dataclass(frozen=True)
class Run:
    shape: Shape
    variant: str
    extra: tuple[str, ...]
    table: str = "speed"

    @property
    def name(self) -> str:
        return f"{self.shape.name}/{self.variant}"

    def argv(self, tiny: bool, iterations: int) -> list[str]:
        """The Megatron command line both programs take (ours adds the variant's flags)."""
        extra = () if self.variant == "megatron" else self.extra
        shape = list(self.shape.tiny if tiny else self.shape.flags)
        common = list(COMMON)
        if self.table == "convergence":  # the embedded corpus and its tokenizer; a record every 10 iterations
            common = _without(common, {"--tokenizer-type": 1, "--mock-data": 0, "--log-interval": 1}) + \
                ["--log-interval", "10"]
            shape = _without(shape, {"--vocab-size": 1})
        return [*common, *shape, "--train-iters", str(iterations), *extra]


def _without(argv: list[str], flags: dict) -> list[str]:
    """argv less each flag of `flags` and the number of values it takes."""
    kept, index = [], 0
    while index < len(argv):
        if argv[index] in flags:
            index += 1 + flags[argv[index]]
            continue
        kept.append(argv[index])
        index += 1
    return kept


def plan_runs(shapes: Optional[Sequence[str]] = None, variants: Optional[Sequence[str]] = None,
              table: str = "speed", ordered: Optional[Sequence[str]] = None) -> list[Run]:
    """The table's runs in order: shape by shape, Megatron-LM first, then ours; or `ordered`'s "shape/variant"
    names in their order (a short lease measures what matters most first)."""
    if ordered:
        everything = {run.name: run for run in plan_runs(table=table)}
        unknown = [name for name in ordered if name not in everything]
        if unknown:
            raise ConfigError(f"unknown {', '.join(unknown)}: the {table} table's runs are {', '.join(everything)}")
        return [everything[name] for name in ordered]
    by_name = {shape.name: shape for shape in SHAPES}
    known = [variant for variant, _, _ in TABLES[table]]
    unknown = [name for name in shapes or () if name not in by_name] + \
              [name for name in variants or () if name not in known]
    if unknown:
        raise ConfigError(f"unknown {', '.join(unknown)}: the shapes are {', '.join(by_name)}; the {table} table's "
                          f"runs {', '.join(known)}")
    return [Run(by_name[shape], variant, extra, table)
            for shape in (shapes or by_name) for variant, extra, on in TABLES[table]
            if shape in on and (not variants or variant in variants)]


# ---- reading what a run wrote --------------------------------------------------------------------------------

_MEMORY_LINE = re.compile(r"memory after iteration \d+: predicted peak ([0-9.]+) MiB .*?measured (-?[0-9.]+) MiB")
_MEGATRON_ITERATION = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
_MEGATRON_MEMORY = re.compile(r"max allocated: ([0-9.]+)")
_MEGATRON_LOSS = re.compile(r"lm loss: ([0-9.E+-]+)")
_MEGATRON_TFLOPS = re.compile(r"throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+)")


def summarize_metrics(records: list[dict], skip: int) -> dict:
    """The step figures of one of our runs from its metrics records: medians over the iterations after `skip`."""
    steps = [record for record in records if "iter_time_s" in record]
    timed = [record for record in steps if record["iteration"] > skip] or steps[-1:]
    if not timed:
        return {}

    def median(key: str) -> Optional[float]:
        values = [record[key] for record in timed if record.get(key) is not None]
        return statistics.median(values) if values else None

    return {"ms_per_iteration": 1000 * median("iter_time_s"), "iterations_timed": len(timed),
            "tokens_per_s": median("tokens_per_s"), "tflops_per_gpu": median("tflops_per_gpu"), "mfu": median("mfu"),
            "loss_last": steps[-1].get("loss"), "iterations": steps[-1]["iteration"]}


def memory_figures(log: str) -> dict:
    """The planner's predicted peak and the measured one from the start-up check's line (training/metrics.py)."""
    found = _MEMORY_LINE.search(log)
    if not found:
        return {}
    predicted, measured = float(found.group(1)), float(found.group(2))
    return {"predicted_peak_mib": predicted, "measured_peak_mib": measured,
            "predicted_over_measured": predicted / measured if measured > 0 else None}


def summarize_megatron(log: str, skip: int) -> dict:
    """Megatron-LM's own log at --log-interval 1 (megatron/training/training.py training_log): each iteration's
    elapsed ms and TFLOP/s, its loss, and the max allocated of its last memory report (utils.py report_memory, after
    iterations 1 and 2: the second holds the optimizer's states)."""
    times = [float(ms) for ms in _MEGATRON_ITERATION.findall(log)]
    if not times:
        return {}
    timed = times[skip:] or times[-1:]
    tflops = [float(value) for value in _MEGATRON_TFLOPS.findall(log)][skip:]
    losses = _MEGATRON_LOSS.findall(log)
    memory = _MEGATRON_MEMORY.findall(log)
    return {"ms_per_iteration": statistics.median(timed), "iterations_timed": len(timed), "iterations": len(times),
            "tflops_per_gpu": statistics.median(tflops) if tflops else None,
            "loss_last": float(losses[-1]) if losses else None,
            **({"measured_peak_mib": float(memory[-1])} if memory else {})}


NOTED = ("CUDA graph", "captured", "FP8", "compile", "nothing captured")


def startup_notes(log: str) -> list[str]:
    """The run's own lines on what it did with the variant's flags (graphs captured or not, FP8's kernels, the
    compiler), so a row that ran eagerly where it was asked for graphs says so beside its time."""
    return [line.strip()[:300] for line in log.splitlines()
            if line.lstrip().startswith(">") and any(word in line for word in NOTED)]


def last_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"error|Error|refused|Traceback", line)]
    return (errors or lines or ["(no output)"])[-1][:400]


# ---- running ---------------------------------------------------------------------------------------------------

def run_ours(run: Run, args, scratch: Path, data_cache: Path) -> dict:
    metrics = scratch / "metrics.jsonl"
    argv = [sys.executable, str(REPO_ROOT / "pretrain_gpt.py"), "--device", args.device,
            *run.argv(args.tiny, args.iterations), "--metrics-file", str(metrics), "--data-cache-dir",
            str(data_cache)]
    result = _launch(argv, args.timeout_s, cwd=scratch, env={})
    (scratch / "output.log").write_text(result["log"], encoding="utf-8")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line] if metrics.exists() else []
    figures = {**summarize_metrics(records, args.skip), **memory_figures(result["log"])}
    return {**_outcome(result, argv), **figures, "notes": startup_notes(result["log"])}


def run_megatron(run: Run, args, scratch: Path, kit: Optional["MegatronKit"]) -> dict:
    if kit is None:
        return {"skipped": f"no Megatron-LM kit at {args.megatron_kit} (see the script's docstring)"}
    argv = kit.command(run.argv(args.tiny, args.iterations))
    result = _launch(argv, args.timeout_s, cwd=scratch, env=kit.environment())
    if result["rc"] != 0:  # Megatron's jit bias fusions are its one GPU-only default path: once more without them
        retry = kit.command([*run.argv(args.tiny, args.iterations), "--no-bias-gelu-fusion",
                             "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion"])
        first_error = last_error(result["log"])
        result, argv = _launch(retry, args.timeout_s, cwd=scratch, env=kit.environment()), retry
        result["first_try_error"] = first_error
    (scratch / "output.log").write_text(result["log"], encoding="utf-8")
    return {**_outcome(result, argv), **summarize_megatron(result["log"], args.skip),
            **({"first_try_error": result["first_try_error"]} if "first_try_error" in result else {})}


def _launch(argv: list[str], timeout_s: float, cwd: Path, env: dict) -> dict:
    started = time.perf_counter()
    environment = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1",
                   **env}
    try:
        done = subprocess.run(argv, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout_s)
        rc, log = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        rc, log = 124, _text(expired.stdout) + _text(expired.stderr) + f"\ntimed out after {timeout_s:g} s"
    return {"rc": rc, "log": log, "wall_s": time.perf_counter() - started}


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _outcome(result: dict, argv: list[str]) -> dict:
    outcome = {"rc": result["rc"], "wall_s": round(result["wall_s"], 1), "command": shlex.join(argv)}
    if result["rc"] != 0:
        outcome["error"] = last_error(result["log"])
    return outcome


class MegatronKit:
    """Megatron-LM core_v0.16.1 unpacked with its wheels into a scratch folder, run through the kit's launcher."""

    def __init__(self, kit: Path, wheels: Path, scratch: Path) -> None:
        self.launcher = kit / "mlm_gpu.py"
        self.site, self.tree = scratch / "site", scratch / "megatron-lm"
        self.tree.mkdir(parents=True)
        shutil.unpack_archive(str(kit / "megatron-lm-core_v0.16.1-min.tar.xz"), str(self.tree))
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(self.site), *map(str, sorted(wheels.glob("*.whl")))], check=True)

    @classmethod
    def found(cls, kit: Path, wheels: Path, scratch: Path) -> Optional["MegatronKit"]:
        if not (kit / "mlm_gpu.py").exists() or not any(wheels.glob("megatron_core-*.whl")):
            return None
        return cls(kit, wheels, scratch)

    def environment(self) -> dict:
        return {"PYTHONPATH": f"{self.site}{os.pathsep}{self.tree}", "MEGATRON_LM": str(self.tree)}

    def command(self, argv: list[str]) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                str(self.launcher), *argv]


def add_ratios(rows: list[dict], baseline: str) -> None:
    """Each row's step time over its shape's Megatron-LM row and over its shape's `baseline` row (>1: slower), and
    its last loss relative to the baseline's."""
    by_shape: dict = {}
    for row in rows:
        by_shape.setdefault(row["shape"], {})[row["variant"]] = row
    for row in rows:
        for label, key, variant in (("ms_over_megatron", "ms_per_iteration", "megatron"),
                                    ("ms_over_baseline", "ms_per_iteration", baseline),
                                    ("loss_over_baseline", "loss_last", baseline)):
            other = by_shape[row["shape"]].get(variant, {}).get(key)
            if row.get(key) and other and row["variant"] != variant:
                row[label] = row[key] / other


def environment_facts(device: str) -> dict:
    import torch

    facts = {"torch": torch.__version__, "python": sys.version.split()[0], "load_average": os.getloadavg(),
             "commit": _git("rev-parse", "HEAD"), "uncommitted_changes": bool(_git("status", "--porcelain")),
             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if device == "cuda" and torch.cuda.is_available():
        facts["device"] = torch.cuda.get_device_name()
        facts["device_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    else:
        facts["device"] = f"cpu ({os.cpu_count()} cores)"
    return facts


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def markdown_table(rows: list[dict], baseline: str) -> str:
    lines = [f"| shape | run | ms / iteration | over Megatron-LM (torch-only) | over {baseline} | MFU | last loss | "
             f"loss over {baseline} | predicted / measured peak |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        def cell(key: str, form: str) -> str:
            value = row.get(key)
            return form.format(value) if value is not None else ""
        status = row.get("skipped") or (f"failed ({row['rc']}): {row.get('error', '')}" if row.get("rc") else "")
        lines.append(f"| {row['shape']} | {row['variant']} | {cell('ms_per_iteration', '{:.1f}') or status} | "
                     f"{cell('ms_over_megatron', '{:.2f}x')} | {cell('ms_over_baseline', '{:.2f}x')} | "
                     f"{cell('mfu', '{:.1%}')} | {cell('loss_last', '{:.4f}')} | {cell('loss_over_baseline', '{:.4f}')} | "
                     f"{cell('predicted_over_measured', '{:.2f}')} |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineArgumentParser(prog="scripts/bench/gpu_side_by_side.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=None, help="write every run's figures as JSON here")
    parser.add_argument("--only", default=None, help="comma list of shapes (default: all)")
    parser.add_argument("--variants", default=None, help="comma list of runs per shape (default: all)")
    parser.add_argument("--runs", default=None, help="comma list of shape/variant, run in this order (instead of "
                        "--only/--variants)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="2-layer models: the same runs on a CPU, for the tests")
    parser.add_argument("--table", choices=tuple(TABLES), default="speed",
                        help=f"speed: every run's step time; convergence: {CONVERGENCE_ITERATIONS} iterations on the "
                             f"embedded corpus, FP8 against bf16")
    parser.add_argument("--iterations", type=int, default=None,
                        help=f"default: 12 (speed), {CONVERGENCE_ITERATIONS} (convergence)")
    parser.add_argument("--skip", type=int, default=4, help="iterations not timed (compile, capture, warm-up)")
    parser.add_argument("--timeout-s", type=float, default=150.0, help="per run")
    parser.add_argument("--budget-s", type=float, default=450.0, help="no run starts after this much wall time")
    parser.add_argument("--megatron-kit", default=str(REPO_ROOT / ".gpu" / "sbs"))
    parser.add_argument("--wheels", default=str(REPO_ROOT / ".gpu" / "whl"))
    parser.add_argument("--logs", default=None,
                        help="keep each run's output and metrics in a folder of its own here (default: discarded)")
    parser.add_argument("--list", action="store_true", help="print the runs' command lines and stop")
    args = parser.parse_args(argv)
    if args.iterations is None:
        args.iterations = CONVERGENCE_ITERATIONS if args.table == "convergence" else 12
    runs = plan_runs(args.only.split(",") if args.only else None, args.variants.split(",") if args.variants else None,
                     args.table, args.runs.split(",") if args.runs else None)
    if args.list:
        for run in runs:
            print(f"{run.name}: {'megatron-lm ' if run.variant == 'megatron' else 'pretrain_gpt.py '}"
                  f"{shlex.join(run.argv(args.tiny, args.iterations))}")
        return 0
    began = time.perf_counter()
    report = {**environment_facts(args.device), "table": args.table, "iterations": args.iterations, "skip": args.skip,
              "rows": []}
    with tempfile.TemporaryDirectory(prefix="side-by-side-") as scratch_root:
        scratch = Path(scratch_root)
        kit = MegatronKit.found(Path(args.megatron_kit), Path(args.wheels), scratch / "kit") \
            if any(run.variant == "megatron" for run in runs) else None
        for index, run in enumerate(runs):
            row = {"shape": run.shape.name, "variant": run.variant}
            if time.perf_counter() - began > args.budget_s:
                row["skipped"] = f"--budget-s {args.budget_s:g} spent"
            else:
                work = (Path(args.logs) if args.logs else scratch) / f"{index:02d}-{run.shape.name}-{run.variant}"
                work.mkdir(parents=True)
                row.update(run_megatron(run, args, work, kit) if run.variant == "megatron" else
                           run_ours(run, args, work, scratch / "data-cache"))
            report["rows"].append(row)
            print(f"{run.name}: {json.dumps({k: v for k, v in row.items() if k != 'command'})}", flush=True)
            if args.output:  # as it goes: a call cut short keeps what it measured
                _write(args.output, report)
    add_ratios(report["rows"], BASELINE[args.table])
    report["wall_s"] = round(time.perf_counter() - began, 1)
    if args.output:
        _write(args.output, report)
    print(markdown_table(report["rows"], BASELINE[args.table]))
    return 0


def _write(path: str, report: dict) -> None:
    Path(path).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(run_tool("scripts/bench/gpu_side_by_side.py", main, (ConfigError,)))
