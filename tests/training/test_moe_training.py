"""A tiny MoE GPT (4 experts, top-2, dropless) trains end to end through pretrain_gpt.py from Megatron-LM's flags
(issue 51 item 1): the load-balancing loss is logged beside the LM loss and not inside it (Megatron-Core's
MoEAuxLossAutoScaler adds only its gradient, megatron/core/transformer/moe/moe_utils.py); and at expert-parallel
size 1 the experts are ordinary parameters to ZeRO: 2 data-parallel ranks at ZeRO 1, 2 and 3 log ZeRO 0's
losses and gradient norms."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import pytest
import torch

from parallel.state import ParallelState
from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, metrics_records, train

# Megatron-LM's spelling of the MoE settings, as its functional tests give them
# (tests/functional_tests/test_cases/gpt/gpt3_mcore_te_tp1_pp1_ep1_resume_torch_dist_te_8experts2parallel_*)
SINGLE = ParallelState(device=torch.device("cpu"))
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
    common = TINY + MOE + ["--global-batch-size", "4", "--train-iters", "3", "--data-cache-dir", corpus_cache_300,
                           "--moe-per-layer-logging"]
    stages = ("0", "1", "2", "3")
    argv = [common + ["--zero-stage", stage, "--metrics-file", str(tmp_path / f"zero{stage}.jsonl")] for stage in stages]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in stages], timeout=600)

    def logged(stage):
        lines = (tmp_path / f"zero{stage}.jsonl").read_text().splitlines()
        return [value for r in map(json.loads, lines) if "loss" in r
                for value in (r["loss"], r["grad_norm"], r["load_balancing_loss"])]

    reference = logged("0")
    assert len(reference) == 3 * 3
    # --moe-per-layer-logging: every expert's tokens summed over both ranks, 4 sequences of 16 tokens x top-2
    for stage in stages:
        for record in map(json.loads, (tmp_path / f"zero{stage}.jsonl").read_text().splitlines()):
            if "moe_per_layer" in record:
                assert [sum(layer) for layer in record["moe_per_layer"]["tokens_per_expert"]] == [4 * 16 * 2] * 2
    for stage in stages[1:]:
        assert logged(stage) == pytest.approx(reference, rel=1e-6, abs=0), stage


def test_a_moe_run_saved_and_resumed_continues_exactly(corpus_cache_300, tmp_path):
    """The experts are parameters under their own names: a save at iteration 2 resumes to the straight run's
    losses and balancing losses."""
    from tests.reliability_helpers import straight_and_resumed

    argv = TINY + MOE + ["--train-iters", "4", "--data-cache-dir", corpus_cache_300]
    straight, split, _ = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert [(r["iteration"], r["loss"], r["load_balancing_loss"]) for r in straight] == \
           [(r["iteration"], r["loss"], r["load_balancing_loss"]) for r in split]


def test_a_run_with_the_expert_bias_saved_and_resumed_continues_exactly(corpus_cache_300, tmp_path):
    """Aux-loss-free balancing (--moe-router-enable-expert-bias): Megatron-Core's TopKRouter saves `expert_bias`
    as a persistent buffer and not `local_tokens_per_expert` (megatron/core/transformer/moe/router.py,
    Router.__init__'s register_buffer calls; the counts are zero between iterations). A save at iteration 2 holds
    each router's bias, moved off zero by the updates, and the resume's losses are the straight run's, bitwise."""
    from checkpoint.format import read_metadata, resolve_checkpoint
    from tests.reliability_helpers import straight_and_resumed

    argv = TINY + MOE + ["--train-iters", "5", "--data-cache-dir", corpus_cache_300, "--moe-router-score-function",
                         "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "0.05"]
    straight, split, save = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert [(r["iteration"], r["loss"], r["grad_norm"]) for r in straight] == \
           [(r["iteration"], r["loss"], r["grad_norm"]) for r in split]
    assert len(straight) == 5
    saved = read_metadata(resolve_checkpoint(save))["expert_bias"]
    assert sorted(saved) == ["blocks.0.mlp.router.expert_bias", "blocks.1.mlp.router.expert_bias"]
    assert all(len(values) == 4 and any(value != 0 for value in values) for values in saved.values())


def test_gpt2_blocks_with_experts_are_refused_at_export_in_one_line(corpus_cache_300, tmp_path):
    """GPT-2's blocks with experts are neither a Mixtral nor a Qwen2-MoE (tests/checkpoint/test_hf_moe.py exports
    those): refused in one line, exit 2."""
    from tests.reliability_helpers import run_main

    save = tmp_path / "ckpt"
    trained = train(corpus_cache_300, tmp_path, *MOE, "--save", str(save))
    assert trained.code == 0, trained.err[-2000:]
    from scripts.tools import convert_to_hf

    exported = run_main(convert_to_hf.main, [str(save), str(tmp_path / "hf")])
    assert exported.code == 2 and "as a MixtralForCausalLM this one would need --normalization RMSNorm" in exported.err
    assert len(exported.err.strip().splitlines()) == 1


def test_the_planner_plans_a_moe_model_counting_every_expert():
    """zero.plan dry-run on an MoE launch runs (on the meta device each expert takes an equal share of the
    tokens: full MoE planning is later) and its parameter count holds every expert."""
    from arguments.parser import parse_config
    from gpt.model import GPTModel
    from planner.dry_run import Cluster, dry_run
    from training.metrics import parameter_count

    config = parse_config(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
                           "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2",
                           "--global-batch-size", "4", "--num-experts", "4", "--zero-stage", "2"])
    plan = dry_run(config, Cluster(2, 2, None, "cpu"), 300, 0)
    padded = dataclasses.replace(config.model, vocab_size=300).padded_vocab_size()
    assert plan.parameters_total == parameter_count(config.model, padded) == sum(
        p.numel() for p in GPTModel(dataclasses.replace(config.model, vocab_size=300), SINGLE).parameters())
    dense = parse_config(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
                          "--seq-length", "16", "--max-position-embeddings", "16"])
    # each MoE layer holds 4 experts of the dense MLP's size and a 4 x 32 router (with bias)
    mlp = 2 * 32 * 128 + 128 + 32
    assert plan.parameters_total - parameter_count(dense.model, padded) == 2 * (3 * mlp + 4 * 32 + 4)


def test_two_pipeline_stages_one_without_moe_layers_log_the_one_stage_losses(corpus_cache_300, tmp_path):
    """--moe-layer-freq ([0]+[1]) on 2 layers over 2 stages: the first stage holds no MoE layer, yet joins the
    logging's reduction over the stages (a missing collective would hang), and the losses, gradient norms and
    load-balancing loss are the one-stage run's."""
    import pretrain_gpt

    flags = TINY + MOE + ["--moe-layer-freq", "([0]+[1])", "--train-iters", "3", "--data-cache-dir", corpus_cache_300,
                          "--moe-per-layer-logging"]
    single, staged = tmp_path / "single.jsonl", tmp_path / "pp2.jsonl"
    assert pretrain_gpt.main(flags + ["--metrics-file", str(single)]) == 0
    run_distributed(launch_rank, 2, [flags + ["--pipeline-model-parallel-size", "2", "--metrics-file", str(staged)]],
                    [free_port()], timeout=300)

    def logged(path):
        return [value for r in map(json.loads, path.read_text().splitlines()) if "loss" in r and "split" not in r
                for value in (r["loss"], r["grad_norm"], r["load_balancing_loss"], r["z_loss"])]

    assert len(logged(single)) == 3 * 4
    assert logged(staged) == pytest.approx(logged(single), rel=1e-6, abs=0)

    def tokens(path):  # --moe-per-layer-logging: the second stage's layer reaches rank 0's record
        return [r["moe_per_layer"]["tokens_per_expert"] for r in map(json.loads, path.read_text().splitlines())
                if "moe_per_layer" in r]

    assert tokens(staged) == tokens(single) and tokens(single)[0][0] is None and sum(tokens(single)[0][1]) == 64


def test_per_layer_logging_gives_each_moe_layers_losses_and_tokens_per_expert(corpus_cache_300, tmp_path):
    """Megatron-LM's --moe-per-layer-logging: per layer (None for a dense one), the balancing losses (their mean
    over the MoE layers is the logged load_balancing_loss) and the tokens each expert received: 2 sequences of
    16 tokens, top-2, 2 micro-batches (--global-batch-size 4), so 128 per MoE layer."""
    moe = records(corpus_cache_300, tmp_path / "moe", *MOE, "--moe-layer-freq", "([0]+[1])", "--train-iters", "2",
                  "--global-batch-size", "4", "--moe-per-layer-logging")
    for record in moe:
        per_layer = record["moe_per_layer"]
        assert per_layer["load_balancing_loss"][0] is None and per_layer["tokens_per_expert"][0] is None
        assert per_layer["load_balancing_loss"][1] == pytest.approx(record["load_balancing_loss"], rel=1e-12)
        assert sum(per_layer["tokens_per_expert"][1]) == 2 * 2 * 16 * 2 and len(per_layer["tokens_per_expert"][1]) == 4
    assert "moe_per_layer" not in records(corpus_cache_300, tmp_path / "plain", *MOE, "--train-iters", "1")[0]


def test_a_megatron_deepspeed_moe_launch_trains_with_deepspeed_moe_gating(corpus_cache_300, tmp_path):
    """Megatron-DeepSpeed's MoE flags as its examples_deepspeed/MoE/ds_pretrain_gpt_*_MoE*.sh pass them (at
    expert-parallel size 1): DeepSpeed-MoE's top-2 gating on every 2nd layer (--expert-interval's default), the
    moe_loss (l_aux x --moe-loss-coeff, summed over the MoE layers) logged beside the LM loss, and training that
    reaches its last iteration with finite losses."""
    flags = ["--num-layers", "4", "--num-experts", "4", "--deepspeed", "--no-pipeline-parallel",
             "--moe-expert-parallel-size", "1", "--topk", "2", "--moe-loss-coeff", "0.01",
             "--moe-train-capacity-factor", "1.0", "--moe-eval-capacity-factor", "1.0", "--moe-min-capacity", "4",
             "--create-moe-param-group", "--seed", "5", "--train-iters", "3"]
    logged = records(corpus_cache_300, tmp_path / "ds", *flags)
    assert [r["iteration"] for r in logged] == [1, 2, 3] and all(math.isfinite(r["loss"]) for r in logged)
    # l_aux is about 1 per layer when balanced (E^2 x mean of E products of about 1/E): 2 layers x 0.01
    assert all(0.015 < r["moe_loss"] < 0.03 for r in logged) and "load_balancing_loss" not in logged[0]
