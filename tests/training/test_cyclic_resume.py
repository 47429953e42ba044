"""--dataloader-type cyclic (data/sampler.py CyclicSampler, Megatron-LM's MegatronPretrainingRandomSampler) on two
data-parallel ranks: a run of 2 iterations continued to 4 trains the 4-iteration run's losses bitwise, since the
consumed-samples count gives the epoch and the offset in it and the permutation spans one epoch of the data, whatever
--train-iters asks. Which samples each rank reads is Megatron's order, tests/data/test_cyclic_sampler.py; the same
property for every dataloader type and a DP-size change, tests/data/test_continued_sample_order.py."""

from __future__ import annotations

from tests.forked_runs import logged_iterations
from tests.reliability_helpers import TINY

# --lr-decay-iters: the 2-iteration run's schedule is the 4-iteration run's
CYCLIC = ["--dataloader-type", "cyclic", "--global-batch-size", "4", "--lr-decay-iters", "4", "--train-iters", "4"]


def losses(records: list[dict]) -> dict[int, float]:
    return {record["iteration"]: record["loss"] for record in records}


def test_a_two_rank_cyclic_run_continued_to_more_iterations_trains_the_straight_runs_losses(corpus_cache_300,
                                                                                             tmp_path):
    common = TINY + CYCLIC + ["--data-cache-dir", corpus_cache_300]
    straight = losses(logged_iterations(tmp_path, "straight", common, 2))
    assert sorted(straight) == [1, 2, 3, 4]
    # a 2-iteration run, saved 8 samples into the epoch, then continued to 4 iterations
    logged_iterations(tmp_path, "first", common + ["--save", tmp_path / "ck", "--train-iters", "2"], 2)
    resumed = losses(logged_iterations(tmp_path, "resumed", common + ["--load", tmp_path / "ck"], 2))
    assert resumed == {iteration: straight[iteration] for iteration in (3, 4)}
    # the sampler matters: the dataset's own order trains other losses
    single = losses(logged_iterations(tmp_path, "single", TINY + CYCLIC[2:] + ["--data-cache-dir", corpus_cache_300],
                                      2))
    assert single != straight
