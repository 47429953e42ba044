"""What one transformer layer saves for backward per token, counted from the model's shape for the layout search's
memory count: Megatron-Core's blocks' tensors plus what this repository's blocks keep beyond them, as its dry run
measures them (tests/planner/test_layout_activations.py holds the two together)."""

from __future__ import annotations

from planner.layout_perf import BF16_BYTES, FP32_BYTES, Layout, ModelCounts

# the norms a block runs, and the column-parallel linears reading them (each gathers the sequence under SP)
BLOCK_NORMS = 2
# an FP8 value with its share of the block-scaled recipes' fp32 scales (one per 128 values, or MXFP8's per 32)
FP8_VALUE_BYTES = {"blockwise": 1 + FP32_BYTES / 128, "mxfp8": 1 + FP32_BYTES / 32}


def layer_token_bytes(counts: ModelCounts, layout: Layout) -> tuple[float, float]:
    """Bytes a dense and an MoE layer save per token of this rank (widths whole, tokens split over TP x CP), without
    recompute: the pattern's mean."""
    h = counts.hidden
    attention_layers = counts.layers if counts.attention_mixers is None else counts.attention_mixers
    mlp_layers = counts.layers if counts.mlp_halves is None else counts.mlp_halves
    # Megatron-Core's blocks (bf16): attention its norm's input and output, q, k, v and the context; the MLP its norm's
    # input and output and gate, up and activation; an MoE layer k permuted copies of the token besides.
    kv_width = counts.kv_width * counts.layers / attention_layers if attention_layers else 0
    mlp_widths = 3 if counts.gated_mlp else 2
    attention = BF16_BYTES * (4 * h + kv_width)
    dense_mlp = BF16_BYTES * (2 * h + mlp_widths * counts.gated_width_dense)
    moe_mlp = BF16_BYTES * (2 * h + 3 * counts.gated_width_moe + counts.topk * h)
    if layout.precision == "fp8" and (layout.fp8_wgrad or layout.fp8_recipe != "delayed"):
        # FP8 linears keep the FP8 copy of the input they cast for the weight gradient, in place of the 16-bit norm and
        # activation outputs; the context's beside its 16-bit values, which the attention kernel keeps.
        value = FP8_VALUE_BYTES.get(layout.fp8_recipe, 1.0)
        entry = h * (layout.tp if layout.fp8_recipe in FP8_VALUE_BYTES else 1)
        attention += value * (entry + h) - BF16_BYTES * h
        dense_mlp += value * (entry + counts.gated_width_dense) - BF16_BYTES * (h + counts.gated_width_dense)
        moe_mlp += (value - BF16_BYTES) * (h + counts.gated_width_moe)
    # This repository's MoE layer, by its dry run: two more ffn-wide values a row and, under EP, the all-to-all's
    # received rows.
    moe_mlp += BF16_BYTES * ((1 if layout.ep > 1 else 0) * counts.topk * h + 2 * counts.gated_width_moe)
    # each RMSNorm's fp32 rsqrt per token (Transformer Engine's rsigma)
    norm = BLOCK_NORMS // 2 * FP32_BYTES
    # the CP p2p ring's fp32 output, beside the bf16 context
    ring = FP32_BYTES * h if layout.cp > 1 else 0
    # `M` and `G` mixers as measured in bf16 (planner/recurrent_activations.py)
    recurrent = counts.recurrent_saved.token_bytes(layout.micro_batch_size, counts.seq_length / layout.cp)
    mixer = (attention_layers * (attention + norm + ring) + recurrent) / counts.layers
    dense_layers = counts.layers - counts.moe_layers
    dense_mlp_share = (mlp_layers - counts.moe_layers) / dense_layers if dense_layers else 1.0
    return mixer + dense_mlp_share * (dense_mlp + norm), mixer + moe_mlp + norm
