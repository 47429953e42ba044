"""A pipeline stage's iteration, planned: the rank's slots of the schedule run on the meta device, holding what
training/pipeline_step.py's PipelineTrainStep holds, and the figures only stages have (p2p bytes, the bubble).

The slots are the executor's own (parallel/pipeline_schedules.py, Megatron-Core's 1F1B and interleaved 1F1B), and
each forward slot runs the stage's model chunk (`GPTModel.chunk_forward`) under the live activation meter, so
what autograd saves is measured, not modelled: a forward's saved tensors stay until its backward slot, so 1F1B
keeps min(P - s, M) micro-batches' activations on stage s (the first stage most) and interleaving keeps
Megatron's warm-up count (P - s - 1) x 2 + (vp - 1) x P + 1 chunk-forwards of L / (P x vp) layers.

What the executor adds on top, counted here: PipelineP2P posts every send at once and completes it at a receive
of its rank SEND_LAG slots later (parallel/p2p.py), so each sent activation [micro_batch, seq, hidden] (the
sequence a TP rank's slice under sequence parallelism; every forward that does not end the model) and each sent
input gradient (every backward that does not start it) stays alive until then; and the gradient received for a
backward is alive while it runs. The slots run through the executor's own PipelineP2P over the dry run's
communicator, so the sends held are its count and the point-to-point bytes (comm_bytes' "pp" group, sent and
received) are counted by the code that counts them live.

A plan must not cost M forward and backward passes of a stage when M is in the thousands (Megatron's GPT-3 175B
at DP 1 runs 1536), so it simulates M' = the fewest micro-batches that reach the schedule's steady state (after
the warm-up, one forward and one backward), where the saved activations peak, and adds the sends and the TP
and DP traffic of the M - M' micro-batches it did not run, as the plain dry run does for accumulation steps.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Optional

import torch

from gpt.stage_layers import activation_shape
from parallel.context_parallel import batch_on_this_rank
from parallel.p2p import ACTIVATION, GRADIENT, PipelineP2P, send_lag
from parallel.pipeline_schedules import check_interleaving, peak_held_by_forwards, schedule
from zero.pipeline_grads import PipelineGradients

META = torch.device("meta")


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


def run_pipeline_iteration(model, zero, plan, state, monitor, probe) -> tuple[dict[str, int], PipelineFigures]:
    """The rank's slots, as PipelineTrainStep.forward_backward runs them, then the step's collectives (as the
    plain dry run's `_one_iteration`). Returns gloo's largest copies {"passes", "step"} and the figures."""
    config = plan.config
    stages, stage = state.pipeline_parallel_size, state.pipeline_parallel_rank
    chunks = len(model.stage.chunks)
    micro_batches = plan.batch.final_accumulation_steps
    group = config.training.microbatch_group_size_per_virtual_pipeline_stage
    if chunks > 1:
        check_interleaving(micro_batches, stages, chunks, group)  # the run's M, not the simulated M'
    simulated = simulated_micro_batches(micro_batches, stages, stage, chunks, group)
    micro, seq = config.training.micro_batch_size, config.model.seq_length
    dtype = next(model.parameters()).dtype
    tokens = torch.zeros((micro, seq + 1), dtype=torch.long, device=META)
    # with context parallelism a stage runs and sends its CP rank's chunks (training/pipeline_step.py)
    inputs, labels = (batch_on_this_rank(part, state) for part in (tokens[:, :-1], tokens[:, 1:]))
    shape = activation_shape(inputs, config.model.hidden_size, model, state.tensor_parallel_size)
    message = math.prod(shape) * torch.finfo(dtype).bits // 8
    reducer = zero.reducer
    tied = model.word_embeddings if model.tied_output else None
    gradients = PipelineGradients(zero, tied.weight if tied is not None else None, state.embedding_group,
                                  state.pipeline_parallel_group, state.is_first_stage)
    reducer.zero_grad()
    state.comm.stats.snapshot_and_reset()
    p2p = PipelineP2P(META, state.comm, send_lag(stages, group if chunks > 1 else None))
    slots = schedule(simulated, stages, stage, chunks, group)
    last_backward = max(index for index, slot in enumerate(slots) if slot.kind == "B")
    outputs: dict[tuple[int, int], tuple[Optional[torch.Tensor], torch.Tensor]] = {}
    most_held = forward_peak = 0
    backward_points: list[int] = []  # bytes live at a backward's start and at each collective inside one
    # (F or B, chunk): the TP and DP bytes of that chunk's first forward, and of its first backward under no_sync,
    # which each micro-batch not simulated sends again
    repeated: dict[tuple[str, int], dict[str, dict[str, int]]] = {}

    def virtual(slot) -> int:
        return slot.chunk * stages + stage

    if probe.progress is not None:
        probe.progress.planned = simulated
    for index, slot in enumerate(slots):
        p2p.start_slot()
        starts, ends = virtual(slot) == 0, virtual(slot) == chunks * stages - 1
        if probe.progress is not None:
            probe.progress.micro_batch = slot.micro_batch
        if slot.kind == "F":
            received = None if starts else p2p.receive(shape, dtype, state.stage_rank(virtual(slot) - 1),
                                                       ACTIVATION).requires_grad_()
            probe.phase = "forward"
            before = state.comm.stats.snapshot()
            with monitor.measuring():
                if ends:
                    output = model.chunk_forward(slot.chunk, inputs if starts else received,
                                                 labels).float().mean() / micro_batches
                else:
                    output = model.chunk_forward(slot.chunk, inputs if starts else received)
            outputs[(slot.micro_batch, slot.chunk)] = (received, output)
            repeated.setdefault(("F", slot.chunk), _difference(state.comm.stats.snapshot(), before))
            if not ends:
                p2p.send(output, state.stage_rank(virtual(slot) + 1), ACTIVATION)
            most_held = max(most_held, p2p.held_sends)
            forward_peak = max(forward_peak, monitor.meter.peak["device"] + p2p.held_sends * message)
        else:
            received, output = outputs.pop((slot.micro_batch, slot.chunk))
            grad = None if ends else p2p.receive(output.shape, output.dtype, state.stage_rank(virtual(slot) + 1),
                                                 GRADIENT)
            beside = p2p.held_sends * message + (0 if ends else message)  # held sends, the received gradient
            backward_points.append(monitor.meter.live["device"] + beside)
            before = state.comm.stats.snapshot()
            probe.phase = "backward"

            def at_collective(copy_bytes: int, beside: int = beside) -> None:
                # What a backward that reduces gradients holds when each collective starts: the activations
                # it has not yet freed and gloo's copy of that collective's buffer.
                backward_points.append(monitor.meter.live["device"] + beside + copy_bytes)

            state.comm.on_transport_copy = at_collective
            try:
                with contextlib.nullcontext() if index == last_backward else reducer.no_sync():
                    with probe.backward_meter.hooks():
                        if ends:
                            zero.scale_loss(output).backward()
                        else:
                            output.backward(grad)
                reducer.finish_grad_sync()
            finally:
                state.comm.on_transport_copy = None
            after = state.comm.stats.snapshot()
            if index != last_backward:
                repeated.setdefault(("B", slot.chunk), _difference(after, before))
            if not starts:
                p2p.send(received.grad, state.stage_rank(virtual(slot) - 1), GRADIENT)
            most_held = max(most_held, p2p.held_sends)
    p2p.finish_sends()
    # The micro-batches not simulated: each sends and receives what a simulated one does (one message per model
    # chunk boundary it crosses, each way), each chunk's forward sends what its first did (TP's collectives), and
    # its backward under no_sync what the first one did (TP's, and stage 2 reduces every micro-batch).
    unsimulated = micro_batches - simulated
    virtual_stages = _virtual_stages(stages, stage, chunks)
    sends_per_micro_batch = sum(virtual_stage != 0 for virtual_stage in virtual_stages) + \
        sum(virtual_stage != chunks * stages - 1 for virtual_stage in virtual_stages)
    state.comm.stats.add("pp", "send", unsimulated * sends_per_micro_batch * message)
    state.comm.stats.add("pp", "recv", unsimulated * sends_per_micro_batch * message)
    if unsimulated:
        for slot_bytes in repeated.values():
            for group, kinds in slot_bytes.items():
                for kind, num_bytes in kinds.items():
                    state.comm.stats.add(group, kind, num_bytes * unsimulated)
    point_to_point = state.comm.stats.snapshot()["pp"]
    passes_copy = state.comm.take_largest_transport_copy()
    # PipelineTrainStep's end of the passes and the step: the tied embedding's copies summed, the loss broadcast
    # from the last stage, the norm summed over the stages
    gradients.sum_shared_embedding()
    loss_sum = torch.zeros((), device=META)
    state.comm.broadcast(loss_sum, state.stage_rank(-1), state.pipeline_parallel_group, "pp")
    optimizer = zero.optimizer
    optimizer.grad_norm_squared(optimizer.gradients.partition_gradients())
    optimizer.publish_parameters()
    state.comm.all_reduce(loss_sum, state.data_parallel_group, "dp")
    # The peak of the passes: a forward's, a backward's start, or a collective inside a backward that reduces
    # gradients (the last one at ZeRO 0-1, every one at ZeRO 2) with what was still live as it started. Counting
    # the copy on top of all a backward held at its start planned tests/planner/test_plan_pipeline_live.py's last
    # stage at 90.0 MiB, measured 72: its reduce-scatter starts once a bucket of gradients is ready, when those
    # layers' activations are gone. Read at the collective, the plan is 78.0 MiB.
    pass_peak = max([forward_peak] + backward_points)
    figures = PipelineFigures(
        pipeline_parallel_size=stages, pipeline_parallel_rank=stage, chunks=chunks, micro_batches=micro_batches,
        simulated_micro_batches=simulated, peak_chunk_forwards_in_flight=peak_held_by_forwards(slots, [1] * chunks),
        p2p_message_bytes=message,
        # the micro-batches not simulated repeat the steady state: they hold no more sends at once
        p2p_held_bytes=most_held * message,
        pass_peak_bytes=pass_peak,
        p2p_sent_bytes=point_to_point["send"],
        bubble_fraction=bubble_fraction(stages, micro_batches, chunks))
    return {"passes": passes_copy, "step": state.comm.take_largest_transport_copy()}, figures


def _difference(after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The TP and DP bytes counted between two snapshots (the point-to-point bytes are added by message count)."""
    # (a group counted from its first use, "cp", is missing before it)
    return {group: {kind: after[group][kind] - before.get(group, {}).get(kind, 0) for kind in kinds}
            for group, kinds in after.items() if group != "pp"}


def _virtual_stages(stages: int, stage: int, chunks: int) -> list[int]:
    return [chunk * stages + stage for chunk in range(chunks)]
