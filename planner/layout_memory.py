"""One rank's bytes under a searched layout, counted from the model's shape per pipeline stage: model states and ZeRO's
buffers, then the larger of the step's temporaries and the pass's peak. What it leaves out keeps it under the dry run's
count, since the search prunes with it."""

from __future__ import annotations

import functools

from parallel.pipeline_schedules import peak_held_by_forwards, schedule
from planner.layout_activations import BLOCK_NORMS, FP8_VALUE_BYTES, layer_token_bytes
from planner.layout_perf import BF16_BYTES, FP32_BYTES, Layout, ModelCounts
from planner.layout_zero import sharded_state_bytes
from planner.pipeline_plan import simulated_micro_batches

OPTIMIZER_STATE_BYTES = 12  # fp32 master weight and Adam's two fp32 moments
# per logit: 16-bit logits, saved fp32 softmax, 16-bit gradient
LOGIT_BYTES = BF16_BYTES + FP32_BYTES + BF16_BYTES


def chunk_layers(counts: ModelCounts, layout: Layout) -> tuple[tuple[int, ...], ...]:
    """[pipeline rank][model chunk] -> layers: the printed split, else an even one."""
    if layout.stage_counts is not None:
        return layout.stage_counts
    per_chunk = counts.layers // (layout.pp * layout.vp)
    return tuple((per_chunk,) * layout.vp for _ in range(layout.pp))


@functools.lru_cache(maxsize=4096)
def layers_in_flight(micro_batches: int, pp: int, stage: int, layers: tuple[int, ...]) -> int:
    """The layer-forwards `stage` holds at its peak over the micro-batches the dry run simulates."""
    if pp == 1:
        return sum(layers)
    simulated = simulated_micro_batches(micro_batches, pp, stage, len(layers))
    return peak_held_by_forwards(schedule(simulated, pp, stage, len(layers)), layers)


def stage_parameters(counts: ModelCounts, layout: Layout, stage: int, layers: int) -> tuple[float, float]:
    """This rank's dense and expert parameters on `stage` holding `layers` layers, with the embedding and output
    layer."""
    block_dense = (counts.dense_parameters - counts.root_parameters) / counts.layers
    dense = layers * block_dense
    if stage == 0:
        dense += counts.embedding_parameters
    if stage == layout.pp - 1:
        dense += counts.root_parameters - (counts.embedding_parameters if stage == 0 or not counts.tied_output
                                           else 0)
    return dense / layout.tp, layers * counts.expert_parameters / counts.layers / layout.ep


def state_bytes(counts: ModelCounts, layout: Layout, dense: float, experts: float) -> tuple[float, float]:
    expert_dp = max(layout.gpus // (layout.ep * layout.pp), 1)
    shard = dense / (layout.dp * layout.cp) + experts / expert_dp if layout.distributed_optimizer else dense + experts
    step = shard * {0: FP32_BYTES, 1: FP32_BYTES, 2: BF16_BYTES}.get(layout.stage, 0)
    if layout.stage >= 2:
        return sharded_state_bytes(counts, layout, dense, experts, layout.dp * layout.cp, expert_dp), step
    return (dense + experts) * (BF16_BYTES + FP32_BYTES) + shard * OPTIMIZER_STATE_BYTES, step


def stage_memory_bytes(counts: ModelCounts, layout: Layout, stage: int) -> float:
    chunks = chunk_layers(counts, layout)[stage]
    dense, experts = stage_parameters(counts, layout, stage, sum(chunks))
    tokens = layout.micro_batch_size * counts.seq_length / (layout.tp * layout.cp)
    moe_share = counts.moe_layers / counts.layers
    dense_layer, moe_layer = layer_token_bytes(counts, layout)
    per_layer = tokens * ((1 - moe_share) * dense_layer + moe_share * moe_layer)
    held = layers_in_flight(layout.micro_batches, layout.pp, stage, chunks)
    last = stage == layout.pp - 1
    logits = layout.micro_batch_size * counts.seq_length / layout.cp * counts.padded_vocab / layout.tp * LOGIT_BYTES \
        if last else 0.0
    if layout.recompute_fraction >= 1.0:
        kept = tokens * held * BF16_BYTES * counts.hidden
        working = tokens * (moe_layer if counts.moe_layers else dense_layer)
        peak = kept + max(working, logits)
    else:
        # a block's backward gradients add to the peak only without stages and recompute
        gradients = block_gradient_bytes(counts, layout) if layout.pp == 1 else 0.0
        peak = held * per_layer + logits + gradients
    vocabulary = stage == 0 or last
    largest = FP32_BYTES * counts.hidden * (counts.padded_vocab if vocabulary else 2 * counts.gated_width_dense) / \
        layout.tp
    states, step = state_bytes(counts, layout, dense, experts)
    return states + max(peak + largest + fp8_weight_bytes(counts, layout, sum(chunks)), step)


def fp8_weight_bytes(counts: ModelCounts, layout: Layout, layers: int) -> float:
    """The blocks' FP8 weight copies, kept through the iteration's micro-batches (an MoE model's left out)."""
    if layout.precision != "fp8" or counts.moe_layers:
        return 0.0
    value = FP8_VALUE_BYTES["mxfp8"] if layout.fp8_recipe == "mxfp8" else 1.0
    return 2 * value * layers * (counts.block_dense_parameters - BLOCK_NORMS * counts.hidden) / layout.tp


def block_gradient_bytes(counts: ModelCounts, layout: Layout) -> float:
    rows = layout.micro_batch_size * counts.seq_length / layout.cp
    return BF16_BYTES * rows * (counts.hidden + counts.mlp_gradient_features / layout.tp)


def layout_memory_bytes(counts: ModelCounts, layout: Layout) -> float:
    """One rank's bytes on the worst of the first, the last and the largest stage."""
    layers = [sum(chunks) for chunks in chunk_layers(counts, layout)]
    stages = {0, layout.pp - 1, max(range(layout.pp), key=layers.__getitem__)}
    return max(stage_memory_bytes(counts, layout, stage) for stage in stages)
