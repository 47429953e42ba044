"""The pipeline split the layout search prices and prints: how many transformer layers each model chunk of each
pipeline rank holds, balanced with the output layer's cost, and the Megatron-Core
--pipeline-model-parallel-layout string that realises it (gpt/pipeline_layout.py parses it back).

Megatron's even split (no layout, --account-for-loss-in-pipeline-split off) gives the last stage as many layers
as the others and the logits GEMM on top; the 1F1B pipeline then runs at that stage's pace. A layout string
places any split (Megatron-Core's PipelineParallelLayerLayout, megatron/core/transformer/
pipeline_parallel_layer_layout.py: virtual stage k is chunk k // PP of rank k % PP), so the search gives the
output layer's rank fewer layers where that lowers the slowest rank's load.
"""

from __future__ import annotations

StageCounts = tuple[tuple[int, ...], ...]   # [pipeline rank][model chunk] -> transformer layers


def rank_loads(counts: StageCounts, output_layer_units: float) -> list[float]:
    """Each rank's work per micro-batch, in transformer layers: its layers, and the last rank the output layer."""
    loads = [float(sum(chunks)) for chunks in counts]
    loads[-1] += output_layer_units
    return loads


def balanced_stage_counts(layers: int, pp: int, vp: int, output_layer_units: float) -> StageCounts:
    """The split whose slowest rank is least loaded, every rank holding at least one layer (gpt/pipeline_layout.py
    refuses a rank without one). `output_layer_units`: the logits' cost in transformer layers (one layer's FLOPs
    = 1). Starting from the even split (the first ranks take the remainder, as Megatron's uneven splits do), a
    layer moves from the most to the least loaded rank while that lowers the maximum: with unit moves and a
    fixed extra on one rank this reaches the least possible maximum. Within a rank the layers spread over its
    chunks evenly, its first chunks taking the remainder (so the output layer's chunk is the lightest)."""
    if pp < 1 or vp < 1 or layers < pp:
        raise ValueError(f"{layers} layers cannot fill {pp} pipeline ranks")
    totals = [layers // pp + (1 if rank < layers % pp else 0) for rank in range(pp)]
    while True:
        loads = [total + (output_layer_units if rank == pp - 1 else 0.0) for rank, total in enumerate(totals)]
        heaviest = max(range(pp), key=lambda rank: (loads[rank], rank))  # ties: the output layer's rank gives first
        lightest = min(range(pp), key=lambda rank: (loads[rank], rank))
        if totals[heaviest] <= 1 or loads[lightest] + 1 >= loads[heaviest]:
            break
        totals[heaviest] -= 1
        totals[lightest] += 1
    return tuple(tuple(total // vp + (1 if chunk < total % vp else 0) for chunk in range(vp)) for total in totals)


def even_stage_counts(layers: int, pp: int, vp: int) -> StageCounts | None:
    """Megatron's even split (no layout string): every model chunk the same layers; None where they do not divide."""
    if layers % (pp * vp):
        return None
    return tuple((layers // (pp * vp),) * vp for _ in range(pp))


def layout_string(counts: StageCounts) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for `counts`: the virtual stages in order (chunk-major),
    E before the first layer and L after the last, `|` between stages; a run of n > 3 layers written `t*n`."""
    pp, vp = len(counts), len(counts[0])
    stages = []
    for index in range(pp * vp):
        layers = counts[index % pp][index // pp]
        body = "t" * layers if layers <= 3 else f"t*{layers}"
        stages.append(("E" if index == 0 else "") + body + ("L" if index == pp * vp - 1 else ""))
    return "|".join(stages)
