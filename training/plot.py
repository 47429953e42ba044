"""`python -m training.plot runs/RUN_ID/metrics.jsonl -o runs/RUN_ID/curves.png`: a run's curves as one PNG (loss,
learning rate, tokens/s, TFLOP/s per GPU), one line per run labelled by the flags that tell runs apart. matplotlib is
imported only in `draw`: it is slow to import."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from base.errors import ConfigError, OneLineArgumentParser, run_tool
from base.input_files import check_input_file
from training.run_commands import distinguishing_flags, read_commands

PROGRAM = "training.plot"
FIGURE_INCHES = (12.0, 8.0)
DOTS_PER_INCH = 100  # so the PNG is 1200 x 800 pixels
# (record key, panel title, y-axis label) of the panels below the loss.
TRAINING_PANELS = (("lr", "learning rate", "learning rate"), ("tokens_per_s", "throughput", "tokens/s"),
                   ("tflops_per_gpu", "throughput per GPU", "TFLOP/s per GPU"))


@dataclass
class Series:
    """One run's records in one file."""
    label: str
    flags: Optional[list[str]] = None
    training: list[dict] = field(default_factory=list)
    evaluations: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # split -> (iteration, loss)

    def points(self, key: str) -> tuple[list[int], list[float]]:
        rows = [(r["iteration"], r[key]) for r in self.training if _is_number(r.get(key))]
        return [i for i, _ in rows], [v for _, v in rows]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cut_short(line: str) -> bool:
    """A record a kill cut short."""
    return line.startswith("{") and not line.endswith("}")


def read_series(path: str, notes: list[str]) -> list[Series]:
    """The runs of one metrics file, in the order their first records appear."""
    check_input_file(path, "metrics file", max_bytes=None, fix="give a metrics.jsonl that a training run wrote")
    by_run: dict[Optional[str], Series] = {}
    skipped = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                if _cut_short(line):
                    skipped.append(number)
                    continue
                raise ConfigError(f"{path}, line {number}: not JSON ({line[:40]!r}); is it a metrics.jsonl "
                                  f"that a training run wrote?") from None
            if not isinstance(record, dict):
                raise ConfigError(f"{path}, line {number}: a JSON {type(record).__name__}, not a record; is it "
                                  f"a metrics.jsonl that a training run wrote?")
            if not isinstance(record.get("iteration"), int) or not _is_number(record.get("loss")):
                continue  # a memory record, or another shape
            run = record.get("run_id")
            series = by_run.setdefault(run if isinstance(run, str) else None, Series(label=path))
            if "split" in record:
                series.evaluations.setdefault(str(record["split"]), []).append((record["iteration"], record["loss"]))
            else:
                series.training.append(record)
    if skipped:
        notes.append(f"{PROGRAM}: note: {path}: skipped {len(skipped)} record(s) a kill cut short "
                     f"(line {', '.join(map(str, skipped))})")
    runs = list(by_run.items())
    commands = read_commands(path)
    for run, series in runs:
        series.flags = commands.get(run)
    if len(runs) > 1:
        for run, series in runs:
            series.label = f"{path} (run {run})" if run is not None else f"{path} (no run id)"
    for _, series in runs:
        series.training.sort(key=lambda r: r["iteration"])
    return [series for _, series in runs]


def label_by_flags(all_series: list[Series]) -> None:
    """Label each run by the flags that tell it from the others, where recorded."""
    for series, flags in zip(all_series, distinguishing_flags([series.flags for series in all_series])):
        if flags:
            series.label = flags


def check_output(output: str, overwrite: bool, given: bool = True) -> Path:
    """The PNG's path, if it may be written."""
    path, name = Path(output), f"-o {output}" if given else f"{output} (-o's default)"
    if path.suffix.lower() != ".png":
        raise ConfigError(f"{name}: the picture is a PNG; give a path ending in .png")
    if path.is_dir():
        raise ConfigError(f"{name}: a directory; give the path of a .png file")
    if path.exists() and not overwrite:
        raise ConfigError(f"{name}: already exists; pass --overwrite to replace it, or -o another path")
    return path


def draw(all_series: list[Series], output: Path) -> None:
    """The four panels of every series, written to `output`."""
    from matplotlib.figure import Figure  # here, not at the top: see the module's docstring
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=FIGURE_INCHES, dpi=DOTS_PER_INCH, layout="constrained")
    axes = figure.subplots(2, 2, sharex=True).flatten()
    colours = [f"C{index % 10}" for index in range(len(all_series))]
    loss_axis = axes[0]
    for series, colour in zip(all_series, colours):
        loss_axis.plot(*series.points("loss"), color=colour, linewidth=1.2, label=f"{series.label} train")
        for split, marker in (("valid", "o"), ("test", "x")):
            points = series.evaluations.get(split, [])
            if points:
                loss_axis.plot([i for i, _ in points], [v for _, v in points], linestyle="none", marker=marker,
                               color=colour, markersize=6, label=f"{series.label} {split}")
        for axis, (key, _, _) in zip(axes[1:], TRAINING_PANELS):
            axis.plot(*series.points(key), color=colour, linewidth=1.2, label=series.label)
    loss_axis.set_title("loss")
    loss_axis.set_ylabel("lm loss")
    loss_axis.legend(fontsize="small")
    for axis, (_, title, ylabel) in zip(axes[1:], TRAINING_PANELS):
        axis.set_title(title)
        axis.set_ylabel(ylabel)
    for axis in axes:
        axis.grid(True, alpha=0.3)
    for axis in axes[2:]:
        axis.set_xlabel("iteration")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))  # shared by the four
    axes[1].ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, format="png")


def plot(metrics_files: list[str], output: Optional[str] = None, overwrite: bool = False) -> str:
    """Draw `metrics_files` into `output`; returns the line that says what was drawn."""
    target = check_output(output or str(Path(metrics_files[0]).with_name("curves.png")), overwrite,
                          given=output is not None)
    notes: list[str] = []
    all_series = []
    for path in metrics_files:
        runs = read_series(path, notes)
        if not any(series.training for series in runs):
            raise ConfigError(f"{path}: no training records (a run writes one every --log-interval iterations); "
                              f"is it the metrics file of a run that trained?")
        all_series += runs
    for note in notes:
        print(note, file=sys.stderr, flush=True)
    label_by_flags(all_series)
    draw(all_series, target)
    training = sum(len(s.training) for s in all_series)
    evaluations = sum(len(points) for s in all_series for points in s.evaluations.values())
    return (f"{PROGRAM}: {training} training and {evaluations} evaluation records of {len(all_series)} run(s) "
            f"-> {target}")


def build_parser() -> OneLineArgumentParser:
    parser = OneLineArgumentParser(
        prog=f"python -m {PROGRAM}",
        description="Draw the loss (validation and test as points), learning rate and throughput of one or "
                    "several metrics.jsonl files into a PNG, one line per run.")
    parser.add_argument("metrics_files", nargs="+", metavar="METRICS_JSONL",
                        help="metrics files written by training (--metrics-file; default runs/RUN_ID/metrics.jsonl)")
    parser.add_argument("-o", "--output", metavar="PNG",
                        help="the picture to write (default: curves.png beside the first metrics file)")
    parser.add_argument("--overwrite", action="store_true", help="replace the PNG if it exists")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    def action() -> None:
        args = build_parser().parse_args(argv)
        print(plot(args.metrics_files, args.output, args.overwrite), flush=True)

    return run_tool(PROGRAM, action)


if __name__ == "__main__":
    sys.exit(main())
