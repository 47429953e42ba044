"""What one transformer layer saves for backward per token, counted from the model's shape for the layout search's
memory count (planner/layout_memory.py): Megatron-Core's blocks' tensors, and what this repository's blocks keep
beyond them, as its dry run measures them (issue 94: on Llama 3 70B at TP 4 with sequence parallelism a block keeps
860 MiB, 1.6x Megatron's 536 MiB, and the search that counted Megatron's printed a top pick 34 GiB over an H100);
a pattern's `M` and `G` mixers as measured (planner/recurrent_activations.py). tests/planner/test_layout_activations.py
holds a block's count to its dry run, in bf16 and each FP8 recipe, and `M`, `G` and one-part blocks.
"""

from __future__ import annotations

from planner.layout_perf import BF16_BYTES, FP32_BYTES, Layout, ModelCounts

# The norms a block runs (before attention and before the MLP), and the linears that read a norm's output (the fused
# QKV and the MLP's gate-and-up GEMM: column-parallel, so under sequence parallelism each gathers the sequence)
BLOCK_NORMS = 2
# Bytes an FP8 value keeps with its share of the scales, for the block-scaled recipes (an fp32 scale per 128 values,
# or per 32: MXFP8's power-of-two scales are kept in fp32 here), whose linears keep the FP8 copy of a gathered input
# whole: cast along the tokens, it is not sliced again (parallel/fp8/linear.py). The per-tensor recipes' one scale is
# left out (1 byte a value).
FP8_VALUE_BYTES = {"blockwise": 1 + FP32_BYTES / 128, "mxfp8": 1 + FP32_BYTES / 32}


def layer_token_bytes(counts: ModelCounts, layout: Layout) -> tuple[float, float]:
    """Bytes a dense and an MoE layer save per token of this rank (a token's widths counted whole, the tokens split
    over TP x CP: the count's unit), without recompute: the pattern's mean, each layer by its halves (an attention
    mixer, a measured `M` or `G` mixer, none; an MLP or none)."""
    h = counts.hidden
    attention_layers = counts.layers if counts.attention_mixers is None else counts.attention_mixers
    mlp_layers = counts.layers if counts.mlp_halves is None else counts.mlp_halves
    # Megatron-Core's blocks (bf16): attention its norm's input and output (Transformer Engine's LayerNormLinear), q, k,
    # v and the context (4h + an attention layer's K and V widths, q ~ h); the MLP its norm's input and output and
    # gate, up and activation (3 x width: the fused SwiGLU keeps fc1's output, fc2 its input; an ungated MLP fc1's
    # output and the activation's, 2 x width); an MoE layer k permuted copies of the token besides.
    kv_width = counts.kv_width * counts.layers / attention_layers if attention_layers else 0
    mlp_widths = 3 if counts.gated_mlp else 2
    attention = BF16_BYTES * (4 * h + kv_width)
    dense_mlp = BF16_BYTES * (2 * h + mlp_widths * counts.gated_width_dense)
    moe_mlp = BF16_BYTES * (2 * h + 3 * counts.gated_width_moe + counts.topk * h)
    if layout.precision == "fp8" and (layout.fp8_wgrad or layout.fp8_recipe != "delayed"):
        # The FP8 linears keep for the weight gradient the FP8 copy of the input they cast (Transformer Engine's
        # columnwise data, with its block scales under the block-scaled recipes; under --no-fp8-wgrad the 16-bit input,
        # as bf16: parallel/fp8/linear.py): the norms' outputs and the activation's output in place of their 16-bit
        # values; the context's beside its 16-bit values, which the attention kernel keeps for its own backward. Under
        # sequence parallelism the QKV and (dense) the gate-and-up GEMM keep the copy of their input's slice, gathered
        # again in backward as TE does, or, under the block-scaled recipes, of the whole gathered sequence.
        value = FP8_VALUE_BYTES.get(layout.fp8_recipe, 1.0)
        entry = h * (layout.tp if layout.fp8_recipe in FP8_VALUE_BYTES else 1)
        attention += value * (entry + h) - BF16_BYTES * h
        dense_mlp += value * (entry + counts.gated_width_dense) - BF16_BYTES * (h + counts.gated_width_dense)
        moe_mlp += (value - BF16_BYTES) * (h + counts.gated_width_moe)
    # This repository's MoE layer, by its dry run (Qwen3 30B-A3B at MBS 1-2, EP 1-8, TP 1-2: within 3% of its block):
    # per token two more ffn-wide values a row and, under EP, one more 16-bit copy of the token's k rows (the
    # all-to-all's received rows). The combine keeps no weighted copy of the rows (it scatter-adds, as Megatron's), and
    # the grouped matmul no stacked copy of the experts' weights (gpt/moe/experts.py).
    moe_mlp += BF16_BYTES * ((1 if layout.ep > 1 else 0) * counts.topk * h + 2 * counts.gated_width_moe)
    # Each RMSNorm, without --recompute-modules layernorm (which the search does not set), keeps its fp32 rsqrt per
    # token beside its input, as Transformer Engine's rsigma (gpt/rms_norm_backward.py): one a half
    norm = BLOCK_NORMS // 2 * FP32_BYTES
    # Under sequence parallelism a column-parallel linear keeps its 16-bit input as this rank's slice and gathers it
    # again in backward, as Megatron's (parallel/regathered_input.py): nothing beyond the norm's output counted above.
    # The CP p2p ring's output in fp32 (gpt/cp_attention.py), beside the bf16 context counted above
    ring = FP32_BYTES * h if layout.cp > 1 else 0
    # `M` and `G` mixers as measured in bf16 (planner/recurrent_activations.py: their scans' fp32 chunks, and their
    # weights' copies once a forward, spread over its tokens; an FP8 recipe's input copies left out)
    recurrent = counts.recurrent_saved.token_bytes(layout.micro_batch_size, counts.seq_length / layout.cp)
    mixer = (attention_layers * (attention + norm + ring) + recurrent) / counts.layers
    dense_layers = counts.layers - counts.moe_layers
    dense_mlp_share = (mlp_layers - counts.moe_layers) / dense_layers if dense_layers else 1.0
    return mixer + dense_mlp_share * (dense_mlp + norm), mixer + moe_mlp + norm
