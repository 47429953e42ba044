"""The pipeline stages' parameter tables, gathered into metadata.json's record table. Stages hold layers under global
names, so loading at another pipeline size is a lookup by name; the last stage's tied embedding copy is stored once, by
the first stage, as Megatron-Core's distributed checkpoints do (the copies are equal by construction).
"""

from __future__ import annotations

from parallel.state import ParallelState


def gather_stage_tables(table: dict[str, dict], state: ParallelState) -> list[dict[str, dict]]:
    """Every stage's parameter table (whole shapes by name), in stage order, each the union of its ranks'; every rank
    calls this."""
    gathered = state.comm.all_gather_object((state.pipeline_parallel_rank, table))
    by_stage: dict[int, dict[str, dict]] = {}
    for stage, stage_table in gathered:
        merged = by_stage.setdefault(stage, {})
        for name, entry in stage_table.items():
            merged.setdefault(name, entry)
    return [by_stage[stage] for stage in range(state.pipeline_parallel_size)]


def whole_table(stage_tables: list[dict[str, dict]]) -> dict[str, dict]:
    """The model's parameter table: the union of the stages' (a shared name has one shape everywhere)."""
    whole: dict[str, dict] = {}
    for table in stage_tables:
        for name, entry in table.items():
            whole.setdefault(name, entry)
    return whole
