"""The pipeline stages' parameter tables, gathered: what metadata.json's per-tensor record table is made of.

Every stage holds its layers under their global names (gpt/stage_layers.py), so a checkpoint is the union of
the stages' parameter tables, and loading at another pipeline size is a lookup by name. One name is held by
two stages: with a tied output layer the last stage keeps a second copy of the word embedding. Its record says
so (replicated over "pp", gpt/model.py), so the save plan's one rule (checkpoint/save_plan.py) stores it
once, by the first stage, as Megatron-Core's distributed checkpoints do
(megatron/core/models/common/language_module/language_module.py, tie_embeddings_and_output_weights_state_dict:
the last stage's output_layer.weight is keyed as the first stage's embedding.word_embeddings.weight with
replica_id (1, 0, dp), a replica that is never written, and is read back under that key). Megatron's legacy
torch format saves both copies (the last stage's whole state_dict). Once is right here: a name must resolve to
one set of elements, since a load at one stage (or the tools' consolidation) needs exactly one word embedding,
and the two copies are equal by construction -- the embedding group sums their gradients
(zero/pipeline_grads.py), so their master weights and Adam moments take the same steps.
"""

from __future__ import annotations

from parallel.state import ParallelState


def gather_stage_tables(table: dict[str, dict], state: ParallelState) -> list[dict[str, dict]]:
    """Every stage's parameter table (whole shapes by name), in stage order; every rank calls this.
    A stage's table is the union of its ranks' (in rank order): with expert parallelism each rank holds
    its own experts (named by global index); otherwise the ranks of a stage hold the same names."""
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
