"""A pipeline stage's iteration, planned: the dry run runs training/pipeline_step.py's PipelineTrainStep itself on
the meta device, and PipelinePlanObserver (the step's observer, training/step_observer.py) measures what the rank
holds at each slot and the figures only stages have (p2p bytes, the bubble).

The slots are the executor's own (parallel/pipeline_schedules.py: 1F1B and interleaved 1F1B), each forward running
the stage's chunk (`GPTModel.chunk_forward`) under the live activation meter, so what autograd saves is measured:
a forward's saved tensors stay until its backward, so 1F1B keeps min(P - s, M) micro-batches' activations on stage s
and interleaving Megatron's warm-up count (P - s - 1) x 2 + (vp - 1) x P + 1 chunk-forwards of L / (P x vp) layers.
What the executor adds is counted too: PipelineP2P completes each send at a receive SEND_LAG slots later
(parallel/p2p.py), so each sent activation and input gradient stays alive until then, and a received gradient
while its backward runs; the slots run through the step's own PipelineP2P over the dry run's communicator, so the
sends held and the "pp" bytes are counted by the live code.

A plan must not cost M passes when M is in the thousands (GPT-3 175B at DP 1 runs 1536): it simulates M' = the fewest
micro-batches that reach the steady state (one forward and one backward after the warm-up), where the saved
activations peak, and adds the sends and the TP and DP traffic of the M - M' it did not run."""

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
    """What stages add to a rank's plan. Bytes per GPU."""
    pipeline_parallel_size: int
    pipeline_parallel_rank: int
    chunks: int                  # model chunks on this stage (vp; 1 without interleaving)
    micro_batches: int           # M, per iteration
    simulated_micro_batches: int  # M' (see the module docstring)
    peak_chunk_forwards_in_flight: int  # forwards whose backward has not run yet, at most
    p2p_message_bytes: int       # one activation or gradient [micro_batch, seq, hidden]
    p2p_held_bytes: int          # the most sends held at once (PipelineP2P: until a receive SEND_LAG slots on)
    pass_peak_bytes: int         # saved activations, held sends, a received gradient and gloo's copy, at their peak
    gradient_arrival_peak_bytes: int  # what is live as a parameter's gradient arrives, with it, at the most
    p2p_sent_bytes: int          # sent by this rank per iteration (activations forward, gradients back)
    bubble_fraction: float       # of the iteration's time, see bubble_fraction()


def bubble_fraction(stages: int, micro_batches: int, chunks: int = 1) -> float:
    """The pipeline bubble as a fraction of the iteration's time. Narayanan et al. 2021 (Efficient Large-Scale
    Language Model Training on GPU Clusters Using Megatron-LM, sections 2.2.1-2.2.2): the bubble over the ideal
    time is (p - 1) / m for 1F1B and (p - 1) / (v m) interleaved; as a fraction of the whole (ideal + bubble)
    that is (p - 1) / (v m + p - 1). Equal forward and backward times per stage assumed, as there."""
    return (stages - 1) / (chunks * micro_batches + stages - 1)


def simulated_micro_batches(micro_batches: int, stages: int, stage: int, chunks: int,
                            group_size: Optional[int] = None) -> int:
    """M': 1F1B reaches its steady state on stage s after P - s - 1 warm-up forwards, so P - s micro-batches
    hold its peak, and at least two, so that a backward under no_sync (what each micro-batch not simulated
    sends) runs before the last; interleaved needs a multiple of P, and 2P covers the longest warm-up,
    (P - 1) x 2 + (vp - 1) x P. With a --microbatch-group-size-per-virtual-pipeline-stage other than P the groups
    (and the last, which takes the remainder) depend on M: all M run."""
    if chunks > 1:
        if group_size is not None and group_size != stages:
            return micro_batches
        return micro_batches if micro_batches <= 2 * stages else 2 * stages
    return min(micro_batches, max(stages - stage, 2))


class PipelinePlanObserver(PlanObserver):
    """Watches a PipelineTrainStep's iteration for the plan: it runs M' of the M micro-batches, measures at each
    slot what the stage holds (saved activations, held sends, a received gradient, gloo's copy at each collective
    of a backward) and adds what the micro-batches not run send. `p2p` is the step's PipelineP2P (set once the
    step is built); `message` the bytes of one activation or gradient."""

    def __init__(self, comm, monitor, probe, message: int) -> None:
        super().__init__(comm, monitor, probe)
        self.message = message
        self.p2p: Optional[PipelineP2P] = None
        self.stages = self.stage = self.chunks = self.micro_batches_total = 0
        self.slots: list = []
        self.last_backward = -1
        self.most_held = self.forward_peak = 0
        self.backward_points: list[int] = []  # bytes live at a backward's start and at each collective inside one
        self.gradient_arrivals: list[int] = []  # bytes live as each parameter gradient arrives, with it
        self._beside = 0
        # (F or B, chunk): the TP and DP bytes of that chunk's first forward, and of its first backward under no_sync,
        # which each micro-batch not simulated sends again
        self.slot_repeated: dict[tuple[str, int], dict[str, dict[str, int]]] = {}
        self.point_to_point: dict[str, int] = {}
        self._slot = None

    def pipeline_micro_batches(self, accumulation_steps: int, stages: int, stage: int, chunks: int,
                               group_size: Optional[int]) -> int:
        if chunks > 1:
            check_interleaving(accumulation_steps, stages, chunks, group_size)  # the run's M, not the simulated M'
        self.micro_batches_total, self.stages, self.stage, self.chunks = accumulation_steps, stages, stage, chunks
        self.steps = simulated_micro_batches(accumulation_steps, stages, stage, chunks, group_size)
        if self.progress is not None:
            self.progress.planned = self.steps
        return self.steps

    def watch_parameter_gradients(self, parameters) -> None:
        """A parameter's gradient exists from its arrival until the reducer's hook takes it (into its main gradient,
        or added in place where the gradients are views of the buffer): read what is live then, the embedding's
        last in its chunk's backward, when that chunk's saved tensors are freed."""
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
        beside = self.p2p.held_sends * self.message + (0 if ends else self.message)  # held sends, received gradient
        self._beside = beside
        self.backward_points.append(self.monitor.meter.live["device"] + beside)
        self._before = self.comm.stats.snapshot()

        def at_collective(copy_bytes: int) -> None:
            # What a backward that reduces gradients holds when each collective starts: the activations it has
            # not yet freed and gloo's copy of that collective's buffer.
            self.backward_points.append(self.monitor.meter.live["device"] + beside + copy_bytes)

        self.comm.on_transport_copy = at_collective  # until the slot's gradient synchronization is done
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
        # The micro-batches not simulated: each sends and receives what a simulated one does (one message per model
        # chunk boundary it crosses, each way), each chunk's forward sends what its first did (TP's collectives), and
        # its backward under no_sync what the first one did (TP's, and stage 2 reduces every micro-batch).
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
        """The stage's figures, once the step ran. The peak of the passes: a forward's, a backward's start, or a
        collective inside a backward that reduces gradients (the last one at ZeRO 0-1, every one at ZeRO 2) with
        what was still live as it started. Counting the copy on top of all a backward held at its start planned
        tests/planner/test_plan_pipeline_live.py's last stage at 90.0 MiB, measured 72: its reduce-scatter starts
        once a bucket of gradients is ready, when those layers' activations are gone. Read at the collective, the
        plan is 78.0 MiB."""
        return PipelineFigures(
            pipeline_parallel_size=self.stages, pipeline_parallel_rank=self.stage, chunks=self.chunks,
            micro_batches=self.micro_batches_total, simulated_micro_batches=self.steps,
            peak_chunk_forwards_in_flight=peak_held_by_forwards(self.slots, [1] * self.chunks),
            p2p_message_bytes=self.message,
            # the micro-batches not simulated repeat the steady state: they hold no more sends at once
            p2p_held_bytes=self.most_held * self.message,
            pass_peak_bytes=max([self.forward_peak] + self.backward_points),
            gradient_arrival_peak_bytes=max(self.gradient_arrivals, default=0),
            p2p_sent_bytes=self.point_to_point["send"],
            bubble_fraction=bubble_fraction(self.stages, self.micro_batches_total, self.chunks))


def message_bytes(model, config, tokens, tensor_parallel_size: int) -> int:
    """One activation or gradient a stage sends, in bytes: [micro_batch, seq, hidden] (a TP rank's slice of the
    sequence under sequence parallelism), in the model's dtype."""
    shape = activation_shape(tokens, config.model.hidden_size, model, tensor_parallel_size)
    return math.prod(shape) * torch.finfo(next(model.parameters()).dtype).bits // 8

