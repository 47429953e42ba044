"""--num-distributed-optimizer-instances beside --expert-model-parallel-size: the experts' optimizer is cut into
the same number of instances over the expert data-parallel group, as Megatron-LM does
(megatron/core/parallel_state.py initialize_model_parallel: "Expert data parallel size should be divisible by
partial DistOpt shard factor", then create_hierarchical_groups over each expert DP group with
[EDP / N, N]: _INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP and _INTER_PARTIAL_EXPERT_DATA_PARALLEL_GROUP; the
gradient is reduce-scattered inside an instance and the shard all-reduced across them,
param_and_grad_buffer.py start_grad_sync). Megatron-LM's functional test
moe/gpt3_mcore_te_tp2_pp1_resume_torch_dist_te_8experts2parallel_multi_dist_optimizer_instances runs it.

On 4 ranks at EP 2 (DP 4, expert DP 2) two instances train as one: the same losses, gradient norms and router
losses to 1e-6 relative (the sums come in another order: a reduce-scatter over half the ranks, then an
all-reduce across the halves)."""

from __future__ import annotations

import pytest

from parallel.state import virtual_state
from tests.training.test_expert_parallel_training import assert_equal_runs, run_variants

EP2 = ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]


def test_the_experts_get_their_own_instances_over_the_expert_data_parallel_group():
    """DP 4, EP 2: the dense partition over 2 of the 4 DP ranks, the experts' over 1 of the 2 expert DP ranks."""
    state = virtual_state(4, optimizer_instances=2, expert_model_parallel_size=2)
    assert (state.partition_size, state.optimizer_instances.count) == (2, 2)
    instances = state.experts.optimizer_instances
    assert (instances.count, instances.shard_size) == (2, 1)
    assert instances.replica_group is not None and instances.replica_group.size() == 2
    from zero.experts import expert_data_parallel_state
    view = expert_data_parallel_state(state)
    assert (view.partition_size, view.partition_replica_index) == (1, state.experts.data_rank)


def test_instances_that_do_not_divide_the_expert_data_parallel_size_are_refused():
    """DP 2, EP 2 leaves one expert DP rank: Megatron-LM asserts the instances divide it."""
    with pytest.raises(ValueError, match="must divide the expert data-parallel size 1"):
        virtual_state(2, optimizer_instances=2, expert_model_parallel_size=2)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["1", "3"])
def test_two_optimizer_instances_with_expert_parallel_2_train_as_one(corpus_cache_300, tmp_path, stage):
    common = ["--global-batch-size", "8", "--micro-batch-size", "2", "--zero-stage", stage] + EP2
    runs = run_variants(corpus_cache_300, tmp_path, 4, common, {
        "one": [], "two": ["--num-distributed-optimizer-instances", "2"]})
    assert_equal_runs(runs, reference="one")


@pytest.mark.slow
def test_a_checkpoint_saved_with_two_instances_and_experts_resumes_with_one(corpus_cache_300, tmp_path):
    """Each dense and expert partition is written once, by the first instance (its ranks are the first half of
    the ranks on both grids, Megatron's folding), and loads by name with one instance: the resumed losses are
    the saved run's."""
    common = ["--global-batch-size", "8", "--micro-batch-size", "2", "--zero-stage", "2"] + EP2
    saved = run_variants(corpus_cache_300, tmp_path, 4, common, {
        "two": ["--num-distributed-optimizer-instances", "2", "--save", str(tmp_path / "ckpt"),
                "--save-interval", "2"]})["two"]
    resumed = run_variants(corpus_cache_300, tmp_path, 4, common, {
        "resumed": ["--load", str(tmp_path / "ckpt" / "iter_0000002")]})["resumed"]
    flat = [value for record in saved[2:] for value in record]
    assert [value for record in resumed for value in record] == pytest.approx(flat, rel=1e-6, abs=0)
