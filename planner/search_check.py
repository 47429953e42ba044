"""The layout search's picks planned by the meta-device dry run before they are printed (on unless --no-dry-run-check):
the candidates are walked best first, every pipeline stage planned, until `picks` fit or `max_dry_runs` plans were
made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from arguments.config import ConfigError
from arguments.parser import parse_config
from planner.dry_run import Cluster
from planner.layout_search import Candidate, rank_key
from planner.perf_model import Hardware
from planner.search_progress import SearchProgress
from planner.stage_plans import run_plans
from planner.vocabulary import launch_vocab


@dataclass(frozen=True)
class CheckSummary:
    checked: int
    fit: int
    capped: bool      # the walk stopped at max_dry_runs before `picks` fit


def hardware_cluster(gpus: int, hardware: Hardware) -> Cluster:
    """The cluster `zero.plan dry-run --hardware` plans on: the profile's node size, memory and device."""
    return Cluster(gpus, hardware.gpus_per_node, hardware.gpu_memory_bytes, hardware.device_type)


def stage_bytes(flags: Sequence[str], gpus: int, hardware: Hardware,
                progress: Optional[Callable[[str], None]] = None) -> list[int]:
    """Each pipeline stage's dry-run peak (its first rank) for the launch `flags` on `gpus` GPUs of `hardware`."""
    config = parse_config(list(flags))
    vocab, _ = launch_vocab(config.checkpoint, config.data, config.model, config.sources)
    return [plan.total_bytes for plan in run_plans(config, hardware_cluster(gpus, hardware), vocab, 0, progress)]


def check_picks(candidates: list[Candidate], model_flags: Sequence[str], hardware: Hardware, picks: int,
                max_dry_runs: int, progress: Optional[SearchProgress] = None) -> CheckSummary:
    """Plan the best candidates until `picks` fit by the dry run. Reorders `candidates`: the checked ones that fit
    first, then the unchecked that fit by the count, then the rest. `progress` hears of each dry run."""
    progress = progress or SearchProgress(None)
    checked = fit = 0
    best = None
    for candidate in [c for c in candidates if c.fits]:
        if fit == picks or checked == max_dry_runs:
            break
        progress.dry_run_started(candidate.layout, max_dry_runs)
        checked += 1
        try:
            candidate.stage_bytes = stage_bytes(candidate.launch_flags(model_flags), candidate.layout.gpus, hardware,
                                                progress.dry_run_line)
        except ConfigError as error:  # a combination the trainer refuses, which the enumeration let through
            candidate.fits, candidate.lost_to = False, f"refused by pretrain_gpt.py: {error}"
            progress.dry_run_done("refused by pretrain_gpt.py", best)
            continue
        worst = max(range(len(candidate.stage_bytes)), key=candidate.stage_bytes.__getitem__)
        if candidate.stage_bytes[worst] > hardware.gpu_memory_bytes:
            candidate.fits = False
            candidate.lost_to = (f"memory (dry run): {candidate.stage_bytes[worst] / 1e9:,.1f} GB on stage {worst} > "
                                 f"{hardware.gpu_memory_bytes / 1e9:,.0f} GB")
        else:
            fit += 1
            if best is None:  # walked best first: the first that fits is fastest
                best = (candidate.layout, candidate.prediction.step_s, candidate.dry_run_bytes)
        progress.dry_run_done(f"{'fits' if candidate.fits else 'over the GPU'}: "
                              f"{candidate.dry_run_bytes / 2 ** 30:,.2f} GiB by the dry run, "
                              f"{candidate.memory_bytes / 2 ** 30:,.2f} counted", best)
    confirmed = sorted((c for c in candidates if c.fits and c.stage_bytes), key=rank_key)
    unchecked = [c for c in candidates if c.fits and not c.stage_bytes]
    candidates[:] = confirmed + unchecked + sorted((c for c in candidates if not c.fits), key=lambda c: c.memory_bytes)
    return CheckSummary(checked, fit, fit < picks and checked == max_dry_runs)
