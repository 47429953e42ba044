#!/usr/bin/env python
"""The launch commands for one of the ZeRO paper's figures, or what the planner says about them.

    python scripts/zero_paper/run.py fig2 --profile dgx2                  # print one sbatch command per point
    python scripts/zero_paper/run.py fig3 --profile h100 --launcher torchrun   # run on every node instead
    python scripts/zero_paper/run.py fig8 --profile dgx2 --dry-run [--largest-batch]

Each point runs pretrain_gpt.py into RUNS_DIR/PROFILE/FIGURE/POINT/ (metrics.jsonl, launch.json), logging to W&B;
its parser checks every command first. --dry-run prints each point's planned memory and throughput."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE)]  # the repo's packages, and this folder's modules

from arguments.config import ConfigError  # noqa: E402
from arguments.parser import parse_config  # noqa: E402
from base.errors import OneLineArgumentParser, run_tool  # noqa: E402
from base.input_files import check_input_directory  # noqa: E402
from checkpoint.output_paths import check_output_directory  # noqa: E402
from experiments import DEFINITION_DIR, FIGURES, GPT2_VOCAB, PROFILES, REPO_ROOT, Point, load_points  # noqa: E402
from planner.paper_tables import format_parameters  # noqa: E402
from zero.memory import format_bytes  # noqa: E402

LAUNCH_FILE = "launch.json"
DATA_VARIABLES = {"data_path": "DATA_PATH", "vocab_file": "VOCAB_FILE", "merge_file": "MERGE_FILE"}


def build_parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(prog="scripts/zero_paper/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("figure", choices=FIGURES)
    p.add_argument("--profile", choices=tuple(PROFILES), required=True)
    p.add_argument("--dry-run", action="store_true", help="plan every point; launch and write nothing")
    p.add_argument("--largest-batch", action="store_true", help="with --dry-run: the largest micro batch that fits")
    p.add_argument("--points", nargs="+", metavar="POINT", help="only these points (default: all)")
    p.add_argument("--launcher", choices=("slurm", "torchrun"), default="slurm")
    p.add_argument("--submit", action="store_true", help="sbatch every command instead of printing it")
    p.add_argument("--runs-dir", default=str(REPO_ROOT / "runs" / "zero_paper"))
    p.add_argument("--wandb-project", default="zero-paper")
    p.add_argument("--data-path", help="a dataset prefix prepared with GPT-2's BPE (default: $DATA_PATH)")
    p.add_argument("--vocab-file", help="GPT-2's vocab.json (default: $VOCAB_FILE)")
    p.add_argument("--merge-file", help="GPT-2's merges.txt (default: $MERGE_FILE)")
    p.add_argument("--overwrite", action="store_true", help="replace a launch.json that describes another run")
    p.add_argument("--definitions", default=str(DEFINITION_DIR), help="a folder of figN.dat files (default: ours)")
    return p


def selected_points(figure: str, profile: str, names: Optional[Sequence[str]], directory: Path) -> list[Point]:
    points = load_points(figure, profile, directory)
    if names:
        known = {p.point for p in points}
        unknown = [name for name in names if name not in known]
        if unknown:
            raise ConfigError(f"--points: {', '.join(unknown)} not in {figure} for {profile} "
                              f"(points: {', '.join(sorted(known))})")
        points = [p for p in points if p.point in names]
    return points


def run_directory(runs_dir: str, point: Point) -> Path:
    return Path(runs_dir).resolve() / point.profile / point.figure / point.point


def data_flags(args) -> list[str]:
    """The data and tokenizer flags: given values, or the shell variables that hold them."""
    flags = []
    for name, variable in DATA_VARIABLES.items():
        value = getattr(args, name) or f"${variable}"
        flags += [f"--{name.replace('_', '-')}", value]
    return flags


def launch_command(point: Point, args, extra: Sequence[str]) -> tuple[dict[str, str], list[str], list[str]]:
    """(environment, command, pretrain_gpt.py flags) for one point under the chosen launcher."""
    directory = run_directory(args.runs_dir, point)
    pretrain = point.pretrain_argv(str(directory / "metrics.jsonl"), tuple(data_flags(args)) + tuple(extra))
    pretrain += ["--wandb-project", args.wandb_project, "--wandb-run-name", point.name]
    env = {"WANDB_RUN_GROUP": f"zero-paper-{point.figure}-{point.profile}",
           "WANDB_TAGS": ",".join(("zero-paper", point.figure, point.profile, point.series, point.point))}
    if args.launcher == "slurm":
        env["TP"] = str(point.mp)  # the batch script's default TP, which --tensor-model-parallel-size also sets
        command = ["sbatch", "--nodes", str(point.nodes), "--ntasks-per-node", str(point.gpus_per_node),
                   "--gpus-per-node", str(point.gpus_per_node), "--job-name", f"zp-{point.name}",
                   "--output", str(directory / "slurm-%j.out"), str(REPO_ROOT / "scripts" / "slurm_dgx2.sbatch")]
    elif point.nodes == 1:
        env["GPUS_PER_NODE"] = str(point.gpus_per_node)
        command = [str(REPO_ROOT / "scripts" / "launch_single_node.sh")]
    else:  # the same command on every node, each with its NODE_RANK
        env.update(NNODES=str(point.nodes), GPUS_PER_NODE=str(point.gpus_per_node), NODE_RANK="$NODE_RANK",
                   MASTER_ADDR="$MASTER_ADDR")
        command = [str(REPO_ROOT / "scripts" / "launch_multi_node.sh")]
    return env, command + pretrain, pretrain


def shell_line(env: dict[str, str], command: Sequence[str]) -> str:
    """A line a shell runs as meant: values that are shell variables stay expandable ("$DATA_PATH")."""
    def word(text: str) -> str:
        return f'"{text}"' if text.startswith("$") else shlex.quote(text)
    return " ".join([f"{name}={word(value)}" for name, value in env.items()] + [word(part) for part in command])


def launch_record(point: Point, pretrain: Sequence[str]) -> dict:
    return {"figure": point.figure, "profile": point.profile, "point": point.point, "series": point.series,
            "argv": list(pretrain), "world_size": point.world_size, "gpus_per_node": point.gpus_per_node,
            "vocab_size": GPT2_VOCAB}


def launch_file_is_current(directory: Path, record: dict, overwrite: bool) -> bool:
    """Whether `directory`'s launch file already says `record` (nothing to write); a launch file of
    another run there is an error unless --overwrite."""
    path = directory / LAUNCH_FILE
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path} is not a regular file; remove it, or choose another --runs-dir")
    if not path.is_file() or overwrite:
        return False
    try:
        existing = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        existing = None
    if existing != record:
        raise ConfigError(f"{path} describes another run; pass --overwrite to replace it, or --runs-dir elsewhere")
    return True


def write_launch_file(directory: Path, record: dict, overwrite: bool) -> None:
    """Say what runs in `directory`; a launch file of another run there is kept unless --overwrite."""
    if launch_file_is_current(directory, record, overwrite):
        return
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LAUNCH_FILE
    temporary = path.with_name(f".{LAUNCH_FILE}.tmp-{os.getpid()}")
    temporary.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def describe(point: Point) -> str:
    return (f"{point.nodes} x {point.gpus_per_node} GPUs, MP {point.mp}, {point.layers} x {point.hidden}, "
            f"micro batch {point.micro_batch} (global {point.global_batch}), stage {point.zero_stage}"
            + (", P_a" if point.pa else "") + (", P_a+cpu" if point.pa_cpu else "") + (", M_D" if point.md else ""))


def check_pretrain_flags(point: Point, pretrain: Sequence[str], extra: Sequence[str]) -> None:
    """The command's flags as pretrain_gpt.py will read them: its parser and its checks (the data and
    tokenizer paths are names on the cluster, not read here)."""
    try:
        parse_config(list(pretrain))
    except ConfigError as error:
        after = f" (flags after --: {' '.join(extra)})" if extra else ""
        raise ConfigError(f"pretrain_gpt.py would refuse {point.name}'s command{after}: {error}") from None


def print_or_submit(points: Sequence[Point], args, extra: Sequence[str]) -> int:
    if args.submit:
        if args.launcher != "slurm":
            raise ConfigError("--submit needs --launcher slurm (a torchrun job is started on every node)")
        if shutil.which("sbatch") is None:
            raise ConfigError("--submit: sbatch is not on PATH (print the commands and run them where it is)")
        missing = [f"--{name.replace('_', '-')}" for name, variable in DATA_VARIABLES.items()
                   if not getattr(args, name) and not os.environ.get(variable)]
        if missing:
            raise ConfigError(f"--submit needs {', '.join(missing)} (or the variables ${', $'.join(DATA_VARIABLES.values())})")
    check_output_directory(args.runs_dir, "--runs-dir")
    # Every command is checked, and every launch file it would replace, before the first is printed,
    # written or submitted: a bad flag or another run's directory stops the whole figure, not half of it.
    launches = []
    for point in points:
        env, command, pretrain = launch_command(point, args, extra)
        check_pretrain_flags(point, pretrain, extra)
        launch_file_is_current(run_directory(args.runs_dir, point), launch_record(point, pretrain), args.overwrite)
        launches.append((point, env, command, pretrain))
    for point, env, command, pretrain in launches:
        write_launch_file(run_directory(args.runs_dir, point), launch_record(point, pretrain), args.overwrite)
        print(f"# {point.name}: {describe(point)}")
        if args.submit:
            resolved = {name: os.path.expandvars(value) for name, value in env.items()}
            subprocess.run([os.path.expandvars(part) for part in command], env={**os.environ, **resolved}, check=True)
        else:
            print(shell_line(env, command))
    print(f"# launch files: {Path(args.runs_dir).resolve() / args.profile / args.figure}/*/{LAUNCH_FILE}; "
          f"afterwards: python scripts/zero_paper/report.py --output-dir DIR --runs {Path(args.runs_dir).resolve()}")
    return 0


def dry_run_points(points: Sequence[Point], largest_batch: bool) -> int:
    from planning import Planner, default_cache_dir

    planner = Planner(default_cache_dir())
    header = "| point | parameters | grid | micro / global batch | per-GPU peak | GPU | verdict | predicted TFLOP/s per GPU |"
    rule = "|---|---:|---|---:|---:|---:|---|---:|"
    if largest_batch:
        header, rule = header + " largest micro batch (90% of the GPU) |", rule + "---:|"
    print(header)
    print(rule)
    not_fitting = []
    for point in points:
        plan = planner.plan(point)
        prediction = planner.predict(point, plan)
        verdict = "fits" if plan.fits else "does NOT fit"
        if not plan.fits:
            not_fitting.append(point.point)
        row = (f"| {point.point} | {format_parameters(plan.parameters_total)} | {point.nodes} x {point.gpus_per_node}, "
               f"MP {point.mp} | {point.micro_batch} / {point.global_batch} | {format_bytes(plan.total_bytes)} | "
               f"{format_bytes(plan.budget_bytes)} | {verdict} | "
               f"{prediction.hardware_tflops_per_gpu:.1f} (model FLOPs {prediction.model_tflops_per_gpu:.1f}) |")
        if largest_batch:
            largest = planner.largest_micro_batch(point)
            row += f" {largest if largest is not None else 'none'} |"
        print(row, flush=True)
    print(f"{len(points)} points; " + (f"{len(not_fitting)} will not fit: {', '.join(not_fitting)}" if not_fitting
                                       else "every one fits") + ". Per-GPU peak: the planner's, before what a dry run "
          "cannot see (CUDA context, NCCL buffers, fragmentation). TFLOP/s count the recompute (hardware FLOPs).")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = build_parser().parse_args(own)
    if args.largest_batch and not args.dry_run:
        raise ConfigError("--largest-batch goes with --dry-run")
    if args.dry_run and extra:
        raise ConfigError(f"--dry-run plans the points as defined, so the flags after -- ({' '.join(extra)}) would "
                          f"not be planned; drop them, or edit the definition (--definitions)")
    definitions = check_input_directory(args.definitions, "--definitions")
    points = selected_points(args.figure, args.profile, args.points, definitions)
    if args.dry_run:
        return dry_run_points(points, args.largest_batch)
    return print_or_submit(points, args, extra)


def command(argv: Optional[Sequence[str]] = None) -> int:
    """`main` behind the entry-point boundary: what running this file does."""
    return run_tool("scripts/zero_paper/run.py", lambda: main(argv), (ConfigError,))


if __name__ == "__main__":
    sys.exit(command())
