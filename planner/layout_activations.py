"""What one transformer layer saves for backward per token, counted from the model's shape for the layout search's
memory count (planner/layout_memory.py): Megatron-Core's blocks' tensors, and what this repository's blocks keep
beyond them, as its dry run measures them (issue 94: on Llama 3 70B at TP 4 with sequence parallelism a block keeps
860 MiB, 1.6x Megatron's 536 MiB, and the search that counted Megatron's printed a top pick 34 GiB over an H100).
"""

from __future__ import annotations

from planner.layout_perf import BF16_BYTES, FP32_BYTES, Layout, ModelCounts

# The norms a block runs (before attention and before the MLP), and the linears that read a norm's output (the fused
# QKV and the MLP's gate-and-up GEMM: column-parallel, so under sequence parallelism each gathers the sequence)
BLOCK_NORMS = 2


def layer_token_bytes(counts: ModelCounts, layout: Layout) -> tuple[float, float]:
    """Bytes a dense and an MoE layer save per token of this rank (a token's widths counted whole, the tokens split
    over TP x CP: the count's unit), without recompute."""
    h = counts.hidden
    # Megatron-Core's blocks (bf16): attention its norm's input and output (Transformer Engine's LayerNormLinear), q, k,
    # v and the context (4h + the K and V widths, q ~ h); the MLP its norm's input and output and gate, up and
    # activation (3 x width: the fused SwiGLU keeps fc1's output, fc2 its input; an ungated MLP fc1's output and the
    # activation's, 2 x width); an MoE layer k permuted copies of the token besides. Under FP8 Transformer Engine saves
    # the GEMMs' inputs it quantized (the norms' outputs, the context, the activation's output) as FP8 for the weight
    # gradient: 1 byte, not 2, for those.
    mlp_widths = 3 if counts.gated_mlp else 2
    dense = BF16_BYTES * (4 * h + counts.kv_width + 2 * h + mlp_widths * counts.gated_width_dense)
    moe = BF16_BYTES * (4 * h + counts.kv_width + 2 * h + 3 * counts.gated_width_moe + counts.topk * h)
    if layout.precision == "fp8":
        dense -= 3 * h + counts.gated_width_dense
        moe -= 3 * h + counts.gated_width_moe
    # This repository's MoE layer, by its dry run (Qwen3 30B-A3B at MBS 1-2, EP 1-8, TP 1-2: within 3% of its block):
    # per token one more 16-bit copy of the token's k rows (two under EP: the all-to-all's received rows) and two more
    # ffn-wide values a row (its stacked expert weights: stacked_expert_bytes).
    moe += BF16_BYTES * ((2 if layout.ep > 1 else 1) * counts.topk * h + 2 * counts.gated_width_moe)
    # Each RMSNorm, without --recompute-modules layernorm (which the search does not set), keeps autograd's fp32 copy of
    # its input and its cast normed values in place of the input (4 + 2 - 2 bytes a value: gpt/norms.py,
    # tests/gpt/test_saved_activations.py), and its fp32 rsqrt per token.
    norms = BLOCK_NORMS * (FP32_BYTES * h + FP32_BYTES)
    # Under sequence parallelism a column-parallel linear keeps its input as this rank's slice and gathers it again in
    # backward, as Megatron's (parallel/regathered_input.py): nothing beyond the norm's output counted above.
    # The CP p2p ring's output in fp32 (gpt/cp_attention.py), beside the bf16 context counted above
    ring = FP32_BYTES * h if layout.cp > 1 else 0
    return dense + norms + ring, moe + norms + ring


def stacked_expert_bytes(counts: ModelCounts, layout: Layout) -> float:
    """An MoE layer's local experts' weights stacked for the grouped matmul (gpt/moe/experts.py), kept per micro-batch."""
    return BF16_BYTES * counts.block_expert_parameters / layout.ep
