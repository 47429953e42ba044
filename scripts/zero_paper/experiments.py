"""The ZeRO paper's experiments as data: one definition file per figure, each row one run.

A definition (experiments/figN.dat) is a whitespace table shaped like the authors' `exp.dat` sweeps: `#` comments,
a line naming the columns, then a point a line. Columns: profile, point, series (zero, megatron, ddp, C1-C5), nodes
gpus_per_node mp, layers hidden heads (a configs/models/zero_paper preset), micro_batch global_batch, zero_stage pa
pa_cpu md (0/1), reduce_bucket allgather_bucket (elements), iterations."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

import yaml

from arguments.config import ConfigError
from arguments.parser import PRESET_DIR
from base.input_files import read_text_file
from planner.dry_run import Cluster
from planner.perf_model import Hardware, load_hardware

HERE = Path(__file__).resolve().parent
DEFINITION_DIR = HERE / "experiments"
REPO_ROOT = HERE.parent.parent
FIGURES = ("fig2", "fig3", "fig4", "fig6", "fig7", "fig8")
PROFILES = {"dgx2": "dgx2-v100", "h100": "h100-sxm"}
COLUMNS = ("profile", "point", "series", "nodes", "gpus_per_node", "mp", "layers", "hidden", "heads", "micro_batch",
           "global_batch", "zero_stage", "pa", "pa_cpu", "md", "reduce_bucket", "allgather_bucket", "iterations")
TEXT_COLUMNS = ("profile", "point", "series")
PRECISION_FLAGS = {"fp16": ["--no-bf16", "--fp16"], "bf16": ["--bf16", "--no-accumulate-allreduce-grads-in-fp32"],
                   "fp32": ["--no-bf16", "--no-fp16"]}
GPT2_VOCAB = 50257
# A definition is a table of tens of rows; a file past this is not one.
MAX_DEFINITION_BYTES = 2**20
# The largest number a column holds: bucket sizes in elements (5e8 in the paper) with room to spare.
MAX_COUNT = 10**15
# Figures 6 and 7 are about memory: their runs also report what each rank holds.
MEMORY_FIGURES = ("fig6", "fig7")


@dataclass(frozen=True)
class Point:
    figure: str
    profile: str
    point: str
    series: str
    nodes: int
    gpus_per_node: int
    mp: int
    layers: int
    hidden: int
    heads: int
    micro_batch: int
    global_batch: int
    zero_stage: int
    pa: int
    pa_cpu: int
    md: int
    reduce_bucket: int
    allgather_bucket: int
    iterations: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def name(self) -> str:
        return f"{self.figure}-{self.profile}-{self.point}"

    @property
    def hardware(self) -> Hardware:
        return _hardware(self.profile)

    @property
    def preset(self) -> str:
        return preset_for_shape(self.layers, self.hidden)

    def pretrain_argv(self, metrics_file: Optional[str] = None, extra: tuple[str, ...] = ()) -> list[str]:
        """pretrain_gpt.py's flags for this point (the data flags and any others go in `extra`)."""
        argv = ["--config", f"zero_paper/{self.preset}", "--tensor-model-parallel-size", str(self.mp), "--micro-batch-size", str(self.micro_batch),
                "--global-batch-size", str(self.global_batch), "--zero-stage", str(self.zero_stage),
                "--checkpoint-activations", _flag("partition-activations", self.pa),
                _flag("cpu-checkpointing", self.pa_cpu), _flag("contiguous-checkpointing", self.md),
                "--reduce-bucket-size", str(self.reduce_bucket), "--allgather-bucket-size", str(self.allgather_bucket),
                "--train-iters", str(self.iterations), "--lr-warmup-iters", "0", "--log-interval", "1",
                "--eval-iters", "0", *PRECISION_FLAGS[self.hardware.precision]]
        if self.figure in MEMORY_FIGURES:
            argv.append("--report-memory")
        if metrics_file is not None:
            argv += ["--metrics-file", metrics_file]
        return argv + list(extra)

    def cluster(self) -> Cluster:
        return Cluster(self.world_size, self.gpus_per_node, self.hardware.gpu_memory_bytes, self.hardware.device_type)

    def with_micro_batch(self, micro_batch: int) -> "Point":
        data_parallel = self.world_size // self.mp
        return dataclasses.replace(self, micro_batch=micro_batch, global_batch=micro_batch * data_parallel)


def portable_argv(argv) -> list[str]:
    """`argv` as a committed file may record it: an absolute path inside the repository made relative
    to its root, one outside it cut to its file name, so no machine's folders are written down."""
    def portable(text: str) -> str:
        flag, equals, value = text.partition("=") if text.startswith("--") and "=" in text else ("", "", text)
        path = Path(value)
        if not path.is_absolute():
            return text
        try:
            value = path.resolve().relative_to(REPO_ROOT.resolve()).as_posix()
        except ValueError:
            value = path.name
        return f"{flag}{equals}{value}"

    return [portable(str(item)) for item in argv]


def _flag(name: str, on: int) -> str:
    return f"--{name}" if on else f"--no-{name}"


@lru_cache(maxsize=None)
def _hardware(profile: str) -> Hardware:
    if profile not in PROFILES:
        raise ConfigError(f"unknown profile {profile!r}; profiles: {', '.join(PROFILES)}")
    return load_hardware(PROFILES[profile])


@lru_cache(maxsize=None)
def _preset_shapes() -> dict[tuple[int, int], tuple[str, int]]:
    shapes = {}
    for path in sorted((PRESET_DIR / "zero_paper").glob("*.yaml")):
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
        shapes[(values["num_layers"], values["hidden_size"])] = (path.stem, values["num_attention_heads"])
    return shapes


def preset_for_shape(layers: int, hidden: int) -> str:
    try:
        return _preset_shapes()[(layers, hidden)][0]
    except KeyError:
        raise ConfigError(f"no configs/models/zero_paper preset has {layers} layers x {hidden}") from None


def definition_path(figure: str, directory: Path = DEFINITION_DIR) -> Path:
    if figure not in FIGURES:
        raise ConfigError(f"unknown figure {figure!r}; figures: {', '.join(FIGURES)}")
    return Path(directory) / f"{figure}.dat"


def load_points(figure: str, profile: Optional[str] = None, directory: Path = DEFINITION_DIR) -> list[Point]:
    """The figure's points (of one profile, when given), checked against the presets and each other."""
    path = definition_path(figure, directory)
    text = read_text_file(path, "--definitions", max_bytes=MAX_DEFINITION_BYTES)  # never a FIFO or a device
    lines = [line.split("#", 1)[0].split() for line in text.splitlines()]
    rows = [fields for fields in lines if fields]
    if not rows or tuple(rows[0]) != COLUMNS:
        raise ConfigError(f"{path}: the first line that is not a comment must name the columns "
                          f"{' '.join(COLUMNS)}")
    points = []
    for number, fields in enumerate(rows[1:], start=2):
        if len(fields) != len(COLUMNS):
            raise ConfigError(f"{path}: row {number} has {len(fields)} fields, expected {len(COLUMNS)}")
        values = {column: value if column in TEXT_COLUMNS else _count(value, column, path, number)
                  for column, value in zip(COLUMNS, fields)}
        point = Point(figure=figure, **values)
        _check(point, path)
        points.append(point)
    names = [(p.profile, p.point) for p in points]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: point names repeat within a profile")
    return [p for p in points if profile is None or p.profile == profile]


def _count(text: str, column: str, path: Path, row: int) -> int:
    """A whole, non-negative number of a numeric column ("5e8" is one; "x", "nan", "1e999", "2.5" are not)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value == value and 0 <= value <= MAX_COUNT and value == int(value)):
        raise ConfigError(f"{path}: row {row}, column {column}: {text!r} is not a whole number from 0 to {MAX_COUNT:.0e}")
    return int(value)


def _check(point: Point, path: Path) -> None:
    where = f"{path}: {point.profile} {point.point}"
    point.hardware  # noqa: B018 - an unknown profile is an error here, not at launch
    for column in ("nodes", "gpus_per_node", "mp", "layers", "hidden", "heads", "micro_batch", "global_batch",
                   "reduce_bucket", "allgather_bucket", "iterations"):
        if getattr(point, column) < 1:
            raise ConfigError(f"{where}: {column} must be at least 1")
    if point.zero_stage not in (0, 1, 2, 3) or {point.pa, point.pa_cpu, point.md} - {0, 1}:
        raise ConfigError(f"{where}: zero_stage is 0-3, and pa, pa_cpu and md are 0 or 1")
    preset, heads = point.preset, _preset_shapes()[(point.layers, point.hidden)][1]
    if point.heads != heads:
        raise ConfigError(f"{where}: {point.heads} heads, but zero_paper/{preset} has {heads}")
    if point.world_size % point.mp or point.heads % point.mp:
        raise ConfigError(f"{where}: mp {point.mp} must divide the GPUs and the heads")
    if point.global_batch % (point.micro_batch * (point.world_size // point.mp)):
        raise ConfigError(f"{where}: the global batch is not a multiple of micro batch x data-parallel size")
    if point.pa_cpu and not point.pa:
        raise ConfigError(f"{where}: pa_cpu needs pa (the paper's P_a+cpu offloads partitioned checkpoints)")
