"""Pipeline schedules as data: for one pipeline rank, the ordered slots (forward or backward, micro-batch, model chunk)
it runs in one iteration, Megatron-Core's 1F1B and interleaved 1F1B orders. The executor only walks this list, so the
order a test checks is the order that runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence

from base.errors import ConfigError


@dataclass(frozen=True)
class VirtualStages:
    """The virtual-stage arithmetic: chunk c of pipeline rank r is virtual stage c x PP + r, in the order a micro-batch
    runs through them; without interleaving it is the stage."""
    pp_size: int
    pp_rank: int
    chunks: int = 1

    def of(self, chunk: int) -> int:
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
        return [self.of(chunk) for chunk in range(self.chunks)]


@dataclass(frozen=True)
class Slot:
    kind: Literal["F", "B"]
    micro_batch: int
    chunk: int = 0  # the model chunk on this rank; 0 without interleaving


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
    """(micro-batch, chunk) of each virtual micro-batch in forward order (Megatron-Core's get_schedule_table): groups of
    `group_size` micro-batches through chunk 0, then chunk 1, ...; the last group takes the rest."""
    table: list[tuple[int, int]] = []
    for first in range(0, num_micro_batches, group_size):
        end = num_micro_batches if first + group_size >= num_micro_batches else first + group_size
        table += [(micro_batch, chunk) for chunk in range(vp_size) for micro_batch in range(first, end)]
    return table


def interleaved_one_f_one_b(num_micro_batches: int, pp_size: int, pp_rank: int, vp_size: int,
                            group_size: Optional[int] = None) -> list[Slot]:
    """Megatron's interleaved 1F1B order of rank `pp_rank` holding `vp_size` chunks, micro-batches in groups of
    `group_size`."""
    _check_rank(num_micro_batches, pp_size, pp_rank)
    group_size = pp_size if group_size is None else group_size
    check_interleaving(num_micro_batches, pp_size, vp_size, group_size)
    total = num_micro_batches * vp_size
    # get_pp_rank_microbatches' warm-up forwards, all of them when that reaches the total
    warmup = min((pp_size - pp_rank - 1) * 2 + (vp_size - 1) * group_size, total)
    steady = total - warmup
    table = schedule_table(num_micro_batches, vp_size, group_size)

    def slot(kind: Literal["F", "B"], virtual: int) -> Slot:
        # a chunk's backwards run its forwards' micro-batches first in, first out
        micro_batch, chunk = table[virtual]
        return Slot(kind, micro_batch, vp_size - chunk - 1 if kind == "B" else chunk)

    slots = [slot("F", k) for k in range(warmup)]
    for k in range(steady):
        slots += [slot("F", k + warmup), slot("B", k)]
    slots += [slot("B", k) for k in range(steady, total)]
    return slots


def schedule(num_micro_batches: int, pp_size: int, pp_rank: int, vp_size: Optional[int] = None,
             group_size: Optional[int] = None) -> list[Slot]:
    """The slots of rank `pp_rank`: interleaved when `vp_size` is above 1."""
    if vp_size is not None and vp_size > 1:
        return interleaved_one_f_one_b(num_micro_batches, pp_size, pp_rank, vp_size, group_size)
    return one_f_one_b(num_micro_batches, pp_size, pp_rank)


def peak_held_by_forwards(slots: Sequence[Slot], held_by_chunk: Sequence[int]) -> int:
    """The most a rank holds at once when each forward of chunk c keeps `held_by_chunk[c]` until its backward."""
    held = peak = 0
    for slot in slots:
        held += held_by_chunk[slot.chunk] if slot.kind == "F" else -held_by_chunk[slot.chunk]
        peak = max(peak, held)
    return peak


GROUP_FLAG = "--microbatch-group-size-per-virtual-pipeline-stage"


def check_interleaving(num_micro_batches: int, pp_size: int, vp_size: int, group_size: Optional[int] = None) -> None:
    # Megatron-Core raises when the group size is outside [PP, M] or the last group is nonzero and under PP, and refuses
    # PP 1 with virtual stages
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
