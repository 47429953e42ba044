"""One rank's bytes under a searched layout, counted from the model's shape: what the layout search (planner/
layout_search.py) prunes with and ranks its dry-run check by (planner/search_check.py), the dry run being the truth.

The count follows the dry run's sum (planner/dry_run.py): model states and ZeRO's buffers, then the larger of the
optimizer step's temporaries and the pass's peak: the activations saved by the forwards still awaiting their backward,
the logits' tensors on the last stage, the gradients a block's backward holds, the largest parameter gradient before
the reducer takes it and the blocks' FP8 weight copies. Each pipeline stage is counted with its own layers (the
printed split, planner/pipeline_split.py), its own parameters (the embedding on the first, the output layer on the
last) and the layer-forwards its schedule holds at its peak (parallel/pipeline_schedules.py, over the micro-batches
the dry run simulates). Issue 94 found the count 1.2-2.4x under the dry run on Llama 3 70B at sequence 8192 (TP 4 x PP
4 x VP 16: 70.8 GiB counted, 121.3 planned), from both a stage taken as layers / PP with a uniform share of the
parameters (the balanced split's first stage is heavier, the interleaved warm-up holds more) and a block taken as
Megatron-Core's (planner/layout_activations.py).

What is left out keeps the count under the dry run's (it prunes, so it must not drop a layout that fits): stage 1's
and plain DDP's constant buffers, the pipeline's held sends, an MoE layer's gradients in flight, MTP layers' own
activations, an MoE model's FP8 weight copies, rotary's tables and the attention's log-sum-exp (planner/
layout_activations.py).
"""

from __future__ import annotations

import functools

from parallel.pipeline_schedules import peak_held_by_forwards, schedule
from planner.layout_activations import BLOCK_NORMS, FP8_VALUE_BYTES, layer_token_bytes
from planner.layout_perf import BF16_BYTES, FP32_BYTES, Layout, ModelCounts
from planner.layout_zero import sharded_state_bytes
from planner.pipeline_plan import simulated_micro_batches

OPTIMIZER_STATE_BYTES = 12  # fp32 master weight and Adam's two fp32 moments
# the loss's tensors per logit, at the end of the last stage's forward and the start of its backward: the 16-bit
# logits, their fp32 softmax (saved) and the 16-bit gradient of the logits (planner/dry_run.py, "gradients in flight")
LOGIT_BYTES = BF16_BYTES + FP32_BYTES + BF16_BYTES


def chunk_layers(counts: ModelCounts, layout: Layout) -> tuple[tuple[int, ...], ...]:
    """[pipeline rank][model chunk] -> transformer layers: the split the layout is printed with, else an even one."""
    if layout.stage_counts is not None:
        return layout.stage_counts
    per_chunk = counts.layers // (layout.pp * layout.vp)
    return tuple((per_chunk,) * layout.vp for _ in range(layout.pp))


@functools.lru_cache(maxsize=4096)
def layers_in_flight(micro_batches: int, pp: int, stage: int, layers: tuple[int, ...]) -> int:
    """The layer-forwards `stage` holds at its peak: each forward of chunk c keeps `layers[c]` layers' activations until
    its backward, over the slots of the micro-batches the dry run simulates (their peak is the whole run's)."""
    if pp == 1:
        return sum(layers)
    simulated = simulated_micro_batches(micro_batches, pp, stage, len(layers))
    return peak_held_by_forwards(schedule(simulated, pp, stage, len(layers)), layers)


def stage_parameters(counts: ModelCounts, layout: Layout, stage: int, layers: int) -> tuple[float, float]:
    """This rank's dense and routed-expert parameters on `stage` holding `layers` layers: a block's average share
    of each, the word embedding on the first stage and the output layer and final norm on the last (with tied
    embeddings its copy of the embedding: Megatron's embedding group)."""
    block_dense = (counts.dense_parameters - counts.root_parameters) / counts.layers
    dense = layers * block_dense
    if stage == 0:
        dense += counts.embedding_parameters
    if stage == layout.pp - 1:
        dense += counts.root_parameters - (counts.embedding_parameters if stage == 0 or not counts.tied_output
                                           else 0)
    return dense / layout.tp, layers * counts.expert_parameters / counts.layers / layout.ep


def state_bytes(counts: ModelCounts, layout: Layout, dense: float, experts: float) -> tuple[float, float]:
    """Model states (16-bit parameters, fp32 gradients, the optimizer's fp32 states, sharded as the stage says) with
    stage 2's and 3's buffers, and the optimizer step's temporaries (the dry run's "gradient partition or
    publishing": the fp32 gradient of the rank's partition, stage 2's 16-bit one published), for this rank's `dense`
    and `experts` parameters."""
    expert_dp = max(layout.gpus // (layout.ep * layout.pp), 1)
    shard = dense / (layout.dp * layout.cp) + experts / expert_dp if layout.distributed_optimizer else dense + experts
    step = shard * {0: FP32_BYTES, 1: FP32_BYTES, 2: BF16_BYTES}.get(layout.stage, 0)
    if layout.stage >= 2:  # planner/layout_zero.py: gradients (and parameters) sharded, with their buffers
        return sharded_state_bytes(counts, layout, dense, experts, layout.dp * layout.cp, expert_dp), step
    return (dense + experts) * (BF16_BYTES + FP32_BYTES) + shard * OPTIMIZER_STATE_BYTES, step


def stage_memory_bytes(counts: ModelCounts, layout: Layout, stage: int) -> float:
    """One rank of pipeline stage `stage`: its states, and the pass's peak (the module docstring)."""
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
        # each layer's input kept per micro-batch; one block recomputed at a time, in backward, after the logits
        kept = tokens * held * BF16_BYTES * counts.hidden
        working = tokens * (moe_layer if counts.moe_layers else dense_layer)
        peak = kept + max(working, logits)
    else:
        # A block's backward gradients add to the dry run's peak only without pipeline stages (a stage's peak is over
        # its schedule's slots; with them the count ran up to 1% over the dry run on Llama 3 70B's pipelined layouts)
        # and without recompute (a recomputed block's peak is its own: 0.9% over on a ZeRO-3 layout with them).
        gradients = block_gradient_bytes(counts, layout) if layout.pp == 1 else 0.0
        peak = held * per_layer + logits + gradients
    # the largest gradient autograd hands the reducer at once, fp32: a vocabulary matrix where the stage has one,
    # else one block's gate and up projection
    vocabulary = stage == 0 or last
    largest = FP32_BYTES * counts.hidden * (counts.padded_vocab if vocabulary else 2 * counts.gated_width_dense) / \
        layout.tp
    states, step = state_bytes(counts, layout, dense, experts)
    return states + max(peak + largest + fp8_weight_bytes(counts, layout, sum(chunks)), step)


def fp8_weight_bytes(counts: ModelCounts, layout: Layout, layers: int) -> float:
    """The FP8 copies of the blocks' linear weights (data and transpose, or MXFP8's rows and columns with their scales
    per 32 values; blockwise's 128 x 128 blocks' scales left out), cast in an iteration's first micro-batch and kept
    through its last (parallel/fp8/weight_cache.py; the dry run's "FP8 weights cast once an iteration"), for `layers`
    blocks on this rank; an MoE model's left out (which of its weights run in FP8 is not counted here)."""
    if layout.precision != "fp8" or counts.moe_layers:
        return 0.0
    value = FP8_VALUE_BYTES["mxfp8"] if layout.fp8_recipe == "mxfp8" else 1.0
    return 2 * value * layers * (counts.block_dense_parameters - BLOCK_NORMS * counts.hidden) / layout.tp


def block_gradient_bytes(counts: ModelCounts, layout: Layout) -> float:
    """The gradients a block's backward holds beside its saved tensors at its peak, as the dry run counts them: the
    gradient at its output, whole sequences, and a dense MLP's activation gradients (an MoE layer's, which depend on
    its routing, are left out)."""
    rows = layout.micro_batch_size * counts.seq_length / layout.cp
    return BF16_BYTES * rows * (counts.hidden + counts.mlp_gradient_features / layout.tp)


def layout_memory_bytes(counts: ModelCounts, layout: Layout) -> float:
    """One rank's bytes on the worst of the first pipeline stage (the most forwards in flight), the last (the
    logits) and the one with the most layers: the module docstring says what it counts and leaves out."""
    layers = [sum(chunks) for chunks in chunk_layers(counts, layout)]
    stages = {0, layout.pp - 1, max(range(layout.pp), key=layers.__getitem__)}
    return max(stage_memory_bytes(counts, layout, stage) for stage in stages)
