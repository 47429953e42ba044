"""Fewer key/value groups than TP ranks (issue 93: AMD's Qwen2-1.5B launch, 2 groups at TP 8), as Megatron-Core's
SelfAttention runs them (megatron/core/transformer/attention.py:289 and get_query_key_value_tensors): the fused QKV
weight is cut in contiguous rows as at any TP size, so a rank's rows are part of one group's; its output is
all-gathered, each rank keeps its group (rank // (tp / groups)) and, of that group's query heads, its own. The
gather's backward reduce-scatters, so each row's gradient is the sum of what every rank read from it: TP 1's.
No weight is replicated, so the checkpoint, the gradient norm and the ZeRO partitions see the layout of any other
TP size.

A Qwen2-shaped tiny run (RMSNorm, SwiGLU, rotary, one key/value group for 4 heads, the QKV bias alone) at TP 2, and
at TP 2 with --sequence-parallel, logs the single-process run's losses and gradient norms within the tolerance of
the other TP-equals-one-rank tests (tests/gpt/test_llama_tensor_parallel.py: 1e-4 relative, fp32, dropout off);
a checkpoint saved at TP 2 resumes at TP 1 and one saved at TP 1 resumes at TP 2, each to the single run's losses.
The memory planner counts the parameters from their sharding records (nothing to add: no row is replicated) and, per
rank, the whole key and value of the rank's group (gpt/shape.py): at TP 2 a block with one group keeps what one with
two keeps, measured (zero/activations.py SavedTensorMeter) and predicted."""

import math

import pytest
import torch

from tests.distributed import run_distributed
from tests.training.test_tensor_parallel_training import NO_DROPOUT, losses, train

QWEN = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope", "--group-query-attention",
        "--num-query-groups", "1", "--disable-bias-linear", "--add-qkv-bias", "--ffn-hidden-size", "96",
        "--untie-embeddings-and-output-weights", "--train-iters", "6", *NO_DROPOUT]
TP2 = ["--tensor-model-parallel-size", "2"]


@pytest.mark.slow
def test_one_group_at_tp2_logs_the_single_process_losses_with_and_without_sequence_parallel(tmp_path, corpus_cache):
    single = train(tmp_path, corpus_cache, "single", 1, *QWEN)
    assert len(single) == 6 and all(math.isfinite(loss) for loss in single) and single[-1] < single[0]
    for name, extra in (("tp2", TP2), ("tp2sp", [*TP2, "--sequence-parallel"])):
        assert train(tmp_path, corpus_cache, name, 2, *QWEN, *extra) == pytest.approx(single, rel=1e-4), name
        assert losses(tmp_path / f"{name}.jsonl", "grad_norm") == pytest.approx(
            losses(tmp_path / "single.jsonl", "grad_norm"), rel=1e-4), name


@pytest.mark.slow
def test_a_checkpoint_saved_with_one_group_at_tp2_resumes_at_tp1_and_back(tmp_path, corpus_cache):
    single = train(tmp_path, corpus_cache, "single", 1, *QWEN)
    for name, (first, then) in {"tp2_tp1": ((2, TP2), (1, [])), "tp1_tp2": ((1, []), (2, TP2))}.items():
        save = ["--save", str(tmp_path / name), "--exit-interval", "3"]
        before = train(tmp_path, corpus_cache, f"{name}_a", first[0], *QWEN, *first[1], *save)
        after = train(tmp_path, corpus_cache, f"{name}_b", then[0], *QWEN, *then[1], "--load", str(tmp_path / name))
        assert before == pytest.approx(single[:3], rel=1e-4), name
        assert after == pytest.approx(single[3:], rel=1e-4), name


def _saved_and_predicted_per_rank(rank, world_size):
    from base.options import replace_settings
    from gpt.model import build_gpt_model
    from gpt.shape import model_shape
    from parallel.state import destroy, initialize
    from tests.gpt.test_saved_activations import BATCH, LLAMA
    from zero.activations import SavedTensorMeter

    state = initialize("cpu", tensor_parallel_size=2)
    tokens = BATCH * LLAMA.seq_length
    figures = {}
    try:
        for groups in (1, 2):
            config = replace_settings(LLAMA, num_query_groups=groups, recompute_modules=("layernorm",))
            block = build_gpt_model(config, state, seed=3, dtype=torch.bfloat16).blocks[0]
            hidden = torch.randn(BATCH, config.seq_length, config.hidden_size,
                                 generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).requires_grad_()
            meter = SavedTensorMeter(torch.device("cpu"))
            with meter.hooks():
                output = block(hidden)
                saved = meter.live["device"]
            del output
            terms = model_shape(config, 2).activations
            figures[groups] = (saved, tokens * (terms.replicated_bytes_per_token + terms.partitioned_bytes_per_token // 2))
    finally:
        destroy(state)
    return figures


@pytest.mark.slow
def test_at_tp2_a_block_with_one_group_keeps_and_is_planned_to_keep_what_one_with_two_keeps():
    for figures in run_distributed(_saved_and_predicted_per_rank, 2, timeout=300):
        assert figures[1] == figures[2], figures
