"""A run's plan as `python -m zero.plan dry-run` makes it: with pipeline stages every stage's rank at the same (DP, TP)
coordinates, since the worst stage decides whether the run fits; without, the one rank."""

from __future__ import annotations

from typing import Callable, Optional

from arguments.config import PretrainConfig
from planner.dry_run import Cluster, RankPlan, dry_run


def stage_plans(config: PretrainConfig, cluster: Cluster, vocab: int, rank: int,
                progress: Optional[Callable[[str], None]] = None) -> list[RankPlan]:
    """With pipeline stages, every stage's rank at `rank`'s (DP, TP) coordinates, planned."""
    per_stage = cluster.world_size // config.parallel.pipeline_model_parallel_size
    return [dry_run(config, cluster, vocab, stage * per_stage + rank % per_stage, progress=progress)
            for stage in range(config.parallel.pipeline_model_parallel_size)]


def run_plans(config: PretrainConfig, cluster: Cluster, vocab: int, rank: int = 0,
              progress: Optional[Callable[[str], None]] = None) -> list[RankPlan]:
    """Each pipeline stage's plan (stage_plans), or the one rank's without stages."""
    if config.parallel.pipeline_model_parallel_size > 1:
        return stage_plans(config, cluster, vocab, rank, progress)
    return [dry_run(config, cluster, vocab, rank, progress=progress)]
