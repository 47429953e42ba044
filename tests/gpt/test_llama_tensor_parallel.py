"""A Llama-shaped run (RMSNorm, SwiGLU, rotary, 2 key/value groups, untied output, no biases) at TP 2 x DP 2
(4 gloo ranks, fp32, dropout off) logs the losses and gradient norms of the single-process run, within the
tolerance the GPT-2 test uses (tests/training/test_tensor_parallel_training.py, whose launch machinery this
reuses). Both runs start from the same LlamaForCausalLM folder saved by transformers (--init-from-hf), so the
one 4-rank launch also checks that each TP rank takes its slice of the folder's q/k/v, gate/up and untied
lm_head: a wrong slice changes the first loss.

The key/value groups split over TP ranks as Megatron-Core's SelfAttention does (megatron/core/transformer/
attention.py: `num_query_groups_per_partition = divide(config.num_query_groups, world_size)`), each rank's
fused QKV rows holding whole groups; gate and up are each column-parallel (Megatron-Core's MLP splits its
fused fc1 [gate; up] so that each rank holds matching halves: megatron/core/transformer/mlp.py, glu)."""

import math

import pytest

from tests.checkpoint.test_hf_llama import random_llama_folder
from tests.training.test_tensor_parallel_training import NO_DROPOUT, losses, train

LLAMA = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--group-query-attention",
         "--num-query-groups", "2", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
         "--ffn-hidden-size", "96", "--norm-epsilon", "1e-6", "--train-iters", "6"]


@pytest.mark.slow
def test_llama_from_hf_at_tp2_x_dp2_logs_the_single_process_losses(tmp_path, corpus_cache):
    folder = random_llama_folder(tmp_path / "hf", "gqa2-untied-nobias-llama3", vocab_size=512)
    flags = [*NO_DROPOUT, *LLAMA, "--rotary-base", "500000", "--use-rope-scaling", "--init-from-hf", str(folder)]
    single = train(tmp_path, corpus_cache, "single", 1, *flags)
    assert len(single) == 6 and all(math.isfinite(loss) for loss in single) and single[-1] < single[0]
    parallel = train(tmp_path, corpus_cache, "tp2xdp2", 4, *flags, "--tensor-model-parallel-size", "2")
    assert parallel == pytest.approx(single, rel=1e-4)
    assert losses(tmp_path / "tp2xdp2.jsonl", "grad_norm") == pytest.approx(
        losses(tmp_path / "single.jsonl", "grad_norm"), rel=1e-4)


@pytest.mark.slow
def test_heads_wider_than_hidden_over_heads_at_tp2_log_the_single_process_losses(tmp_path, corpus_cache):
    """--kv-channels 24 at hidden 64 / 4 heads (transformers' head_dim): the QKV rows and the output projection's
    input are heads x 24 (Megatron-Core's SelfAttention: query_projection_size = kv_channels x heads, linear_proj
    from it to the hidden size), split over 2 TP ranks by whole groups; the folder's weights load at both sizes."""
    folder = random_llama_folder(tmp_path / "hf", "gqa2-head-dim-24", vocab_size=512)
    flags = [*NO_DROPOUT, *LLAMA, "--kv-channels", "24", "--init-from-hf", str(folder)]
    single = train(tmp_path, corpus_cache, "single", 1, *flags)
    assert len(single) == 6 and all(math.isfinite(loss) for loss in single) and single[-1] < single[0]
    parallel = train(tmp_path, corpus_cache, "tp2", 2, *flags, "--tensor-model-parallel-size", "2")
    assert parallel == pytest.approx(single, rel=1e-4)
    assert losses(tmp_path / "tp2.jsonl", "grad_norm") == pytest.approx(
        losses(tmp_path / "single.jsonl", "grad_norm"), rel=1e-4)
