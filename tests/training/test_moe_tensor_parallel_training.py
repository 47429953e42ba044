"""MoE with tensor parallelism end to end through pretrain_gpt.py (issue 51's acceptance: "also with TP 2 x EP 2
(expert TP 1 and 2)"): 4 experts, top-2, dropless, fp32 on CPU gloo, 5 iterations, against the plain TP 1 EP 1 run
on the same 4 ranks and the same global batch.

Megatron-Core is the spec. With TP the MoE layer runs on the sequence-parallel slices (MoELayer.forward refuses TP
without --sequence-parallel in training, megatron/core/transformer/moe/moe_layer.py); the router is replicated
over TP with its gradient summed over the TP group (router.py Router: `setattr(self.weight, 'sequence_parallel',
...)`) and its balancing losses count tokens over the tp_cp group (moe_utils.py
get_tokens_per_expert_and_token_count; apply_z_loss divides the coefficient by the tp_cp size); with expert TP 2
(megatron/training/arguments.py: --expert-tensor-parallel-size defaults to --tensor-model-parallel-size) each
expert's linear_fc1 is column- and linear_fc2 row-split over the expert TP group (experts.py), the dispatchers
gather the ETP peers' rows and sum their partial outputs (token_dispatcher.py, tp_ep_group / tp_group paths).

Equal to <= 1e-6 relative, not bitwise: the loss is a mean over micro-batches accumulated in another order (2
data-parallel ranks x 2 micro-batches against 4 x 1), the router's and the experts' gradients are sums over the TP
slices and the expert data-parallel group in another order, each balancing loss is a sum of the TP slices' shares,
and under expert TP each expert's output is the sum of two partial matmuls."""

from __future__ import annotations

import json

import pytest

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, run_main
from tests.training.test_moe_training import launch_rank

# tests/training/test_moe_training.py's MoE model (aux loss and z-loss on), dispatcher chosen per run
MOE = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
       "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-grouped-gemm", "--seed", "5"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2"]


def logged(path):
    return [(r["loss"], r["grad_norm"], r["load_balancing_loss"], r["z_loss"])
            for r in map(json.loads, path.read_text().splitlines()) if "loss" in r and "split" not in r]


def run_variants(corpus, tmp_path, variants, common=()):
    argv = [TINY + MOE + ["--train-iters", "5", "--global-batch-size", "8", "--data-cache-dir", corpus,
                          "--moe-per-layer-logging", *common] + extra
            + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in variants.items()]
    run_distributed(launch_rank, 4, argv, [free_port() for _ in variants], timeout=900)
    return {name: logged(tmp_path / f"{name}.jsonl") for name in variants}


def tokens_per_expert(path):
    return [r["moe_per_layer"]["tokens_per_expert"] for r in map(json.loads, path.read_text().splitlines())
            if "moe_per_layer" in r]


def assert_equal_runs(runs, tmp_path, reference="tp1"):
    expected = [value for record in runs[reference] for value in record]
    assert len(runs[reference]) == 5
    for name, records in runs.items():
        assert [value for record in records for value in record] == pytest.approx(expected, rel=1e-6, abs=0), name
        # every expert's tokens, summed over the TP slices and data-parallel ranks: 8 sequences x 16 x top-2
        counts = tokens_per_expert(tmp_path / f"{name}.jsonl")
        assert counts and all(sum(layer) == 8 * 16 * 2 for record in counts for layer in record), name
        assert counts == tokens_per_expert(tmp_path / f"{reference}.jsonl"), name


@pytest.mark.slow
@pytest.mark.parametrize("expert_tp", ["1", "2"])
def test_tensor_parallel_2_by_expert_parallel_2_trains_as_tp_1_ep_1_with_both_dispatchers(corpus_cache_300,
                                                                                          tmp_path, expert_tp):
    """4 ranks. Expert TP 1: the expert-parallel groups are the TP pairs {0,1} {2,3} (each TP rank holds 2 whole
    experts and routes its sequence slice), the expert data-parallel groups the DP pairs. Expert TP 2: the ETP
    groups are the TP pairs, each rank holding half of each of its EP rank's experts, EP over {0,2} {1,3}."""
    etp = [] if expert_tp == "2" else ["--expert-tensor-parallel-size", "1"]  # 2 is Megatron's default (= TP)
    runs = run_variants(corpus_cache_300, tmp_path, {
        "tp1": [],
        "alltoall": TP2 + etp + ["--moe-token-dispatcher-type", "alltoall"],
        "allgather": TP2 + etp + ["--moe-token-dispatcher-type", "allgather"]})
    assert_equal_runs(runs, tmp_path)
