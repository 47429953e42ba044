"""What the planner and the performance model say about a point, with a cache of dry runs keyed by the
point's flags, grid, vocabulary and a hash of the planning code (a change to it plans again)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from arguments.config import ConfigError, PretrainConfig
from arguments.parser import parse_config
from experiments import GPT2_VOCAB, REPO_ROOT, Point
from paper_conditions import NO_CONDITIONS, ConditionSet, condition_plan, condition_prediction
from planner.dry_run import Cluster, RankPlan, dry_run
from planner.perf_model import Constants, Prediction, load_constants

# Every package a dry run executes: the floors from base/ to planner/ (checkpoint/ too: the train step the dry
# run drives imports it to name a resumable save when a run diverges).
PLANNING_SOURCES = ("base", "rendezvous", "resilience", "parallel", "zero", "gpt", "families", "arguments", "checkpoint",
                    "training", "planner")
# Never change a dry run (paper_conditions.py, beside this file, applies on top of one): the cache holds
# dry runs only.
NOT_PLANNING = ("perf_model.py", "perf_calibration.py", "perf_cli.py", "paper_tables.py", "plan.py")
MICRO_BATCH_LADDER = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)  # 96: the largest of the authors' sweeps
# The share of a GPU the planned peak may take when a batch size is chosen: the rest is for what a
# dry run cannot see (the CUDA context, NCCL's buffers, fragmentation).
BATCH_HEADROOM = 0.9


def default_cache_dir() -> Path:
    return Path(os.environ.get("ZERO_GPT_PLAN_CACHE", Path.home() / ".cache" / "zero-gpt" / "plans"))


def _source_hash() -> str:
    digest = hashlib.sha256()
    for folder in PLANNING_SOURCES:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            if path.name in NOT_PLANNING:
                continue
            digest.update(path.relative_to(REPO_ROOT).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def check_plan_types(plan: RankPlan) -> RankPlan:
    """A cached plan whose values are not the numbers and names a dry run writes (an edited or foreign
    entry) raises TypeError, which the cache reads as a miss; unchecked, it was a TypeError in run.py's
    or report.py's arithmetic (issue 33 #15)."""
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def numbers(value) -> bool:  # a number, or a mapping of names to numbers (nested: comm_bytes)
        if isinstance(value, dict):
            return all(isinstance(key, str) and numbers(item) for key, item in value.items())
        return number(value)

    for item in dataclasses.fields(plan):
        value = getattr(plan, item.name)
        expected = item.type if isinstance(item.type, str) else getattr(item.type, "__name__", "")
        good = (isinstance(value, str) if expected == "str" else
                isinstance(value, list) and all(isinstance(v, str) for v in value) if expected.startswith("list") else
                value is None or number(value) if expected.startswith("Optional") else numbers(value))
        if not good:
            raise TypeError(f"{item.name} is {value!r}")
    return plan


class Planner:
    """Dry runs and predictions of points, each planned once (and kept in `cache_dir` if given).

    With `conditions` (paper_conditions.py, e.g. the dgx2-2019 set) every plan and prediction is
    the dry run's under those conditions; the dry runs themselves are the same and shared with the
    unconditioned planner (the cache holds only dry runs), and with no conditions nothing changes."""

    def __init__(self, cache_dir: Optional[Path] = None, constants: Optional[dict[str, Constants]] = None,
                 conditions: ConditionSet = NO_CONDITIONS) -> None:
        self.cache_dir = cache_dir
        self.source = _source_hash()
        self.constants = constants or {}
        self.conditions = conditions
        # The share of the budget a chosen batch may take: the rest is for what a dry run cannot see,
        # which a condition set names itself.
        self.batch_headroom = 1.0 if conditions else BATCH_HEADROOM
        self._plans: dict[str, RankPlan] = {}

    def plan(self, point: Point, stack: Optional[str] = None) -> RankPlan:
        return self.plan_config(parse_config(point.pretrain_argv()), point.cluster(), stack=stack)

    def plan_config(self, config: PretrainConfig, cluster: Cluster, vocab_size: int = GPT2_VOCAB,
                    stack: Optional[str] = None) -> RankPlan:
        """The dry run of `config` (`dry_run_config`) under this planner's conditions (for `stack`,
        by default the paper's stack of its stage and MP degree)."""
        return condition_plan(self.dry_run_config(config, cluster, vocab_size), config.model, config.training, config.zero,
                              config.activations, self.conditions, stack)

    def dry_run_config(self, config: PretrainConfig, cluster: Cluster, vocab_size: int = GPT2_VOCAB) -> RankPlan:
        """planner/dry_run.py's plan of rank 0, from memory, the cache, or a dry run (then cached).
        Where the metrics go and whether the run reports memory do not change a plan (a dry run reads
        neither), so they are not part of the key: Figure 7's points share Figures 6 and 8's plans."""
        settings = config.to_dict()
        for unplanned in ("metrics_file", "report_memory"):
            settings.get("logging", {}).pop(unplanned, None)
        key = hashlib.sha256(json.dumps([self.source, settings, dataclasses.asdict(cluster), vocab_size],
                                        sort_keys=True, default=str).encode()).hexdigest()
        if key in self._plans:
            return self._plans[key]
        cached = self.cache_dir / f"{key}.json" if self.cache_dir is not None else None
        if cached is not None and cached.is_file():
            try:
                data = json.loads(cached.read_text(encoding="utf-8"))
                data.pop("fits", None)
                self._plans[key] = check_plan_types(RankPlan(**data))
                return self._plans[key]
            except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError):
                pass  # a damaged cache entry is a miss: planned again below, and replaced
        plan = self._plans[key] = dry_run(config, cluster, vocab_size)
        if cached is not None:
            try:
                cached.parent.mkdir(parents=True, exist_ok=True)
                temporary = cached.with_suffix(f".tmp-{os.getpid()}")
                temporary.write_text(json.dumps(plan.to_json()), encoding="utf-8")
                os.replace(temporary, cached)
            except OSError as error:  # a read-only cache, a file where it should be, a full disk
                raise ConfigError(f"the plan cache {self.cache_dir} cannot be written ({error.strerror or error}); "
                                  f"set ZERO_GPT_PLAN_CACHE to a writable directory") from None
        return plan

    def predict(self, point: Point, plan: Optional[RankPlan] = None, stack: Optional[str] = None) -> Prediction:
        hardware = point.hardware
        if hardware.calibration not in self.constants:
            self.constants[hardware.calibration] = load_constants(hardware.calibration)
        plan = plan if plan is not None else self.plan(point, stack)
        return condition_prediction(plan, parse_config(point.pretrain_argv()), GPT2_VOCAB, point.world_size, hardware,
                                    self.constants[hardware.calibration], self.conditions, stack)

    def predict_depth(self, point: Point, plan: RankPlan, layers: int) -> Prediction:
        """The prediction of `point`'s shape at `layers` (a depth a planner search found, which no
        preset need have), planned as `plan`."""
        config = parse_config(point.pretrain_argv())
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, num_layers=layers))
        hardware = point.hardware
        if hardware.calibration not in self.constants:
            self.constants[hardware.calibration] = load_constants(hardware.calibration)
        return condition_prediction(plan, config, GPT2_VOCAB, point.world_size, hardware,
                                    self.constants[hardware.calibration], self.conditions)

    def budget(self, plan: RankPlan, point: Point) -> int:
        return plan.budget_bytes if plan.budget_bytes is not None else point.hardware.gpu_memory_bytes

    def fits_with_headroom(self, point: Point) -> bool:
        plan = self.plan(point)
        return plan.total_bytes <= self.batch_headroom * self.budget(plan, point)

    def largest_micro_batch(self, point: Point) -> Optional[int]:
        """The largest micro batch of MICRO_BATCH_LADDER whose planned peak is within the batch
        headroom of the GPU (BATCH_HEADROOM, or all of a condition set's budget), or None when even
        1 is not. The peak is a line in the micro batch (activations and logits grow with it, model
        states and buffers do not), so dry runs at 1 and 2 give the line; the answer it points to is
        then confirmed by a dry run of its own, stepping down if needed."""
        first = self.plan(point.with_micro_batch(1))
        limit = self.batch_headroom * self.budget(first, point)
        one, two = first.total_bytes, self.plan(point.with_micro_batch(2)).total_bytes
        if one > limit:
            return None
        slope = max(two - one, 1)
        estimate = 1 + (limit - one) / slope
        candidates = [b for b in MICRO_BATCH_LADDER if b <= estimate] or [1]
        for micro_batch in reversed(candidates):
            if self.fits_with_headroom(point.with_micro_batch(micro_batch)):
                return micro_batch
        return 1
