"""The planner counts --optimizer ademamix's three fp32 states (issue 54): 12 bytes per element of the
partition beside the fp32 master's 4, where Adam keeps 8 (swiss-ai/Megatron-LM megatron/core/optimizer/
ademamix.py AdEMAMix.step: exp_avg_fast, exp_avg_slow and exp_avg_sq, each zeros_like the parameter)."""

import json

import pytest
import torch

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from planner import plan as planner_cli
from tests.zero.test_zero_distributed import tiny_gpt2
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig
from zero.memory import measure_tensor_bytes, predict_model_state_bytes

SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8"]


def plan_json(capsys, *flags):
    assert planner_cli.main(["dry-run", "--world-size", "2", "--json", *SMALL, *flags]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("stage", ["1", "3"])
def test_the_dry_run_counts_three_states_for_ademamix_and_two_for_adam(capsys, stage):
    adam = plan_json(capsys, "--zero-stage", stage, "--bf16")["model_state_bytes"]
    ademamix = plan_json(capsys, "--zero-stage", stage, "--bf16", "--optimizer", "ademamix")["model_state_bytes"]
    assert adam["optimizer_states"] == 2 * adam["master_weights"] > 0
    assert ademamix["optimizer_states"] == 3 * ademamix["master_weights"] == 3 * adam["master_weights"]
    assert ademamix["total"] - adam["total"] == adam["master_weights"]


def test_offloaded_ademamix_states_are_counted_on_the_host(capsys):
    record = plan_json(capsys, "--zero-stage", "2", "--bf16", "--offload-optimizer", "--optimizer", "ademamix")
    host = record["host_model_state_bytes"]
    assert record["model_state_bytes"]["optimizer_states"] == 0
    assert host["optimizer_states"] == 3 * host["master_weights"] > 0
    assert planner_cli.main(["dry-run", "--world-size", "2", *SMALL, "--zero-stage", "2", "--offload-optimizer",
                             "--optimizer", "ademamix"]) == 0
    assert "host: AdEMAMix moments (m1, m2, nu) (offloaded)" in capsys.readouterr().out


def test_the_prediction_is_what_the_live_optimizer_holds():
    """zero/memory.py's prediction (the live run's memory report compares against it) with optimizer="ademamix":
    12 bytes per partition element of states, the bytes the live sharded optimizer's tensors measure."""
    state = initialize("cpu", 1)
    try:
        model = tiny_gpt2()
        zero = ZeroHarness(model, OptimizerConfig(optimizer="ademamix"), ZeroConfig(stage=1), state)
        measured = measure_tensor_bytes(zero.sharded.model_state_tensors())
        predicted = predict_model_state_bytes(zero.sharded.num_parameters, 1, 1, "fp32", optimizer="ademamix")
        padding = zero.sharded.padding
        assert predicted["optimizer_states"] == 12 * zero.sharded.num_parameters
        assert measured["optimizer_states"] == 12 * (zero.sharded.num_parameters + padding)
        assert predict_model_state_bytes(1000, 1, 2, "bf16")["optimizer_states"] == 8 * 500
        assert predict_model_state_bytes(1000, 1, 2, "bf16", optimizer="ademamix")["optimizer_states"] == 12 * 500
        assert zero.sharded.exp_avg_slow.dtype == torch.float32
    finally:
        destroy(state)


def test_the_performance_model_streams_the_third_state():
    """The optimizer term is memory-bound: AdEMAMix reads and writes one more fp32 state per partition element
    (8 bytes) than Adam's fp32 master and two moments (24) and 16-bit parameter (2), beside the gradient reads."""
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run
    from planner.perf_model import Constants, load_hardware, predict

    h100, constants = load_hardware("h100-sxm"), Constants(0.5, 10.0, 0.0, "test")
    terms = {}
    for optimizer in ("adam", "ademamix"):
        config = parse_config([*SMALL, "--zero-stage", "1", "--bf16", "--optimizer", optimizer])
        plan = dry_run(config, Cluster(2, 8, None, "cuda"), 1000)
        terms[optimizer] = predict(plan, config, 1000, 2, h100, constants).terms["optimizer"]
    # the gradient partition (fp32: the reduction accumulates in fp32 by default) is read twice: 2 x 4 bytes
    assert config.training.gradient_precision == "fp32"
    assert terms["ademamix"] / terms["adam"] == pytest.approx((34 + 8) / (26 + 8))


def test_the_dry_run_counts_the_steps_three_windows():
    """At stage 2 on GPUs AdamW's step allocates nothing (the fused kernel in place, the reducer's own fp32
    partition); AdEMAMix's holds three fp32 temporaries of one window (zero/ademamix.py), at most the largest
    piece it steps."""
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run
    from zero.ademamix import TEMPORARIES, WINDOW

    def plan(*extra):
        config = parse_config([*SMALL, "--zero-stage", "2", *extra])
        return dry_run(config, Cluster(2, 2, device_type="cuda"), 1000)

    assert plan().step_working_bytes == 0
    ademamix = plan("--optimizer", "ademamix")
    assert ademamix.step_working_bytes > 0 and ademamix.step_working_bytes % (4 * TEMPORARIES) == 0
    largest = ademamix.step_working_bytes // (4 * TEMPORARIES)
    assert largest <= min(WINDOW, -(-ademamix.parameters_local // 2))
