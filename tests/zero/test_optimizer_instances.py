"""Megatron-LM's --num-distributed-optimizer-instances: the optimizer state sharded within N equal blocks of the
data-parallel ranks and replicated across them (megatron/core/parallel_state.py: the "intra-partial" DP groups
are contiguous blocks of the DP ranks; megatron/core/distributed/param_and_grad_buffer.py, start_grad_sync: the
reduce-scatter within the block, then an all-reduce of the shard across the instances).

On 4 ranks with 2 instances each rank holds half of the optimizer state (1/2 instead of 1/4), the losses and
gradient norms equal the one-instance run's (fp32; not bitwise: the sum over 4 ranks is a reduce-scatter over 2
then an all-reduce over 2, another order of additions, hence 1e-6 relative), and a checkpoint saved with 2
instances resumes with 1.
"""

import json

import pytest

import pretrain_gpt
from arguments.parser import parse_config
from parallel.state import destroy, initialize, with_optimizer_instances
from tests.distributed import run_distributed
from tests.zero.test_zero_training import COMMON, losses_of, records
from zero.memory import within_tolerance

ITERS = 4


def train_with_instances(rank, world_size, runs):
    """One process group; each run with the optimizer-instance groups its flag asks for."""
    state = initialize("cpu", 1)
    try:
        for argv in runs:
            config = parse_config(argv)
            pretrain_gpt.run(config, with_optimizer_instances(state, config.zero.distributed_optimizer_instances))
    finally:
        destroy(state)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, corpus_cache):
    tmp_path = tmp_path_factory.mktemp("instances")
    argvs, files = [], {}
    for stage in (1, 2, 3):
        for instances in (1, 2):
            name = f"stage{stage}-instances{instances}"
            files[name] = tmp_path / f"{name}.jsonl"
            argvs.append(COMMON + ["--data-cache-dir", corpus_cache, "--metrics-file", str(files[name]),
                                   "--train-iters", str(ITERS), "--global-batch-size", "8", "--micro-batch-size", "2",
                                   "--zero-stage", str(stage), "--num-distributed-optimizer-instances", str(instances),
                                   "--report-memory", "--save", str(tmp_path / f"{name}-ckpt"),
                                   "--save-interval", str(ITERS // 2)])
    run_distributed(train_with_instances, 4, argvs, timeout=600)
    return {name: records(path) for name, path in files.items()}, tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_two_instances_train_as_one_and_hold_half_the_optimizer_state(runs, stage):
    metrics, _ = runs
    one, two = metrics[f"stage{stage}-instances1"], metrics[f"stage{stage}-instances2"]
    assert len(losses_of(one)) == ITERS
    assert losses_of(two) == pytest.approx(losses_of(one), rel=1e-6)
    norms = [[r["grad_norm"] for r in m if "grad_norm" in r] for m in (one, two)]
    assert norms[1] == pytest.approx(norms[0], rel=1e-6)
    memory = [[r["memory"] for r in m if "memory" in r][0] for m in (one, two)]
    for record_one, record_two in zip(*memory):  # every rank
        assert (record_one["partition_size"], record_two["partition_size"]) == (4, 2)
        for category in ("master_weights", "optimizer_states"):
            held_one, held_two = record_one[f"measured_{category}_bytes"], record_two[f"measured_{category}_bytes"]
            assert within_tolerance(held_two, record_two[f"predicted_{category}_bytes"], 0, rel=0.01)  # predicted
            assert abs(held_two - 2 * held_one) <= 2 * 4 * 64 * 3, category  # twice, but for the padding


@pytest.mark.slow
def test_a_checkpoint_saved_with_two_instances_resumes_with_one(runs, tmp_path, corpus_cache):
    """Each partition is written once (by the first instance), under its partition rank; loading cuts it by
    parameter name for any layout."""
    metrics, root = runs
    checkpoint = root / "stage2-instances2-ckpt"
    saved = json.loads((checkpoint / "iter_0000002" / "metadata.json").read_text())
    assert sorted(dp for _, dp, _ in saved["optimizer_shards"]) == [0, 1]
    resumed = tmp_path / "resumed.jsonl"
    argv = COMMON + ["--data-cache-dir", corpus_cache, "--metrics-file", str(resumed), "--train-iters", str(ITERS),
                     "--global-batch-size", "8", "--micro-batch-size", "2", "--zero-stage", "2",
                     "--load", str(checkpoint / "iter_0000002")]
    run_distributed(train_with_instances, 4, [argv], timeout=600)
    assert losses_of(records(resumed)) == pytest.approx(losses_of(metrics["stage2-instances2"])[2:], rel=1e-6)


def test_the_planner_plans_each_instances_share():
    """The dry run builds the same ZeRO on a virtual grid with the instance groups: on 8 ranks, 2 instances hold
    twice the master weights and Adam moments of 1 (a partition over 4 ranks, not 8)."""
    from planner.dry_run import Cluster, dry_run

    plans = {}
    for instances in (1, 2):
        config = parse_config(["--zero-stage", "2", "--num-distributed-optimizer-instances", str(instances),
                               "--global-batch-size", "128"])
        plans[instances] = dry_run(config, Cluster(8, 8, None, "cpu"), vocab_size=512)
    for category in ("master_weights", "optimizer_states"):
        one, two = plans[1].model_state_bytes[category], plans[2].model_state_bytes[category]
        assert abs(two - 2 * one) <= 2 * 4 * 256 * 3, category
