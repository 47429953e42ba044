"""A pipeline stage's iteration, planned: the dry run runs the real PipelineTrainStep on the meta device and
PipelinePlanObserver measures what the rank holds at each slot, with the p2p bytes and the bubble. It simulates the
fewest micro-batches that reach the steady state, where saved activations peak, and adds the traffic of the rest."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Optional

import torch

from gpt.stage_layers import activation_shape
from parallel.p2p import PipelineP2P
from parallel.pipeline_schedules import VirtualStages, check_interleaving, peak_held_by_forwards
from planner.plan_observer import PlanObserver, comm_difference


@dataclass(frozen=True)
class PipelineFigures:
    """What stages add to a rank's plan, in bytes per GPU."""
    pipeline_parallel_size: int
    pipeline_parallel_rank: int
    chunks: int
    micro_batches: int           # M, per iteration
    simulated_micro_batches: int  # M', the micro-batches simulated
    peak_chunk_forwards_in_flight: int
    p2p_message_bytes: int       # one activation or gradient [micro_batch, seq, hidden]
    p2p_held_bytes: int  # the most sends held at once (each until a receive SEND_LAG slots on)
    pass_peak_bytes: int
    gradient_arrival_peak_bytes: int
    p2p_sent_bytes: int
    bubble_fraction: float


def bubble_fraction(stages: int, micro_batches: int, chunks: int = 1) -> float:
    """The bubble as a fraction of the iteration: (p - 1) / (v m + p - 1) (Narayanan et al. 2021, equal forward and
    backward times)."""
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def simulated_micro_batches(micro_batches: int, stages: int, stage: int, chunks: int,
                            group_size: Optional[int] = None) -> int:
    """M': the fewest micro-batches that hold stage s's peak (P - s, at least two so a no_sync backward runs before the
    last; interleaved 2P). With a microbatch group size other than P all M run."""
    if chunks > 1:
        if group_size is not None and group_size != stages:
            return micro_batches
        return micro_batches if micro_batches <= 2 * stages else 2 * stages
    return min(micro_batches, max(stages - stage, 2))


class PipelinePlanObserver(PlanObserver):
    """Runs M' of a PipelineTrainStep's M micro-batches, measures at each slot what the stage holds and adds what the
    micro-batches not run send. `p2p` is the step's PipelineP2P, set once the step is built."""

    def __init__(self, comm, monitor, probe, message: int) -> None:
        super().__init__(comm, monitor, probe)
        self.message = message
        self.p2p: Optional[PipelineP2P] = None
        self.stages = self.stage = self.chunks = self.micro_batches_total = 0
        self.slots: list = []
        self.last_backward = -1
        self.most_held = self.forward_peak = 0
        self.backward_points: list[int] = []
        self.gradient_arrivals: list[int] = []
        self._beside = 0
        # (F or B, chunk): the TP and DP bytes of its first pass, which each micro-batch not simulated sends again
        self.slot_repeated: dict[tuple[str, int], dict[str, dict[str, int]]] = {}
        self.point_to_point: dict[str, int] = {}
        self._slot = None

    def pipeline_micro_batches(self, accumulation_steps: int, stages: int, stage: int, chunks: int,
                               group_size: Optional[int]) -> int:
        if chunks > 1:
            check_interleaving(accumulation_steps, stages, chunks, group_size)
        self.micro_batches_total, self.stages, self.stage, self.chunks = accumulation_steps, stages, stage, chunks
        self.steps = simulated_micro_batches(accumulation_steps, stages, stage, chunks, group_size)
        if self.progress is not None:
            self.progress.planned = self.steps
        return self.steps

    def watch_parameter_gradients(self, parameters) -> None:
        """A gradient lives from its arrival until the reducer's hook takes it: read what is live then."""
        for parameter in parameters:
            parameter.register_hook(self._gradient_arrives)

    def _gradient_arrives(self, grad: torch.Tensor) -> None:
        self.gradient_arrivals.append(self.monitor.meter.live["device"] + self._beside + grad.numel() * grad.element_size())

    def schedule(self, slots) -> None:
        self.slots = list(slots)
        self.last_backward = max(index for index, slot in enumerate(slots) if slot.kind == "B")

    def _virtual_stages(self) -> VirtualStages:
        return VirtualStages(self.stages, self.stage, self.chunks)

    def slot_start(self, index: int, slot) -> None:
        self._slot = (index, slot)
        if self.progress is not None:
            self.progress.micro_batch = slot.micro_batch

    @contextlib.contextmanager
    def phase(self, name: str):
        index, slot = self._slot
        if name == "forward":
            before = self.comm.stats.snapshot()
            with super().phase(name):
                yield
            self.slot_repeated.setdefault(("F", slot.chunk), comm_difference(self.comm.stats.snapshot(), before, ("pp",)))
            return
        ends = self._virtual_stages().ends_model(slot.chunk)
        beside = self.p2p.held_sends * self.message + (0 if ends else self.message)
        self._beside = beside
        self.backward_points.append(self.monitor.meter.live["device"] + beside)
        self._before = self.comm.stats.snapshot()

        def at_collective(copy_bytes: int) -> None:
            # gloo's copy of a collective's buffer, on top of the activations not yet freed
            self.backward_points.append(self.monitor.meter.live["device"] + beside + copy_bytes)

        self.comm.on_transport_copy = at_collective
        with super().phase(name):
            yield

    def slot_end(self, index: int, slot) -> None:
        if slot.kind == "F":
            self.forward_peak = max(self.forward_peak,
                                    self.monitor.meter.peak["device"] + self.p2p.held_sends * self.message)
        else:
            self.comm.on_transport_copy = None
            if index != self.last_backward:
                self.slot_repeated.setdefault(("B", slot.chunk),
                                              comm_difference(self.comm.stats.snapshot(), self._before, ("pp",)))
        self.most_held = max(self.most_held, self.p2p.held_sends)

    def passes_end(self) -> None:
        unsimulated = self.micro_batches_total - self.steps
        virtual = self._virtual_stages()
        sends_per_micro_batch = sum(not virtual.starts_model(chunk) for chunk in range(self.chunks)) + \
            sum(not virtual.ends_model(chunk) for chunk in range(self.chunks))
        self.comm.stats.add("pp", "send", unsimulated * sends_per_micro_batch * self.message)
        self.comm.stats.add("pp", "recv", unsimulated * sends_per_micro_batch * self.message)
        for slot_bytes in self.slot_repeated.values():
            self.comm.stats.add_counts(slot_bytes, times=unsimulated)
        self.point_to_point = self.comm.stats.snapshot()["pp"]
        self.passes_copy = self.comm.take_largest_transport_copy()

    def figures(self) -> PipelineFigures:
        """The stage's figures, once the step ran. A backward's copy is counted at each collective, not on top of its
        start, since a bucket's reduce-scatter starts after its layers' activations are freed."""
        return PipelineFigures(
            pipeline_parallel_size=self.stages, pipeline_parallel_rank=self.stage, chunks=self.chunks,
            micro_batches=self.micro_batches_total, simulated_micro_batches=self.steps,
            peak_chunk_forwards_in_flight=peak_held_by_forwards(self.slots, [1] * self.chunks),
            p2p_message_bytes=self.message,
            # the micro-batches not simulated repeat the steady state
            p2p_held_bytes=self.most_held * self.message,
            pass_peak_bytes=max([self.forward_peak] + self.backward_points),
            gradient_arrival_peak_bytes=max(self.gradient_arrivals, default=0),
            p2p_sent_bytes=self.point_to_point["send"],
            bubble_fraction=bubble_fraction(self.stages, self.micro_batches_total, self.chunks))


def message_bytes(model, config, tokens, tensor_parallel_size: int) -> int:
    """One activation or gradient a stage sends: [micro_batch, seq, hidden] (a TP rank's slice under SP), model
    dtype."""
    shape = activation_shape(tokens, config.model.hidden_size, model, tensor_parallel_size)
    return math.prod(shape) * torch.finfo(next(model.parameters()).dtype).bits // 8

