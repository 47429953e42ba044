"""A pipeline stage's iteration, planned: the rank's slots of the schedule run on the meta device, holding what
training/pipeline_step.py's PipelineTrainStep holds, and the figures only stages have (p2p bytes, the bubble).

The slots are the executor's own (parallel/pipeline_schedules.py, Megatron-Core's 1F1B and interleaved 1F1B), and
each forward slot runs the stage's model chunk (`GPTModel.chunk_forward`) under the live activation meter, so
what autograd saves is measured, not modelled: a forward's saved tensors stay until its backward slot, so 1F1B
keeps min(P - s, M) micro-batches' activations on stage s (the first stage most) and interleaving keeps
Megatron's warm-up count (P - s - 1) x 2 + (vp - 1) x P + 1 chunk-forwards of L / (P x vp) layers.

What the executor adds on top, counted here: PipelineP2P posts every send at once and completes it at a receive
of its rank SEND_LAG slots later (parallel/p2p.py), so each sent activation [micro_batch, seq, hidden] (every
forward that does not end the model) and each sent input gradient (every backward that does not start it) stays
alive until then, replayed here with the same rule; and the gradient received for a backward is alive while it
runs.

A plan must not cost M forward and backward passes of a stage when M is in the thousands (Megatron's GPT-3 175B
at DP 1 runs 1536), so it simulates M' = the fewest micro-batches that reach the schedule's steady state (after
the warm-up, one forward and one backward), where the saved activations peak, and adds the sends and the DP
traffic of the M - M' micro-batches it did not run, as the plain dry run does for accumulation steps.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch

from parallel.p2p import SEND_LAG
from parallel.pipeline_schedules import schedule

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


def simulated_micro_batches(micro_batches: int, stages: int, stage: int, chunks: int) -> int:
    """M': 1F1B reaches its steady state on stage s after P - s - 1 warm-up forwards, so P - s micro-batches
    hold its peak; interleaved needs a multiple of P other than P itself (at M = P Megatron runs every forward
    as warm-up: a different schedule), and 2P covers the longest warm-up, (P - 1) x 2 + (vp - 1) x P."""
    if chunks > 1:
        return micro_batches if micro_batches <= 2 * stages else 2 * stages
    return min(micro_batches, stages - stage)


def run_pipeline_iteration(model, zero, plan, state, monitor, probe) -> tuple[dict[str, int], PipelineFigures]:
    """The rank's slots, as PipelineTrainStep.forward_backward runs them, then the step's collectives (as the
    plain dry run's `_one_iteration`). Returns gloo's largest copies {"passes", "step"} and the figures."""
    config = plan.config
    stages, stage = state.pipeline_parallel_size, state.pipeline_parallel_rank
    chunks = len(model.stage.chunks)
    micro_batches = plan.batch.final_accumulation_steps
    simulated = simulated_micro_batches(micro_batches, stages, stage, chunks)
    micro, seq, hidden = config.training.micro_batch_size, config.model.seq_length, config.model.hidden_size
    dtype = next(model.parameters()).dtype
    message = micro * seq * hidden * torch.finfo(dtype).bits // 8
    reducer = zero.reducer
    reducer.zero_grad()
    state.comm.stats.snapshot_and_reset()
    slots = schedule(simulated, stages, stage, chunks)
    last_backward = max(index for index, slot in enumerate(slots) if slot.kind == "B")
    tokens = torch.zeros((micro, seq + 1), dtype=torch.long, device=META)
    outputs: dict[tuple[int, int], tuple[Optional[torch.Tensor], torch.Tensor]] = {}
    held: list[int] = []  # the slots of the sends not yet completed
    sent = most_held = forward_peak = 0
    backward_points: list[int] = []  # bytes live at a backward's start and at each collective inside one
    in_flight = in_flight_peak = 0
    no_sync_bytes: Optional[dict[str, dict[str, int]]] = None

    def virtual(slot) -> int:
        return slot.chunk * stages + stage

    for index, slot in enumerate(slots):
        starts, ends = virtual(slot) == 0, virtual(slot) == chunks * stages - 1
        if probe.progress is not None:
            probe.progress.micro_batch = slot.micro_batch
        if slot.kind == "F":
            received = None if starts else torch.zeros((micro, seq, hidden), dtype=dtype, device=META,
                                                       requires_grad=True)
            held = held if starts else [sender for sender in held if sender > index - SEND_LAG]
            probe.phase = "forward"
            with monitor.measuring():
                if ends:
                    output = model.chunk_forward(slot.chunk, tokens[:, :-1] if starts else received,
                                                 tokens[:, 1:]).float().mean() / micro_batches
                else:
                    output = model.chunk_forward(slot.chunk, tokens[:, :-1] if starts else received)
            outputs[(slot.micro_batch, slot.chunk)] = (received, output)
            held, sent = (held, sent) if ends else (held + [index], sent + 1)
            most_held = max(most_held, len(held))
            in_flight += 1
            in_flight_peak = max(in_flight_peak, in_flight)
            forward_peak = max(forward_peak, monitor.meter.peak["device"] + len(held) * message)
        else:
            received, output = outputs.pop((slot.micro_batch, slot.chunk))
            held = held if ends else [sender for sender in held if sender > index - SEND_LAG]
            beside = len(held) * message + (0 if ends else message)  # held sends, the received gradient
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
                            output.backward(torch.zeros_like(output))
                reducer.finish_grad_sync()
            finally:
                state.comm.on_transport_copy = None
            after = state.comm.stats.snapshot()
            if index != last_backward and no_sync_bytes is None:
                no_sync_bytes = {group: {kind: after[group][kind] - before[group][kind] for kind in kinds}
                                 for group, kinds in after.items()}
            held, sent = (held, sent) if starts else (held + [index], sent + 1)
            most_held = max(most_held, len(held))
            in_flight -= 1
    # The micro-batches not simulated: each sends what a simulated one sends, and its backward under no_sync
    # sends what the first one did (stage 2 reduces every micro-batch).
    unsimulated = (micro_batches - simulated) * chunks
    sends_per_micro_batch = sum(virtual_stage != 0 for virtual_stage in _virtual_stages(stages, stage, chunks)) + \
        sum(virtual_stage != chunks * stages - 1 for virtual_stage in _virtual_stages(stages, stage, chunks))
    extra_sends = (micro_batches - simulated) * sends_per_micro_batch
    for group, kinds in (no_sync_bytes or {}).items():
        for kind, num_bytes in kinds.items():
            state.comm.stats.add(group, kind, num_bytes * unsimulated)
    passes_copy = state.comm.take_largest_transport_copy()
    optimizer = zero.optimizer
    optimizer.grad_norm_squared(optimizer.gradients.partition_gradients())
    optimizer.publish_parameters()
    loss_sum = torch.zeros((), device=META)
    state.comm.all_reduce(loss_sum, state.data_parallel_group, "dp")
    # The peak of the passes: a forward's, a backward's start, or a collective inside a backward that reduces
    # gradients (the last one at ZeRO 0-1, every one at ZeRO 2) with what was still live as it started. Counting
    # the copy on top of all a backward held at its start planned tests/planner/test_plan_pipeline_live.py's last
    # stage at 90.0 MiB, measured 72: its reduce-scatter starts once a bucket of gradients is ready, when those
    # layers' activations are gone. Read at the collective, the plan is 78.0 MiB.
    pass_peak = max([forward_peak] + backward_points)
    figures = PipelineFigures(
        pipeline_parallel_size=stages, pipeline_parallel_rank=stage, chunks=chunks, micro_batches=micro_batches,
        simulated_micro_batches=simulated, peak_chunk_forwards_in_flight=in_flight_peak,
        p2p_message_bytes=message,
        # the micro-batches not simulated repeat the steady state: they hold no more sends at once
        p2p_held_bytes=most_held * message,
        pass_peak_bytes=pass_peak,
        p2p_sent_bytes=(sent + extra_sends) * message,
        bubble_fraction=bubble_fraction(stages, micro_batches, chunks))
    return {"passes": passes_copy, "step": state.comm.take_largest_transport_copy()}, figures


def _virtual_stages(stages: int, stage: int, chunks: int) -> list[int]:
    return [chunk * stages + stage for chunk in range(chunks)]
