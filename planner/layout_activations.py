"""What one transformer layer saves for backward per token, counted from the model's shape for the layout search:
Megatron-Core's blocks' tensors plus what this repository's blocks keep beyond them, as its dry run measures them."""

from __future__ import annotations

from planner.layout_perf import BF16_BYTES, FP32_BYTES, Layout, ModelCounts

BLOCK_NORMS = 2
# an FP8 value with its share of the block scales
FP8_VALUE_BYTES = {"blockwise": 1 + FP32_BYTES / 128, "mxfp8": 1 + FP32_BYTES / 32}


def layer_token_bytes(counts: ModelCounts, layout: Layout) -> tuple[float, float]:
    """Bytes a dense and an MoE layer save per token of this rank, without recompute: the pattern's mean."""
    h = counts.hidden
    attention_layers = counts.layers if counts.attention_mixers is None else counts.attention_mixers
    mlp_layers = counts.layers if counts.mlp_halves is None else counts.mlp_halves
    # Megatron-Core's blocks in bf16: attention's norm output, q, k, v and context; the MLP's norm output, gate, up and
    # activation; an MoE layer's k permuted token copies
    kv_width = counts.kv_width * counts.layers / attention_layers if attention_layers else 0
    mlp_widths = 3 if counts.gated_mlp else 2
    attention = BF16_BYTES * (4 * h + kv_width)
    dense_mlp = BF16_BYTES * (2 * h + mlp_widths * counts.gated_width_dense)
    moe_mlp = BF16_BYTES * (2 * h + 3 * counts.gated_width_moe + counts.topk * h)
    if layout.precision == "fp8" and (layout.fp8_wgrad or layout.fp8_recipe != "delayed"):
        # FP8 linears keep their cast input's FP8 copy for wgrad, in place of the 16-bit one
        value = FP8_VALUE_BYTES.get(layout.fp8_recipe, 1.0)
        entry = h * (layout.tp if layout.fp8_recipe in FP8_VALUE_BYTES else 1)
        attention += value * (entry + h) - BF16_BYTES * h
        dense_mlp += value * (entry + counts.gated_width_dense) - BF16_BYTES * (h + counts.gated_width_dense)
        moe_mlp += (value - BF16_BYTES) * (h + counts.gated_width_moe)
    # this repository's MoE layer keeps two more ffn-wide values a row, and under EP the received rows
    moe_mlp += BF16_BYTES * ((1 if layout.ep > 1 else 0) * counts.topk * h + 2 * counts.gated_width_moe)
    norm = BLOCK_NORMS // 2 * FP32_BYTES
    ring = FP32_BYTES * h if layout.cp > 1 else 0
    recurrent = counts.recurrent_saved.token_bytes(layout.micro_batch_size, counts.seq_length / layout.cp)
    mixer = (attention_layers * (attention + norm + ring) + recurrent) / counts.layers
    dense_layers = counts.layers - counts.moe_layers
    dense_mlp_share = (mlp_layers - counts.moe_layers) / dense_layers if dense_layers else 1.0
    return mixer + dense_mlp_share * (dense_mlp + norm), mixer + moe_mlp + norm
