"""--optimizer muon at TP 2 logs one rank's losses (issue 81: "Muon at TP 2: losses equal one rank's").

Megatron-LM (main) megatron/core/optimizer/emerging_optimizers.py `TensorParallelMuon.orthogonalize` and
Emerging-Optimizers muon_utils.py `newton_schulz_tp`: duplicated gathers each TP-cut matrix (column-parallel rows,
row-parallel columns; the QKV weight's query, key and value blocks of this rank's query groups) and runs NS on the
whole; distributed runs it over the shards; blockwise on each shard alone (tests/zero/test_muon_tensor_parallel.py
has the step's exact comparisons). Each rank runs `pretrain_gpt.main` (tests/distributed.py) in fp32, dropout off,
NS in fp32 (--muon-fp32-matmul-prec high): TP sums a row-parallel layer's partial products in another order than
one rank's matmul, so the gradients differ in the last bits, which bf16 NS would round into a bf16 step's
difference. Grouped-query attention (2 groups, one per TP rank) puts the QKV split across the cut.
"""

import pytest
import torch

import zero.muon
from tests.training.test_tensor_parallel_training import NO_DROPOUT, train

MUON = [*NO_DROPOUT, "--optimizer", "muon", "--muon-fp32-matmul-prec", "high", "--lr", "0.01",
        "--group-query-attention", "--num-query-groups", "2", "--train-iters", "8"]
TP2 = ["--tensor-model-parallel-size", "2"]
# TP sums reorder the last bits of the gradients (tests/training/test_tensor_parallel_training.py compares Adam's
# TP runs at rel 1e-4); Muon's measured losses here differ by at most 9e-8 relative (1e-5 with bf16 NS)
TOLERANCE = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["duplicated", "distributed"])
def test_tp_2_muon_losses_are_one_ranks(tmp_path, corpus_cache, mode):
    mode_flag = ["--muon-tp-mode", mode]
    single = train(tmp_path, corpus_cache, "single", 1, *MUON, *mode_flag)
    tp2 = train(tmp_path, corpus_cache, "tp2", 2, *MUON, *mode_flag, *TP2)
    assert len(single) == 8 and single[-1] < single[0] - 0.3
    assert tp2 == pytest.approx(single, rel=TOLERANCE, abs=0)
    if mode == "duplicated":  # TP 2 x DP 2, ZeRO 1: the partition's pieces summed first, then gathered over TP
        zero = train(tmp_path, corpus_cache, "tp2dp2", 4, *MUON, *mode_flag, *TP2, "--zero-stage", "1")
        assert zero == pytest.approx(single, rel=TOLERANCE, abs=0)


@pytest.mark.slow
def test_tp_2_muon_losses_with_experts_cut_over_expert_tp_are_one_ranks(tmp_path, corpus_cache):
    """TensorParallelMuon.orthogonalize takes pg_collection.expt_tp for an expert's weights: ours gathers an expert
    cut over expert TP (2, the TP size by default) over that group, whether the dense ZeRO steps it (EP 1: the same
    ranks as TP) or the experts' own (EP 2, 4 ranks: zero/experts.py). Measured 8e-8 relative."""
    moe = [*MUON, "--muon-tp-mode", "duplicated", "--num-experts", "2", "--moe-router-topk", "2",
           "--moe-token-dispatcher-type", "alltoall"]
    single = train(tmp_path, corpus_cache, "single", 1, *moe)
    etp2 = train(tmp_path, corpus_cache, "etp2", 2, *moe, *TP2, "--sequence-parallel")
    ep2 = train(tmp_path, corpus_cache, "ep2", 4, *moe, *TP2, "--sequence-parallel", "--expert-model-parallel-size", "2")
    assert single[-1] < single[0] - 0.3
    assert etp2 == pytest.approx(single, rel=TOLERANCE, abs=0)
    assert ep2 == pytest.approx(single, rel=TOLERANCE, abs=0)


def blockwise_oracle(orthogonalize, parts):
    """One rank's NS of each of the `parts` TP shards of a matrix alone, as a TP rank under blockwise runs it."""
    def each_shard(update, config, split=None, tp_dim=None, tp=None):
        if tp_dim is None:
            return orthogonalize(update, config, split)
        return torch.cat([orthogonalize(shard.contiguous(), config, split) for shard in update.chunk(parts, tp_dim)],
                         dim=tp_dim)
    return each_shard


@pytest.mark.slow
def test_tp_2_blockwise_losses_are_the_one_rank_oracles(tmp_path, corpus_cache, monkeypatch):
    """The oracle: one rank whose Muon orthogonalizes each matrix's two TP shards apart (the shards of a TP 2 run:
    the sharding record's dimension, cut in two), each scaled by its own shape. Without it the one-rank run takes
    other steps (blockwise is not the whole matrix's update)."""
    blockwise = [*MUON, "--muon-tp-mode", "blockwise"]
    tp2 = train(tmp_path, corpus_cache, "tp2", 2, *blockwise, *TP2)
    whole = train(tmp_path, corpus_cache, "whole", 1, *blockwise)
    monkeypatch.setattr(zero.muon, "scaled_orthogonalize", blockwise_oracle(zero.muon.scaled_orthogonalize, 2))
    oracle = train(tmp_path, corpus_cache, "oracle", 1, *blockwise)
    assert tp2 == pytest.approx(oracle, rel=TOLERANCE, abs=0)
    assert whole != pytest.approx(oracle, rel=1e-4, abs=0)
