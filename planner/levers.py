"""What makes a plan that does not fit, fit: the levers a user would reach for (recompute, the next ZeRO stage,
--offload-optimizer), cheapest first, each re-planned by a full dry run of every stage; then all together, then more
pipeline stages or wider TP."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

from arguments.config import ConfigError, PretrainConfig
from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig
from planner.dry_run import Cluster, RankPlan
from planner.layout_flags import ZERO_WORDS
from planner.layout_perf import Layout
from training.recompute_share import recomputed_share
from zero.config import ActivationCheckpointConfig, ZeroConfig
from zero.memory import format_bytes

# (config, cluster) -> every stage's plan at rank 0's DP and TP coordinates
PlanStages = Callable[[PretrainConfig, Cluster], list[RankPlan]]


@dataclass(frozen=True)
class Lever:
    flags: str             # what to add to the command line ("--recompute-granularity full")
    total_bytes: int
    budget_bytes: int
    fits: bool
    host_node_bytes: int = 0
    host_budget_bytes: Optional[int] = None

    @property
    def headroom_bytes(self) -> int:
        return self.budget_bytes - self.total_bytes

    def describe(self) -> str:
        if self.fits:
            return f"with {self.flags} it fits with {format_bytes(self.headroom_bytes)} to spare"
        if self.headroom_bytes >= 0:  # the device holds it, the host does not
            return (f"with {self.flags} the device holds it ({format_bytes(self.headroom_bytes)} to spare) but the host "
                    f"memory per node does not ({format_bytes(self.host_node_bytes)} of "
                    f"{format_bytes(self.host_budget_bytes or 0)})")
        return f"with {self.flags} still short by {format_bytes(-self.headroom_bytes)}"

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "headroom_bytes": self.headroom_bytes}


def _changed(config: PretrainConfig, *, activations: Optional[dict] = None, zero: Optional[dict] = None,
             parallel: Optional[dict] = None) -> Optional[PretrainConfig]:
    """`config` with the changes, or None where the result is not a valid run."""
    changed = dataclasses.replace(
        config, activations=dataclasses.replace(config.activations, **(activations or {})),
        zero=dataclasses.replace(config.zero, **(zero or {})),
        parallel=dataclasses.replace(config.parallel, **(parallel or {})))
    try:
        changed.validate()
    except ConfigError:
        return None
    return changed


def single_levers(activations: ActivationCheckpointConfig, model: ModelConfig, parallel: ParallelismConfig,
                  zero: ZeroConfig, data_parallel_size: int) -> list[tuple[tuple[str, ...], dict]]:
    """(flags, changes) of each lever this run has not pulled yet, cheapest first."""
    levers = []
    if not activations.checkpoint_activations:
        levers.append((("--recompute-granularity full",), {"activations": {"checkpoint_activations": True}}))
    # --recompute-method block leaves layers keeping their activations
    elif recomputed_share(activations, model, parallel) < 1:
        levers.append((("--recompute-method uniform", "--recompute-num-layers 1"),
                       {"activations": {"recompute_method": "uniform", "checkpoint_num_layers": 1}}))
    stage = zero.stage
    if stage < 3 and data_parallel_size > 1:
        levers.append(((f"--zero-stage {stage + 1}",), {"zero": {"stage": stage + 1}}))
    if not zero.offload_optimizer:
        levers.append((("--zero-stage 1", "--offload-optimizer") if stage == 0 else ("--offload-optimizer",),
                       {"zero": {"offload_optimizer": True, **({"stage": 1} if stage == 0 else {})}}))
    return levers


def _combined(levers: list[tuple[tuple[str, ...], dict]]) -> tuple[str, dict]:
    """All the levers at once: every change, and the highest ZeRO stage any asks for."""
    changes: dict = {"activations": {}, "zero": {}}
    for _, lever_changes in levers:
        for section, values in lever_changes.items():
            stage = max(values.get("stage", 0), changes[section].get("stage", 0))
            changes[section].update(values)
            if stage:
                changes[section]["stage"] = stage
    stage = changes["zero"].get("stage")
    flags = [flag for lever_flags, _ in levers for flag in lever_flags if not flag.startswith("--zero-stage")]
    return " ".join(([f"--zero-stage {stage}"] if stage else []) + flags), changes


def _wider(config: PretrainConfig, cluster: Cluster, changes: dict, flags: str, name: str, flag: str,
           doublings: int) -> Optional[tuple[str, PretrainConfig, Cluster]]:
    """`name` (a parallel size) doubled `doublings` times on top of `changes`: on the same GPUs where DP leaves room,
    else on more; None where the run cannot have it."""
    parallel = config.parallel
    factor = 2 ** doublings
    size = getattr(parallel, name) * factor
    grid = parallel.tensor_model_parallel_size * parallel.pipeline_model_parallel_size * factor
    world = cluster.world_size if cluster.world_size % grid == 0 else max(grid, cluster.world_size * factor)
    changed = _changed(config, activations=changes["activations"], zero=changes["zero"], parallel={name: size})
    if changed is None:
        return None
    where = "" if world == cluster.world_size else f" on {world} GPUs"
    return f"{flags} {flag} {size}{where}".strip(), changed, dataclasses.replace(cluster, world_size=world)


# up to 8x a dimension, stopping at the first that fits; TP no wider than a node
MAX_DOUBLINGS = 3


def find_levers(config: PretrainConfig, cluster: Cluster, data_parallel_size: int, plan_stages: PlanStages,
                progress: Optional[Callable[[str], None]] = None) -> list[Lever]:
    """The levers of a run that does not fit, each planned."""
    def planned(flags: str, changed: Optional[PretrainConfig], on: Cluster) -> Optional[Lever]:
        if changed is None:
            return None
        if progress is not None:
            progress(f"> planning the lever {flags}")
        try:
            plans = plan_stages(changed, on)
        except ConfigError:  # a grid or batch the changed run cannot have
            return None
        worst = max(plans, key=lambda plan: plan.total_bytes)
        host = max(plans, key=lambda plan: plan.host_node_bytes)
        return Lever(flags, worst.total_bytes, worst.budget_bytes, all(plan.fits for plan in plans),
                     host.host_node_bytes, host.host_budget_bytes)

    singles = single_levers(config.activations, config.model, config.parallel, config.zero, data_parallel_size)
    levers = [lever for flags, changes in singles
              if (lever := planned(" ".join(flags), _changed(config, **changes), cluster)) is not None]
    if any(lever.fits for lever in levers):
        return levers
    # first those that keep the states on the device (more devices add no host memory), then all
    on_device = [lever for lever in singles if "--offload-optimizer" not in lever[0]]
    combinations = [group for group in (on_device, singles) if len(group) > 1]
    for together in combinations[:1] + [group for group in combinations[1:] if group != combinations[0]]:
        flags, changes = _combined(together)
        lever = planned(flags, _changed(config, **changes), cluster)
        if lever is not None:
            levers.append(lever)
            if lever.fits:
                return levers
    flags, changes = _combined(on_device)
    for name, flag, widest in (("pipeline_model_parallel_size", "--pipeline-model-parallel-size", config.model.num_layers),
                               ("tensor_model_parallel_size", "--tensor-model-parallel-size", cluster.gpus_per_node)):
        for doublings in range(1, MAX_DOUBLINGS + 1):
            if getattr(config.parallel, name) * 2 ** doublings > widest:
                break
            wider = _wider(config, cluster, changes, flags, name, flag, doublings)
            lever = planned(*wider) if wider is not None else None
            if lever is not None:
                levers.append(lever)
                if lever.fits:
                    break
    return levers


def format_levers(levers: list[Lever]) -> list[str]:
    """The levers section of a plan that does not fit."""
    if not levers:
        return ["levers: none of recompute, a higher ZeRO stage, offload or a wider grid applies to this run"]
    return ["levers (each re-planned; the worst stage's peak):"] + [f"  {lever.describe()}" for lever in levers]


# the search's levers, by the layout dimension each moves
SEARCH_LEVER_DIMENSIONS = ("stage", "recompute_fraction", "micro_batch_size", "tp", "pp")


def _lever_key(layout: Layout, leave_out: str) -> tuple:
    return tuple(getattr(layout, name) for name in (*SEARCH_LEVER_DIMENSIONS, "cp", "ep") if name != leave_out)


def _lever_flags(dimension: str, layout: Layout) -> str:
    if dimension == "stage":
        return " ".join(ZERO_WORDS[layout.stage]) or "no ZeRO"
    if dimension == "recompute_fraction":
        return "--recompute-granularity full" if layout.recompute_fraction >= 1.0 else "no recompute"
    if dimension == "micro_batch_size":
        return f"--micro-batch-size {layout.micro_batch_size}"
    if dimension == "tp":
        return f"--tensor-model-parallel-size {layout.tp}"
    return f"--pipeline-model-parallel-size {layout.pp}" + (f" (VP {layout.vp})" if layout.vp > 1 else "")


def plainest_layout(layouts: list[tuple[Layout, float]]) -> tuple[Layout, float]:
    """The layout (with its bytes) that pulls no lever the user's flags leave to the search."""
    return min(layouts, key=lambda item: (item[0].tp * item[0].pp, item[0].pp, item[0].vp,
                                          item[0].micro_batch_size, item[0].recompute_fraction, item[0].stage))


def search_levers(layouts: list[tuple[Layout, float]], baseline: Layout,
                  baseline_bytes: float) -> list[tuple[str, float]]:
    """For each dimension the search moves, the counted layout that differs from `baseline` in it alone and needs the
    least memory below `baseline_bytes`: (its flags, its bytes), least first."""
    best: dict[str, tuple[str, float]] = {}
    for dimension in SEARCH_LEVER_DIMENSIONS:
        key = _lever_key(baseline, dimension)
        for layout, memory in layouts:
            if getattr(layout, dimension) != getattr(baseline, dimension) and _lever_key(layout, dimension) == key \
                    and memory < min(baseline_bytes, best.get(dimension, ("", memory + 1))[1]):
                best[dimension] = (_lever_flags(dimension, layout), memory)
    return sorted(best.values(), key=lambda lever: lever[1])
