"""Pipeline schedules as data: for one pipeline rank, the ordered slots (forward or backward, micro-batch,
model chunk) it runs in one iteration. The executor (training/pipeline_step.py) only walks this list, so
the order a test checks is the order that runs.

Both schedules are Megatron-Core's (megatron/core/pipeline_parallel/schedules.py, github:NVIDIA/Megatron-LM):

- 1F1B (PipeDream-flush), `forward_backward_pipelining_without_interleaving`: rank r runs
  min(pp - r - 1, M) warm-up forwards, then one forward and one backward in turn, then the remaining
  backwards (cool-down).
- interleaved 1F1B, `forward_backward_pipelining_with_interleaving`: each rank holds `vp` model chunks; the
  M x vp virtual micro-batches run in groups of G (--microbatch-group-size-per-virtual-pipeline-stage, default
  pp) per chunk (`get_schedule_table`, `get_model_chunk_id`, `get_microbatch_id_in_model_chunk`), with
  (pp - r - 1) * 2 + (vp - 1) * G warm-up forwards (`get_pp_rank_microbatches`; all of them where that reaches
  M x vp: at d98e8a64 there is no special case for M == pp any more). With the default group M must be a
  multiple of pp; otherwise G lies in [pp, M] and M mod G is 0 or at least pp (Megatron raises the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence

from base.errors import ConfigError


@dataclass(frozen=True)
class VirtualStages:
    """The virtual-stage arithmetic, written once: with `chunks` model chunks per stage, chunk c of pipeline
    rank r is virtual stage c x PP + r of the model's chunks x PP, in the order a micro-batch runs through them
    (Megatron-Core: a chunk's layer offset is (vp_rank x PP + pp_rank) x layers per chunk,
    get_transformer_layer_offset; its p2p neighbours are the previous and next virtual stages, the ring of
    forward_backward_pipelining_with_interleaving). Without interleaving, chunks = 1 and it is the stage."""
    pp_size: int
    pp_rank: int
    chunks: int = 1

    def of(self, chunk: int) -> int:
        """The virtual stage of this rank's model chunk `chunk`."""
        return chunk * self.pp_size + self.pp_rank

    @property
    def last(self) -> int:
        """The model's last virtual stage (the one that computes the loss)."""
        return self.chunks * self.pp_size - 1

    def starts_model(self, chunk: int) -> bool:
        return self.of(chunk) == 0

    def ends_model(self, chunk: int) -> bool:
        return self.of(chunk) == self.last

    def all(self) -> list[int]:
        """This rank's virtual stages, chunk by chunk."""
        return [self.of(chunk) for chunk in range(self.chunks)]


@dataclass(frozen=True)
class Slot:
    kind: Literal["F", "B"]
    micro_batch: int
    chunk: int = 0  # the model chunk (virtual stage) on this rank; 0 without interleaving


def one_f_one_b(num_micro_batches: int, pp_size: int, pp_rank: int) -> list[Slot]:
    """Megatron's non-interleaved 1F1B order of rank `pp_rank`."""
    _check_rank(num_micro_batches, pp_size, pp_rank)
    warmup = min(pp_size - pp_rank - 1, num_micro_batches)
    steady = num_micro_batches - warmup
    slots = [Slot("F", m) for m in range(warmup)]
    for index in range(steady):
        slots += [Slot("F", warmup + index), Slot("B", index)]
    slots += [Slot("B", steady + index) for index in range(warmup)]
    return slots


def schedule_table(num_micro_batches: int, vp_size: int, group_size: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch in forward order, Megatron-Core's get_schedule_table
    (megatron/core/pipeline_parallel/schedules.py): the micro-batches go in groups of `group_size`
    (--microbatch-group-size-per-virtual-pipeline-stage, default --pipeline-model-parallel-size), each group
    through chunk 0, then chunk 1, ...; the last group takes every micro-batch left."""
    table: list[tuple[int, int]] = []
    for first in range(0, num_micro_batches, group_size):
        end = num_micro_batches if first + group_size >= num_micro_batches else first + group_size
        table += [(micro_batch, chunk) for chunk in range(vp_size) for micro_batch in range(first, end)]
    return table


def interleaved_one_f_one_b(num_micro_batches: int, pp_size: int, pp_rank: int, vp_size: int,
                            group_size: Optional[int] = None) -> list[Slot]:
    """Megatron's interleaved 1F1B order of rank `pp_rank` holding `vp_size` model chunks, the micro-batches
    in groups of `group_size` per chunk (default `pp_size`)."""
    _check_rank(num_micro_batches, pp_size, pp_rank)
    group_size = pp_size if group_size is None else group_size
    check_interleaving(num_micro_batches, pp_size, vp_size, group_size)
    total = num_micro_batches * vp_size
    # Megatron-Core's get_pp_rank_microbatches: (pp - r - 1) x 2 + (vp - 1) x group warm-up forwards, all of
    # them when that reaches the total.
    warmup = min((pp_size - pp_rank - 1) * 2 + (vp_size - 1) * group_size, total)
    steady = total - warmup
    table = schedule_table(num_micro_batches, vp_size, group_size)

    def slot(kind: Literal["F", "B"], virtual: int) -> Slot:
        # get_model_chunk_id: the table's chunk, reversed for a backward; a chunk's backwards pop its forwards'
        # inputs first in, first out, so the k-th backward is the k-th table entry's micro-batch
        micro_batch, chunk = table[virtual]
        return Slot(kind, micro_batch, vp_size - chunk - 1 if kind == "B" else chunk)

    slots = [slot("F", k) for k in range(warmup)]
    for k in range(steady):
        slots += [slot("F", k + warmup), slot("B", k)]
    slots += [slot("B", k) for k in range(steady, total)]
    return slots


def schedule(num_micro_batches: int, pp_size: int, pp_rank: int, vp_size: Optional[int] = None,
             group_size: Optional[int] = None) -> list[Slot]:
    """The slots of rank `pp_rank`: interleaved when `vp_size` (chunks per rank) is above 1, its micro-batches
    in groups of `group_size` (None: `pp_size`)."""
    if vp_size is not None and vp_size > 1:
        return interleaved_one_f_one_b(num_micro_batches, pp_size, pp_rank, vp_size, group_size)
    return one_f_one_b(num_micro_batches, pp_size, pp_rank)


def peak_held_by_forwards(slots: Sequence[Slot], held_by_chunk: Sequence[int]) -> int:
    """The most a rank holds at once when each forward of chunk c keeps `held_by_chunk[c]` until its backward
    (what autograd saves in a chunk's forward lives until that backward): with ones, the most forwards that
    await their backward."""
    held = peak = 0
    for slot in slots:
        held += held_by_chunk[slot.chunk] if slot.kind == "F" else -held_by_chunk[slot.chunk]
        peak = max(peak, held)
    return peak


GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"


def check_interleaving(num_micro_batches: int, pp_size: int, vp_size: int, group_size: Optional[int] = None) -> None:
    # Megatron-Core's forward_backward_pipelining_with_interleaving raises when the group size
    # (config.microbatch_group_size_per_vp_stage, default the pipeline size) is outside [PP, M], and when the
    # last group, M mod group, is not 0 and smaller than PP ("dependency bubbles"); with the default group that
    # is M a multiple of PP. It refuses pp 1 with virtual stages.
    if pp_size < 2:
        raise ConfigError("--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size > 1: "
                          "drop it, or use pipeline stages")
    if group_size is None or group_size == pp_size:
        if num_micro_batches % pp_size:
            raise ConfigError(f"the interleaved pipeline schedule needs the micro-batches per iteration "
                              f"({num_micro_batches}) to be a multiple of --pipeline-model-parallel-size {pp_size}: "
                              f"change --global-batch-size or --micro-batch-size, or drop the interleaving "
                              f"(--num-layers-per-virtual-pipeline-stage, or a --pipeline-model-parallel-layout with "
                              f"more virtual stages than stages)")
        return
    if not pp_size <= group_size <= num_micro_batches:
        raise ConfigError(f"{GROUP_FLAG} {group_size}: the micro-batches of a group run through each model chunk "
                          f"in turn, and Megatron needs between --pipeline-model-parallel-size {pp_size} and the "
                          f"micro-batches per iteration ({num_micro_batches}) in a group", flags=(GROUP_FLAG,))
    last = num_micro_batches % group_size
    if 0 < last < pp_size:
        raise ConfigError(f"{GROUP_FLAG} {group_size}: the last group of the {num_micro_batches} micro-batches per "
                          f"iteration would hold {last}, fewer than --pipeline-model-parallel-size {pp_size} "
                          f"(Megatron refuses the dependency bubble); pick a group size that divides the "
                          f"micro-batches or leaves at least {pp_size}", flags=(GROUP_FLAG,))


def _check_rank(num_micro_batches: int, pp_size: int, pp_rank: int) -> None:
    if num_micro_batches < 1:
        raise ValueError(f"a pipeline schedule needs at least one micro-batch, got {num_micro_batches}")
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pipeline rank {pp_rank} is not in [0, {pp_size})")
