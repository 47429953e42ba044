"""The pipeline split the layout search prices and prints: the layers each model chunk of each rank holds, balanced with
the output layer's cost, and the --pipeline-model-parallel-layout string that realises it. Megatron's even split puts
the logits on top of a full last stage, which then sets the pipeline's pace."""

from __future__ import annotations

StageCounts = tuple[tuple[int, ...], ...]   # [pipeline rank][model chunk] -> transformer layers


def rank_loads(counts: StageCounts, output_layer_units: float) -> list[float]:
    """Each rank's work per micro-batch in transformer layers, the last rank's including the output layer."""
    loads = [float(sum(chunks)) for chunks in counts]
    loads[-1] += output_layer_units
    return loads


def balanced_stage_counts(layers: int, pp: int, vp: int, output_layer_units: float) -> StageCounts:
    """The split whose slowest rank is least loaded, every rank holding a layer. `output_layer_units`: the logits' cost
    in transformer layers. From the even split, a layer moves from the most to the least loaded rank while that lowers
    the maximum; within a rank the first chunks take the remainder."""
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


def layout_string(counts: StageCounts, mtp_depth: int = 0) -> str:
    """--pipeline-model-parallel-layout for `counts`: virtual stages chunk-major, E first, the MTP layers (m) and L
    last, `|` between, `t*n` runs."""
    pp, vp = len(counts), len(counts[0])
    stages = []
    for index in range(pp * vp):
        layers = counts[index % pp][index // pp]
        body = "t" * layers if layers <= 3 else f"t*{layers}"
        last = "m" * mtp_depth + "L" if index == pp * vp - 1 else ""
        stages.append(("E" if index == 0 else "") + body + last)
    return "|".join(stages)
