"""A tiny MoE GPT (4 experts, top-2, dropless) trains end to end through pretrain_gpt.py from Megatron-LM's flags
(issue 51 item 1): the load-balancing loss is logged beside the LM loss and not inside it (Megatron-Core's
MoEAuxLossAutoScaler adds only its gradient, megatron/core/transformer/moe/moe_utils.py); and at expert-parallel
size 1 the experts are ordinary parameters to ZeRO: 2 data-parallel ranks at ZeRO 1, 2 and 3 log ZeRO 0's
losses and gradient norms."""

from __future__ import annotations

import json
import math
import os

import pytest

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, metrics_records, train

# Megatron-LM's spelling of the MoE settings, as its functional tests give them
# (tests/functional_tests/test_cases/gpt/gpt3_mcore_te_tp1_pp1_ep1_resume_torch_dist_te_8experts2parallel_*)
MOE = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
       "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-grouped-gemm",
       "--moe-token-dispatcher-type", "alltoall", "--seed", "5"]


def records(corpus_cache_300, workdir, *flags):
    workdir.mkdir()
    outcome = train(corpus_cache_300, workdir, *flags)
    assert outcome.code == 0, outcome.err[-3000:]
    return [record for record in metrics_records(workdir / "metrics.jsonl") if "loss" in record and "split" not in record]


def test_a_tiny_moe_gpt_trains_from_megatrons_flags_with_the_balancing_loss_beside_the_lm_loss(corpus_cache_300,
                                                                                             tmp_path):
    moe = records(corpus_cache_300, tmp_path / "moe", *MOE, "--train-iters", "6")
    assert [record["iteration"] for record in moe] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(record["loss"]) for record in moe)
    assert all(0.9 < record["load_balancing_loss"] < 2.0 and record["z_loss"] > 0 for record in moe)
    # the same launch without the coefficients: iteration 1's LM loss is the same number (the losses are not
    # added to it), and from iteration 2 on the weights differ (their gradients were)
    coefficients = {"--moe-aux-loss-coeff": "0", "--moe-z-loss-coeff": "0"}
    plain_flags = [coefficients.get(previous, flag) for previous, flag in zip([None] + MOE, MOE)]
    plain = records(corpus_cache_300, tmp_path / "plain", *plain_flags, "--train-iters", "2")
    assert plain[0]["loss"] == moe[0]["loss"] and plain[1]["loss"] != moe[1]["loss"]
    # computed (and logged) only at a positive coefficient, as TopKRouter.is_aux_loss_enabled
    assert "load_balancing_loss" not in plain[0]
    dense = records(corpus_cache_300, tmp_path / "dense", "--num-layers", "2", "--seed", "5", "--train-iters", "2")
    assert dense[0]["loss"] != moe[0]["loss"]


def launch_rank(rank, world_size, argv_by_stage, ports):
    import pretrain_gpt

    for argv, port in zip(argv_by_stage, ports):
        os.environ["MASTER_PORT"] = str(port)
        assert pretrain_gpt.main(argv) == 0


@pytest.mark.slow
def test_zero_1_2_3_on_two_data_parallel_ranks_train_the_moe_model_as_zero_0(corpus_cache_300, tmp_path):
    common = TINY + MOE + ["--global-batch-size", "4", "--train-iters", "3", "--data-cache-dir", corpus_cache_300]
    stages = ("0", "1", "2", "3")
    argv = [common + ["--zero-stage", stage, "--metrics-file", str(tmp_path / f"zero{stage}.jsonl")] for stage in stages]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in stages], timeout=600)

    def logged(stage):
        lines = (tmp_path / f"zero{stage}.jsonl").read_text().splitlines()
        return [value for r in map(json.loads, lines) if "loss" in r
                for value in (r["loss"], r["grad_norm"], r["load_balancing_loss"])]

    reference = logged("0")
    assert len(reference) == 3 * 3
    for stage in stages[1:]:
        assert logged(stage) == pytest.approx(reference, rel=1e-6, abs=0), stage
