"""The layout search's count of what a block saves (planner/layout_activations.py) against the dry run's block, which
measures what the trainer's blocks keep (planner/dry_run.py): a Llama-shaped block at TP 2 with sequence parallelism,
in bf16 and FP8, and `M` and `G` blocks and a Nemotron-H pattern at its sizes. The count may only be under it (it prunes layouts: planner/layout_memory.py), by what it leaves out:
rotary's cos and sin (4 x head dim x TP bytes a local token) and the attention's fp32 log-sum-exp per head."""

import pytest

from arguments.parser import parse_config
from planner.dry_run import Cluster, dry_run
from planner.layout_activations import layer_token_bytes
from planner.layout_memory import fp8_weight_bytes
from planner.layout_of_config import layout_of_config
from planner.layout_perf import model_counts

TP = 2
LLAMA_SEQUENCE = 512
# Llama 3's proportions (head dim 128, 8 query heads a key/value group, ffn 3.5 x hidden), the sizes every FP8 recipe
# takes (multiples of 128)
LLAMA = ["--num-layers", "1", "--hidden-size", "2048", "--num-attention-heads", "16", "--group-query-attention",
         "--num-query-groups", "2", "--ffn-hidden-size", "7168", "--normalization", "RMSNorm", "--swiglu",
         "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
         "--seq-length", str(LLAMA_SEQUENCE), "--max-position-embeddings", str(LLAMA_SEQUENCE), "--vocab-size", "1024",
         "--tensor-model-parallel-size", str(TP), "--sequence-parallel", "--micro-batch-size", "1",
         "--global-batch-size", "1", "--hidden-dropout", "0", "--attention-dropout", "0", "--bf16"]


@pytest.mark.parametrize("precision", [[], ["--fp8-format", "hybrid"], ["--fp8-format", "hybrid", "--no-fp8-wgrad"],
                                       ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
                                       ["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"],
                                       ["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"]],
                         ids=["bf16", "fp8-delayed", "fp8-delayed-bf16-wgrad", "fp8-tensorwise", "fp8-blockwise",
                              "fp8-mxfp8"])
def test_the_search_counts_what_a_block_keeps(precision):
    config = parse_config([*LLAMA, *precision])
    plan = dry_run(config, Cluster(world_size=TP, gpus_per_node=TP, device_type="cuda"), 1024)
    counts = model_counts(config.model, 1024)
    layout = layout_of_config(config.model, config.parallel, config.training, config.zero, config.activations, TP, counts)
    dense, _ = layer_token_bytes(counts, layout)
    local_tokens = config.model.seq_length // TP
    counted = dense * local_tokens
    # rotary's cos and sin and the log-sum-exp a local token, and the per-tensor recipes' fp32 scale of each linear's
    # kept input (QKV, output projection, gate-and-up, down projection)
    left_out = (4 * 128 * TP + 4 * 16) * local_tokens + 4 * 4
    assert counted <= plan.block_saved_bytes["forward"] <= counted + left_out, (counted, plan.block_saved_bytes)
    # the FP8 copies of the block's weights, kept through the iteration's micro-batches (blockwise's 128 x 128 blocks'
    # scales left out)
    weights = fp8_weight_bytes(counts, layout, 1)
    assert weights <= plan.fp8_weight_cache_bytes <= 1.01 * weights


def _counted_and_planned(pattern: str) -> tuple[float, int, int]:
    """The search's count of `pattern`'s layers (Llama's sizes, TP 2 with sequence parallelism, bf16) in bytes a rank
    keeps, the dry run's largest block and its whole pass's saved tensors."""
    config = parse_config([*LLAMA[2:], "--hybrid-layer-pattern", pattern])  # the pattern sets the depth
    plan = dry_run(config, Cluster(world_size=TP, gpus_per_node=TP, device_type="cuda"), 1024)
    counts = model_counts(config.model, 1024)
    dense, _ = layer_token_bytes(counts, layout_of_config(config.model, config.parallel, config.training, config.zero, config.activations, TP, counts))
    return dense * counts.layers * config.model.seq_length // TP, plan.block_saved_bytes["forward"], plan.saved_activation_bytes[
        "device"]


# what the count leaves out of an attention block (the Llama test's left_out, bf16), and of an `M` or `G` block: its
# scan's chunk x chunk causal mask (bool, M's chunk of 128 the larger), kept whole on each rank, counted as its weights
# (split over TP)
ATTENTION_LEFT_OUT = (4 * 128 * TP + 4 * 16) * LLAMA_SEQUENCE // TP
RECURRENT_LEFT_OUT = 128 * 128 * (TP - 1) // TP


@pytest.mark.parametrize("pattern", ["M-", "G-", "M", "G", "-"])
def test_the_search_counts_m_and_g_blocks_by_their_own_kind(pattern):
    """A Mamba-2 or Gated DeltaNet block keeps its scan's chunk-wide fp32 tensors (614 and 480 KB a local token here,
    where an attention block keeps 70): the count reads its mixer half as measured on meta (planner/
    recurrent_activations.py), a one-part block by its half alone."""
    counted, block, _ = _counted_and_planned(pattern)
    assert counted <= block <= counted + RECURRENT_LEFT_OUT, (counted, block)


def test_the_search_counts_a_nemotron_h_pattern_layer_by_layer():
    """Nemotron-H's mix (`M-` blocks, an `M`, `*` and `-` alone): the count's mean layer times the layers against the
    dry run's saved tensors of the whole pass, less those of a one-block model (what lies outside the blocks)."""
    counted, _, planned = _counted_and_planned("M-M-M--M-*M-M-")
    counted_mlp, _, planned_mlp = _counted_and_planned("-")
    counted, planned = counted - counted_mlp, planned - planned_mlp
    assert counted <= planned <= counted + ATTENTION_LEFT_OUT + 6 * RECURRENT_LEFT_OUT, (counted, planned)
