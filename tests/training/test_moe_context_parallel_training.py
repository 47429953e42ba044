"""MoE beside context parallelism (issues 51 x 52): CP 2 trains to the losses, gradient norms and logged balancing
losses of CP 1, 4 experts, top-2, dropless, fp32 on CPU gloo, 5 iterations, <= 1e-6 relative.

Megatron-Core is the spec. A CP rank holds chunks r and 2CP-1-r of every sequence, so its router sees a slice of the
tokens, and Megatron-Core counts over the tp_cp group (moe/router.py TopKRouter: `self.tp_cp_group =
pg_collection.tp_cp`):
- aux_loss and seq_aux_loss: tokens per expert summed over tp_cp, the token total local x tp_cp size
  (moe_utils.get_tokens_per_expert_and_token_count); seq_aux_loss's per-sequence counts so sum a sequence's chunks;
- z-loss: `moe_z_loss_coeff = self.config.moe_z_loss_coeff / self.tp_cp_group.size()` (apply_z_loss);
- global_aux_loss and the expert bias over tp_dp_cp (_apply_global_aux_loss; get_updated_expert_bias);
- the losses' backward scale carries the CP size (schedules.py forward_step_calc_loss:
  `MoEAuxLossAutoScaler.set_loss_scale(loss_scale * cp_size_for_scaling / num_microbatches)`), the gradients being
  averaged over DP x CP.
Counting over TP only would make each CP rank's losses a whole sequence's computed on half its tokens. Each grid runs
its configurations in one launch (2 ranks, then 4); the references run in this process (CP 1). Not bitwise: the
chunks' attention merges partial softmaxes and the gradients are summed over the CP ranks."""

from __future__ import annotations

import json

import pytest

import pretrain_gpt
from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, run_main
from tests.training.test_moe_training import launch_rank

MOE = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-grouped-gemm", "--seed", "5",
       "--train-iters", "5", "--global-batch-size", "4", "--moe-per-layer-logging"]
CONFIGS = {
    "aux_z": ["--moe-router-load-balancing-type", "aux_loss", "--moe-aux-loss-coeff", "1e-2",
              "--moe-z-loss-coeff", "1e-3"],
    "seq_aux": ["--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2"],
    # the global aux loss and the expert bias (sigmoid scores), their counts over TP x DP x CP; one micro-batch of
    # the 4 sequences, so that DP 2 (a micro-batch of 2 on each rank) counts the same tokens at once
    "global_bias": ["--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "1e-2",
                    "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
                    "--moe-router-bias-update-rate", "1e-2", "--micro-batch-size", "4"],
}
LOSS = {"aux_z": ("load_balancing_loss", "z_loss"), "seq_aux": ("seq_load_balancing_loss",),
        "global_bias": ("global_load_balancing_loss",)}
CP2 = ["--context-parallel-size", "2"]
# EP 2 beside CP 2 on the same 2 ranks: the experts' grid folds CP into its ranks (parallel/mesh.py
# expert_mesh_sizes), so each CP rank holds 2 experts and the alltoall dispatcher exchanges the chunks' tokens
EP2 = CP2 + ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]

# TP 2 x CP 2 on 4 ranks (Megatron's order: TP, then CP): each rank routes a TP slice of its CP chunks, and the
# tp_cp group is all 4
TP2_CP2 = CP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]


def _argv(corpus, tmp_path, name, config, *extra):
    return TINY + MOE + CONFIGS[config] + ["--data-cache-dir", corpus, "--metrics-file",
                                           str(tmp_path / f"{name}.jsonl"), *extra]


def _records(tmp_path, name):
    return [r for r in map(json.loads, (tmp_path / f"{name}.jsonl").read_text().splitlines())
            if "loss" in r and "split" not in r]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_cache_300):
    tmp_path = tmp_path_factory.mktemp("moe-cp")
    for config in CONFIGS:  # the references: one process, no context parallelism
        outcome = run_main(pretrain_gpt.main, _argv(corpus_cache_300, tmp_path, f"{config}-cp1", config))
        assert outcome.code == 0, outcome.err[-3000:]
    argv = [_argv(corpus_cache_300, tmp_path, f"{config}-cp2", config, *CP2) for config in CONFIGS]
    argv += [_argv(corpus_cache_300, tmp_path, "aux_z-cp2-ep2", "aux_z", *EP2),
             _argv(corpus_cache_300, tmp_path, "global_bias-dp2", "global_bias", "--micro-batch-size", "2")]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in argv], timeout=900)
    argv = [_argv(corpus_cache_300, tmp_path, f"{config}-tp2-cp2", config, *TP2_CP2) for config in ("aux_z", "seq_aux")]
    argv += [_argv(corpus_cache_300, tmp_path, "aux_z-cp2-pp2", "aux_z", *CP2, "--pipeline-model-parallel-size", "2")]
    run_distributed(launch_rank, 4, argv, [free_port() for _ in argv], timeout=900)
    return tmp_path


def _assert_equal(runs, config, name):
    reference, records = _records(runs, f"{config}-cp1"), _records(runs, name)
    assert len(reference) == len(records) == 5, name
    keys = ("loss", "grad_norm") + LOSS[config]
    for want, got in zip(reference, records):
        for key in keys:
            assert got[key] == pytest.approx(want[key], rel=1e-6, abs=0), (name, want["iteration"], key)
        # --moe-per-layer-logging's counts: every expert's tokens summed over the CP chunks (4 sequences x 16 x 2)
        assert got["moe_per_layer"]["tokens_per_expert"] == want["moe_per_layer"]["tokens_per_expert"], name
        assert all(sum(layer) == 4 * 16 * 2 for layer in got["moe_per_layer"]["tokens_per_expert"]), name
        for key in LOSS[config]:
            assert got["moe_per_layer"][key] == pytest.approx(want["moe_per_layer"][key], rel=1e-6, abs=0), name


@pytest.mark.slow
@pytest.mark.parametrize("config", list(CONFIGS))
def test_moe_at_context_parallel_2_trains_as_at_context_parallel_1(runs, config):
    """aux_loss + z-loss, seq_aux_loss, global_aux_loss with the expert bias: CP 2 = CP 1."""
    _assert_equal(runs, config, f"{config}-cp2")


@pytest.mark.slow
def test_moe_at_expert_parallel_2_beside_context_parallel_2_trains_as_one_rank(runs):
    """EP 2 over the CP 2 ranks (aux_loss + z-loss): CP 2 x EP 2 = CP 1 x EP 1."""
    _assert_equal(runs, "aux_z", "aux_z-cp2-ep2")


@pytest.mark.slow
@pytest.mark.parametrize("config", ["aux_z", "seq_aux"])
def test_moe_at_tensor_parallel_2_by_context_parallel_2_trains_as_one_rank(runs, config):
    """TP 2 x CP 2 (4 ranks): the counts over both groups, the z-loss coefficient / 4."""
    _assert_equal(runs, config, f"{config}-tp2-cp2")


@pytest.mark.slow
def test_moe_at_context_parallel_2_by_pipeline_parallel_2_trains_as_one_rank(runs):
    """CP 2 x PP 2 (4 ranks, one MoE layer per stage): each stage's router counts over its CP group; the logged
    losses gather the stages' layers."""
    _assert_equal(runs, "aux_z", "aux_z-cp2-pp2")


@pytest.mark.slow
def test_the_global_aux_loss_is_logged_as_the_sum_of_the_data_parallel_ranks_shares(runs):
    """DP 2 (no CP) against one rank, at iteration 1 (same weights, the same 4 sequences in one step): each DP
    rank's global aux loss is its tokens' share of the loss over the TP x DP x CP tokens, and Megatron-Core logs
    their sum (router.py _apply_global_aux_loss records it with `reduce_group=self.tp_dp_cp_group,
    needs_dp_avg=False`), not their mean over DP (half the loss here). Only iteration 1: from the step on the runs
    part, in Megatron-Core as here, since the shares' gradients are averaged over DP (the DP 2 step carries half
    the DP 1 step's global-aux-loss gradient)."""
    reference, records = _records(runs, "global_bias-cp1")[0], _records(runs, "global_bias-dp2")[0]
    for key in ("loss", "global_load_balancing_loss"):
        assert records[key] == pytest.approx(reference[key], rel=1e-6, abs=0), key
    layers = records["moe_per_layer"]
    assert layers["global_load_balancing_loss"] == pytest.approx(
        reference["moe_per_layer"]["global_load_balancing_loss"], rel=1e-6, abs=0)
    assert layers["tokens_per_expert"] == reference["moe_per_layer"]["tokens_per_expert"]
