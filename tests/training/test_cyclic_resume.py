"""--dataloader-type cyclic (data/sampler.py CyclicSampler, Megatron-LM's MegatronPretrainingRandomSampler) on two
data-parallel ranks: a run saved and resumed mid-epoch trains the uninterrupted run's losses bitwise, since the
consumed-samples count gives the epoch and the offset in it. Which samples each rank reads is Megatron's order,
tests/data/test_cyclic_sampler.py."""

from __future__ import annotations

from tests.forked_runs import logged_iterations
from tests.reliability_helpers import TINY

CYCLIC = ["--dataloader-type", "cyclic", "--global-batch-size", "4", "--train-iters", "4"]


def losses(records: list[dict]) -> dict[int, float]:
    return {record["iteration"]: record["loss"] for record in records}


def test_a_two_rank_cyclic_run_resumed_mid_epoch_trains_the_straight_runs_losses(corpus_cache_300, tmp_path):
    common = TINY + CYCLIC + ["--data-cache-dir", corpus_cache_300]
    straight = losses(logged_iterations(tmp_path, "straight", common, 2))
    assert sorted(straight) == [1, 2, 3, 4]
    # the train split holds the run's 16 samples, one epoch: iteration 2's save is 8 samples into it
    logged_iterations(tmp_path, "first", common + ["--save", tmp_path / "ck", "--exit-interval", "2"], 2)
    resumed = losses(logged_iterations(tmp_path, "resumed", common + ["--load", tmp_path / "ck"], 2))
    assert resumed == {iteration: straight[iteration] for iteration in (3, 4)}
    # the sampler matters: the dataset's own order trains other losses
    single = losses(logged_iterations(tmp_path, "single", TINY + CYCLIC[2:] + ["--data-cache-dir", corpus_cache_300],
                                      2))
    assert single != straight
