"""Megatron-LM's fully sharded data-parallel flags are the ZeRO stage that shards the same states.

Megatron-LM (megatron/training/arguments.py, megatron/training/training.py): `--use-torch-fsdp2` wraps the
model in torch's fully_shard (parameters, gradients and optimizer states sharded: stage 3; with
`--torch-fsdp2-no-reshard-after-forward`, whose help says "Set to enable FSDP ZeRO-2", stage 2);
`--use-megatron-fsdp` shards what `--data-parallel-sharding-strategy` names, default `optim_grads_params`
(megatron/core/distributed/distributed_data_parallel_config.py: no_shard, optim, optim_grads,
optim_grads_params). Before, they were accepted with no effect and trained at stage 0.
"""

import pytest

from arguments.parser import parse_arguments, parse_config
from base.errors import ConfigError
from tests.zero.test_zero_training import Runs, losses_of

FSDP2 = ["--use-torch-fsdp2", "--untie-embeddings-and-output-weights"]


@pytest.mark.parametrize("argv, stage", [
    (FSDP2, 3),
    (FSDP2 + ["--torch-fsdp2-no-reshard-after-forward"], 2),
    (["--use-megatron-fsdp"], 3),  # Megatron's default strategy is optim_grads_params
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "no_shard"], 0),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim"], 1),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"], 2),
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"], 3),
    # Megatron-FSDP v1 turns the distributed optimizer on itself: beside it, the flag adds nothing
    (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "no_shard", "--use-distributed-optimizer"], 0),
    (["--use-megatron-fsdp", "--zero-stage", "3"], 3),  # the same stage, said twice
])
def test_each_fsdp_flag_is_the_zero_stage_that_shards_the_same_states(argv, stage):
    assert parse_config(argv).zero.stage == stage


def test_a_strategy_without_megatron_fsdp_has_no_effect_and_says_so():
    """Megatron reads --data-parallel-sharding-strategy only under --use-megatron-fsdp (mcore_fsdp_adapter.py)."""
    parsed = parse_arguments(["--data-parallel-sharding-strategy", "optim"])
    assert parsed.config.zero.stage == 0
    assert ("--data-parallel-sharding-strategy: accepted, no effect without --use-megatron-fsdp (Megatron-LM reads it "
            "only there)") in parsed.notes


@pytest.mark.parametrize("argv, message", [
    (["--use-torch-fsdp2"], "--use-torch-fsdp2 with a tied output layer"),
    (FSDP2 + ["--use-distributed-optimizer"], "--use-torch-fsdp2 with MCore's distributed optimizer"),
    (FSDP2 + ["--fp16"], "--use-torch-fsdp2 with fp16"),
    (FSDP2 + ["--pipeline-model-parallel-size", "2"], "--use-torch-fsdp2 with pipeline parallelism"),
    (FSDP2 + ["--zero-stage", "1"], r"--use-torch-fsdp2 \(ZeRO stage 3\) contradicts ZeRO stage 1 from --zero-stage"),
    (["--use-megatron-fsdp", "--zero-config", "stage2"], r"--use-megatron-fsdp \(ZeRO stage 3\) contradicts ZeRO "
                                                         r"stage 2 from .*stage2.json: zero_optimization.stage"),
    (FSDP2 + ["--use-megatron-fsdp"], "two implementations of one thing"),
    # stage 3 is refused with pipeline stages here; the error says where the stage came from
    (["--use-megatron-fsdp", "--pipeline-model-parallel-size", "2"],
     "--zero-stage 3 comes from --use-megatron-fsdp: Megatron-FSDP with --data-parallel-sharding-strategy "
     "optim_grads_params"),
])
def test_what_cannot_be_honoured_is_one_line_never_a_silent_downgrade(argv, message):
    with pytest.raises(ConfigError, match=message) as error:
        parse_config(argv)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_fsdp_runs_report_stage_3_and_hold_the_stage_3_bytes(tmp_path, corpus_cache):
    """On 2 ranks: --use-torch-fsdp2 and --use-megatron-fsdp (optim_grads_params) train as --zero-stage 3 does:
    the --report-memory records say stage 3 and hold the same measured bytes, and the losses are the same."""
    runs = Runs(tmp_path, corpus_cache)
    memory = ["--global-batch-size", "8", "--micro-batch-size", "4", "--untie-embeddings-and-output-weights",
              "--report-memory", "--train-iters", "3"]
    runs.add("zero3", *memory, "--zero-stage", "3")
    runs.add("fsdp2", *memory, "--use-torch-fsdp2")
    runs.add("megatron-fsdp", *memory, "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
             "optim_grads_params")
    results = runs.launch(2)
    records = {name: [r["memory"] for r in metrics if "memory" in r][0] for name, metrics in results.items()}
    for name, per_rank in records.items():
        assert [record["stage"] for record in per_rank] == [3, 3], name
    assert records["fsdp2"] == records["zero3"] and records["megatron-fsdp"] == records["zero3"]
    assert losses_of(results["fsdp2"]) == losses_of(results["zero3"]) == losses_of(results["megatron-fsdp"])
    assert len(losses_of(results["zero3"])) == 3
