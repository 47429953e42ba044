"""--optimizer muon --muon-tp-mode blockwise at TP 2 logs its one-rank oracle's losses (issue 81); duplicated and
distributed against one rank are rows of the combination table (tests/training/combinations.py).

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
from tests.training.combinations import MUON_OPTIMIZER
from tests.training.test_tensor_parallel_training import NO_DROPOUT, train

MUON = [*NO_DROPOUT, *MUON_OPTIMIZER]
TP2 = ["--tensor-model-parallel-size", "2"]
# TP sums reorder the last bits of the gradients (the combination table holds Adam's TP runs to rel 1e-4); Muon's
# measured losses differ by at most 9e-8 relative (1e-5 with bf16 NS)
TOLERANCE = 1e-5


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
