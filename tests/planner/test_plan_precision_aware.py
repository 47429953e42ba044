"""The memory model, the planner and the live memory record count bf16 Adam moments (--use-precision-aware-optimizer
--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16, zero/precision_aware.py) at 2 bytes per partition element each, where
fp32 ones take 4 (Megatron-LM's precision-aware optimizer: TransformerEngine's FusedAdam allocates the moments in
exp_avg_dtype / exp_avg_sq_dtype, megatron/core/optimizer/__init__.py)."""

import json

import pytest

from arguments.parser import parse_config
from planner import plan as planner_cli
from planner.dry_run import Cluster, dry_run
from tests.zero.test_zero_training import COMMON
from zero.memory import predict_model_state_bytes

SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8"]
AWARE = ["--use-precision-aware-optimizer", "--bf16"]
BF16_MOMENTS = [*AWARE, "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]


def plan_json(capsys, *flags):
    assert planner_cli.main(["dry-run", "--world-size", "2", "--json", *SMALL, *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("stage", ["1", "3"])
def test_the_dry_run_counts_two_bytes_per_bf16_moment_element(capsys, stage):
    fp32 = plan_json(capsys, "--zero-stage", stage, *AWARE)["model_state_bytes"]
    bf16 = plan_json(capsys, "--zero-stage", stage, *BF16_MOMENTS)["model_state_bytes"]
    one = plan_json(capsys, "--zero-stage", stage, *AWARE, "--exp-avg-sq-dtype", "bf16")["model_state_bytes"]
    assert fp32["optimizer_states"] == 2 * fp32["master_weights"] > 0
    assert bf16["optimizer_states"] == fp32["master_weights"] == bf16["master_weights"]
    assert 2 * one["optimizer_states"] == 3 * fp32["master_weights"]
    assert fp32["total"] - bf16["total"] == fp32["master_weights"]


def test_offloaded_bf16_moments_are_counted_on_the_host(capsys):
    host = plan_json(capsys, "--zero-stage", "2", "--offload-optimizer", *BF16_MOMENTS)["host_model_state_bytes"]
    assert host["optimizer_states"] == host["master_weights"] > 0
    assert planner_cli.main(["dry-run", "--world-size", "2", *SMALL, "--zero-stage", "2", "--offload-optimizer",
                             *BF16_MOMENTS]) == 0
    assert "host: Adam moments (bf16, bf16) (offloaded)" in capsys.readouterr().out


def test_the_prediction_counts_two_bytes_per_bf16_moment():
    assert predict_model_state_bytes(1000, 1, 2, "bf16")["optimizer_states"] == 8 * 500
    assert predict_model_state_bytes(1000, 1, 2, "bf16", moment_dtypes=("bf16", "bf16"))["optimizer_states"] == 4 * 500
    assert predict_model_state_bytes(1000, 0, 2, "bf16", moment_dtypes=("fp32", "bf16"))["optimizer_states"] == 6000


def test_the_performance_model_streams_half_the_moment_bytes():
    """The optimizer term is memory-bound: bf16 moments move 2 x 4 bytes per element where fp32 ones move 2 x 8."""
    from planner.perf_model import Constants, load_hardware, predict

    h100, constants = load_hardware("h100-sxm"), Constants(0.5, 10.0, 0.0, "test")
    terms = {}
    for name, flags in (("fp32", AWARE), ("bf16", BF16_MOMENTS)):
        config = parse_config([*SMALL, "--zero-stage", "1", *flags])
        plan = dry_run(config, Cluster(2, 8, None, "cuda"), 1000)
        terms[name] = predict(plan, config, 1000, 2, h100, constants).terms["optimizer"]
    assert terms["bf16"] / terms["fp32"] == pytest.approx((26 - 8 + 8) / (26 + 8))


def test_the_live_memory_record_and_the_dry_run_agree(tmp_path, corpus_cache):
    """One live step at ZeRO 1 with bf16 moments: its memory record measures what the prediction says (2 bytes per
    moment element) and what the dry run of the same flags holds, category by category."""
    import pretrain_gpt
    from data.corpus import prepare_default_corpus

    flags = [*BF16_MOMENTS, "--zero-stage", "1", "--train-iters", "1", "--report-memory", "--global-batch-size", "8",
             "--micro-batch-size", "4"]
    metrics = tmp_path / "m.jsonl"
    assert pretrain_gpt.main([*COMMON, *flags, "--data-cache-dir", corpus_cache, "--metrics-file", str(metrics)]) == 0
    (memory,) = [json.loads(line)["memory"] for line in open(metrics) if "memory" in json.loads(line)]
    (live,) = memory
    assert live["predicted_optimizer_states_bytes"] == live["predicted_master_weights_bytes"] > 0
    padding = 4 * live["padding_elements"]
    assert live["measured_optimizer_states_bytes"] == live["predicted_optimizer_states_bytes"] + padding
    vocab = prepare_default_corpus(corpus_cache, 512).vocab_size
    plan = dry_run(parse_config([*COMMON, *flags]), Cluster(1, 1, device_type="cpu"), vocab, rank=0)
    for category in ("parameters", "gradients", "master_weights", "optimizer_states", "total"):
        assert plan.model_state_bytes[category] == live[f"measured_{category}_bytes"], category
    assert plan.buffer_bytes == live["measured_buffers_bytes"]


def test_the_dry_run_counts_the_steps_two_windows():
    """At stage 2 on GPUs (fp32) fused AdamW's step allocates nothing; with bf16 moments the step holds two fp32 windows
    (zero/precision_aware.py: the upcast moments, reused for the denominator and the update), at most the largest
    piece it steps."""
    from zero.precision_aware import TEMPORARIES, WINDOW

    def plan(*extra):
        return dry_run(parse_config([*SMALL, "--zero-stage", "2", *extra]), Cluster(2, 2, device_type="cuda"), 1000)

    moments = ["--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"]
    assert plan("--use-precision-aware-optimizer").step_working_bytes == 0
    bf16 = plan("--use-precision-aware-optimizer", *moments)
    assert TEMPORARIES == 2 and bf16.step_working_bytes > 0 and bf16.step_working_bytes % (4 * TEMPORARIES) == 0
    assert bf16.step_working_bytes // (4 * TEMPORARIES) <= min(WINDOW, -(-bf16.parameters_local // 2))
