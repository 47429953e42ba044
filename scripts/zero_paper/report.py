#!/usr/bin/env python
"""The ZeRO paper's Figures 2-8 and a Markdown report, from real runs where they exist and from the
planner and the performance model everywhere.

    python scripts/zero_paper/report.py --output-dir DIR [--runs RUNS_DIR ...]

Writes DIR/fig2.png ... fig8.png and DIR/report.md: every point predicted, measured where a run exists, beside the
paper's values and compare.py's profiles side by side (--no-compare leaves them out). Dry runs are cached: a first
report takes tens of minutes, a later one seconds. Every input is checked before anything is written."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE)]

import figures  # noqa: E402
import report_tables  # noqa: E402
from arguments.config import ConfigError  # noqa: E402
from arguments.parser import parse_config  # noqa: E402
from base.errors import OneLineArgumentParser, run_tool  # noqa: E402
from base.input_files import check_input_directory, read_json_file  # noqa: E402
from checkpoint.output_paths import check_output_directory, prepare_output_directory  # noqa: E402
from experiments import DEFINITION_DIR, FIGURES, GPT2_VOCAB, PROFILES, REPO_ROOT, Point, load_points, portable_argv  # noqa: E402
from measurements import Measured, read_runs  # noqa: E402
from mini_analysis import cpu_source, layers_in_c1_budget, memory_by_configuration  # noqa: E402
from planner.dry_run import RankPlan  # noqa: E402
from planner.perf_model import Prediction  # noqa: E402
from planner.plan import CONFIGURATIONS, largest_layers  # noqa: E402
from planning import Planner, default_cache_dir  # noqa: E402

MINI_REPRODUCTION = REPO_ROOT / "docs" / "zero-paper" / "mini-reproduction.json"
OUTPUTS = ("report.md",) + tuple(f"{figure}.png" for figure in FIGURES)


@dataclass
class PointResult:
    point: Point
    plan: RankPlan
    prediction: Prediction
    measured: Optional[Measured]


def point_results(figure: str, profiles: Sequence[str], planner: Planner, runs: dict, directory: Path,
                  progress) -> dict[str, list[PointResult]]:
    results = {}
    for profile in profiles:
        rows = []
        for point in load_points(figure, profile, directory):
            progress(f"  {point.name}")
            plan = planner.plan(point)
            rows.append(PointResult(point, plan, planner.predict(point, plan),
                                    runs.get((figure, profile, point.point))))
        results[profile] = rows
    return results


def largest_model(planner: Planner, point: Point, configuration: Optional[dict]) -> int:
    """Parameters of the largest model of `point`'s shape (hidden, heads, grid, batch) the planner
    fits, under `configuration` (a C1-C5 of planner.plan.CONFIGURATIONS) or the point's own settings."""
    config = parse_config(point.pretrain_argv())
    layers, plan = largest_layers(config, point.cluster(), GPT2_VOCAB, configuration, plan_run=planner.plan_config)
    return plan.parameters_total if plan is not None else 0


def fig4_max_sizes(rows_by_profile: dict, planner: Planner) -> tuple[dict[tuple[str, str], int], dict]:
    """Without MP, at micro batch 1: per profile and series (zero, ddp), the largest model of the shape
    of its widest point, and that model's (parameters, predicted TFLOP/s per GPU): Figure 4 draws it
    beside the points and its table lists it (the paper's DDP "1.4B ... less than 20 TFlops")."""
    sizes, searched = {}, {}
    for profile, rows in rows_by_profile.items():
        for series in ("zero", "ddp"):
            candidates = [r.point for r in rows if r.point.series == series]
            if candidates:
                widest = max(candidates, key=lambda p: (p.hidden, p.layers)).with_micro_batch(1)
                config = parse_config(widest.pretrain_argv())
                layers, plan = largest_layers(config, widest.cluster(), GPT2_VOCAB, None, plan_run=planner.plan_config)
                sizes[(profile, series)] = plan.parameters_total if plan is not None else 0
                if plan is not None:
                    prediction = planner.predict_depth(widest, plan, layers)
                    searched[(profile, series)] = (plan.parameters_total, prediction.hardware_tflops_per_gpu)
    return sizes, searched


def fig8_largest_batch(rows_by_profile: dict, planner: Planner) -> dict[str, list[PointResult]]:
    """Figure 8 as the paper ran it: each point at the largest micro batch the planner fits (what a
    configuration's freed memory buys), with its predicted throughput; a point that fits no micro batch
    with the headroom is planned at 1, where its table row says whether it fits at all."""
    results = {}
    for profile, rows in rows_by_profile.items():
        results[profile] = []
        for row in rows:
            largest = planner.largest_micro_batch(row.point)
            point = row.point.with_micro_batch(largest or 1)
            plan = planner.plan(point)
            results[profile].append(PointResult(point, plan, planner.predict(point, plan), None))
    return results


def fig6_max_sizes(rows_by_profile: dict, planner: Planner) -> dict[tuple[str, str], int]:
    sizes = {}
    for profile, rows in rows_by_profile.items():
        for name, configuration in CONFIGURATIONS.items():
            points = [r.point for r in rows if r.point.series == name]
            if points:
                sizes[(profile, name)] = largest_model(planner, points[0], configuration)
    return sizes


def measured_largest(rows_by_profile: dict) -> dict[tuple[str, str], int]:
    """Per profile and configuration, the largest model whose run completed."""
    found = {}
    for profile, rows in rows_by_profile.items():
        for row in rows:
            if row.measured is not None and row.measured.completed:
                key = (profile, row.point.series)
                found[key] = max(found.get(key, 0), row.plan.parameters_total)
    return found


def build_parser() -> OneLineArgumentParser:
    p = OneLineArgumentParser(prog="scripts/zero_paper/report.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", required=True)
    p.add_argument("--runs", nargs="+", default=[], metavar="RUNS_DIR", help="directories holding run.py's runs")
    p.add_argument("--figures", nargs="+", choices=FIGURES, default=list(FIGURES))
    p.add_argument("--profiles", nargs="+", choices=tuple(PROFILES), default=list(PROFILES))
    p.add_argument("--definitions", default=str(DEFINITION_DIR), help="a folder of figN.dat files")
    p.add_argument("--mini-reproduction", default=None,
                   help=f"mini_reproduction.py's JSON (default: {MINI_REPRODUCTION.relative_to(REPO_ROOT)}, "
                        f"skipped when absent; a path given must exist)")
    p.add_argument("--no-cache", action="store_true", help="plan every point afresh")
    p.add_argument("--no-compare", action="store_true",
                   help="leave out the paper's stated values under dgx2 and dgx2-2019 side by side (compare.py, "
                        "which adds Table 2's and Figure 6's searches)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier report in --output-dir")
    p.add_argument("--quiet", action="store_true")
    return p


def read_mini_reproduction(path: Optional[str]) -> tuple[Optional[dict], Optional[dict]]:
    """(the summary, its memory by configuration) of --mini-reproduction, or (None, None) when none
    was given and the committed one is absent. Everything the report reads of it is read here, so a
    file of another shape is one line now rather than a traceback after the planning."""
    if path is None:
        if not MINI_REPRODUCTION.is_file():
            return None, None
        path = str(MINI_REPRODUCTION)
    what = "mini_reproduction.py's JSON"
    summary = read_json_file(path, "--mini-reproduction", what=what)
    try:
        memory = memory_by_configuration(summary)
        report_tables.mini_section(memory, summary)  # reads every key and figure the report uses
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as error:
        raise ConfigError(f"--mini-reproduction {path}: not {what} ({type(error).__name__}: {error}); "
                          f"write it with scripts/zero_paper/mini_reproduction.py") from None
    return summary, memory


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    output = Path(args.output_dir)
    # Every input before any output: a typo'd --runs or a broken JSON must not leave an empty
    # report directory (or a planner-only report) behind.
    for directory in args.runs:
        check_input_directory(directory, "--runs")
    definitions = check_input_directory(args.definitions, "--definitions")
    for figure in args.figures:
        for profile in args.profiles:
            load_points(figure, profile, definitions)
    mini, memory = read_mini_reproduction(args.mini_reproduction)
    runs = read_runs(args.runs)
    check_output_directory(output, "--output-dir")
    existing = [name for name in OUTPUTS if (output / name).exists()]
    if existing and not args.overwrite:
        raise ConfigError(f"{output} already holds {', '.join(existing)}; pass --overwrite to replace them")
    prepare_output_directory(output, "--output-dir")
    progress = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    planner = Planner(None if args.no_cache else default_cache_dir())
    results = {}
    for figure in args.figures:
        progress(f"{figure}:")
        results[figure] = point_results(figure, args.profiles, planner, runs, definitions, progress)
    extras = {}
    if "fig2" in results:
        figures.plot_fig2(results["fig2"], output / "fig2.png")
    if "fig3" in results:
        figures.plot_fig3(results["fig3"], output / "fig3.png")
    if "fig4" in results:
        progress("fig4: the largest model without MP (planner search)")
        extras["fig4"], extras["fig4_searched"] = fig4_max_sizes(results["fig4"], planner)
        extras["fig4_ddp_searched"] = {p: found for (p, series), found in extras["fig4_searched"].items()
                                       if series == "ddp"}
        figures.plot_fig4(results["fig4"], extras["fig4"], extras["fig4_searched"], output / "fig4.png")
    if "fig6" in results:
        progress("fig6: the largest model per configuration (planner search)")
        extras["fig6"] = fig6_max_sizes(results["fig6"], planner)
        extras["fig6_measured"] = measured_largest(results["fig6"])
        points = [r.point for rows in results["fig6"].values() for r in rows]
        setting = (f"{'/'.join(sorted({str(p.world_size) for p in points}))} GPUs, MP "
                   f"{'/'.join(sorted({str(p.mp) for p in points}))} (in a node), micro batch "
                   f"{'/'.join(sorted({str(p.micro_batch) for p in points}))}")
        figures.plot_fig6(extras["fig6"], extras["fig6_measured"],
                          layers_in_c1_budget(memory) if memory else None, setting, output / "fig6.png",
                          cpu_source(mini) if mini else None)
    if "fig7" in results:
        figures.plot_fig7(results["fig7"], memory, output / "fig7.png", cpu_source(mini) if mini else None)
    if "fig8" in results:
        progress("fig8: the largest micro batch of each point (planner)")
        extras["fig8_largest_batch"] = fig8_largest_batch(results["fig8"], planner)
        figures.plot_fig8(results["fig8"], extras["fig8_largest_batch"], output / "fig8.png")
    compared = {}
    if not args.no_compare and "dgx2" in args.profiles:
        import compare  # it imports this module's helpers' neighbours; loaded only when it is used

        for name in compare.PROFILE_CONDITIONS:
            progress(f"the paper's stated values under {name} (compare.py)")
            compared[name] = compare.compare(compare.make_profile(name, None if args.no_cache else default_cache_dir()),
                                             progress, definitions)
    text = report_tables.report(results, extras, memory, mini, runs, portable_argv(argv if argv is not None else sys.argv[1:]),
                                compared)
    (output / "report.md").write_text(text, encoding="utf-8")
    print(f"wrote {output / 'report.md'} and {len(results)} figures ({len(runs)} measured runs)")
    return 0


def command(argv: Optional[Sequence[str]] = None) -> int:
    """`main` behind the entry-point boundary: what running this file does."""
    return run_tool("scripts/zero_paper/report.py", lambda: main(argv), (ConfigError,))


if __name__ == "__main__":
    sys.exit(command())
