"""Each DP rank reads its own slice of every global batch, and a resumed run continues exactly."""

import pytest
import torch

from data.sampler import PretrainingSampler, build_data_loader


def rank_batches(total, consumed, mbs, dp_size, drop_last=True):
    return [list(PretrainingSampler(total, consumed, mbs, rank, dp_size, drop_last)) for rank in range(dp_size)]


@pytest.mark.parametrize("mbs,dp_size", [(1, 1), (2, 3), (4, 2)])
def test_ranks_get_disjoint_slices_that_make_up_each_global_batch(mbs, dp_size):
    total, consumed = 100, 6
    per_rank = rank_batches(total, consumed, mbs, dp_size)
    steps = (total - consumed) // (mbs * dp_size)
    assert all(len(batches) == steps for batches in per_rank)
    for step in range(steps):
        start = consumed + step * mbs * dp_size
        for rank in range(dp_size):
            assert per_rank[rank][step] == list(range(start + rank * mbs, start + (rank + 1) * mbs))
        union = sorted(i for rank in range(dp_size) for i in per_rank[rank][step])
        assert union == list(range(start, start + mbs * dp_size))


def test_resume_continues_a_fresh_run_exactly():
    mbs, dp_size, total = 2, 4, 203
    fresh = rank_batches(total, 0, mbs, dp_size)
    for steps_done in (0, 1, 7, 24):
        resumed = rank_batches(total, steps_done * mbs * dp_size, mbs, dp_size)
        assert resumed == [batches[steps_done:] for batches in fresh]


def test_partial_last_batch_only_without_drop_last():
    assert rank_batches(10, 0, 2, 2) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert rank_batches(11, 0, 2, 2, drop_last=False) == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10]]]
    assert rank_batches(9, 0, 2, 2, drop_last=False) == [[[0, 1], [4, 5], [8]], [[2, 3], [6, 7]]]
    assert [len(PretrainingSampler(9, 0, 2, r, 2, drop_last=False)) for r in range(2)] == [3, 2]
    assert len(PretrainingSampler(10, 0, 2, 0, 2)) == 2


@pytest.mark.parametrize(
    "args,message",
    [
        ((0, 0, 1, 0, 1), "total_samples"),
        ((10, 10, 1, 0, 1), "consumed_samples"),
        ((10, -1, 1, 0, 1), "consumed_samples"),
        ((10, 0, 0, 0, 1), "micro_batch_size"),
        ((10, 0, 1, 0, 0), "data_parallel_size"),
        ((10, 0, 1, 2, 2), "data_parallel_rank"),
    ],
)
def test_invalid_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        PretrainingSampler(*args)


class CountingDataset(torch.utils.data.Dataset):
    """Sample i is the tokens i, i+1, ..., i+4."""

    def __len__(self):
        return 40

    def __getitem__(self, i):
        return {"tokens": torch.arange(i, i + 5)}


def test_data_loader_stacks_this_ranks_samples():
    loader = build_data_loader(CountingDataset(), consumed_samples=8, micro_batch_size=3, dp_rank=1, dp_size=2)
    batches = [batch["tokens"] for batch in loader]
    assert len(batches) == (40 - 8) // 6
    assert batches[0].shape == (3, 5) and batches[0].dtype == torch.int64
    assert batches[0][:, 0].tolist() == [11, 12, 13]
    assert batches[1][:, 0].tolist() == [17, 18, 19]
    torch.testing.assert_close(batches[2][1], torch.arange(24, 29))


def _load_in_a_daemonic_process(results):
    loader = build_data_loader(CountingDataset(), consumed_samples=0, micro_batch_size=4, dp_rank=0, dp_size=1,
                               num_workers=2)
    results.put([batch["tokens"][:, 0].tolist() for batch in loader])


def test_a_daemonic_rank_with_workers_loads_in_process_the_same_batches():
    """Megatron's --num-workers default is 2 (arguments/megatron/defaults.py); a rank started as a daemonic
    process (tests/distributed.py) may not start workers ("daemonic processes are not allowed to have
    children"), so it loads in-process, the same batches."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    results = context.Queue()
    process = context.Process(target=_load_in_a_daemonic_process, args=(results,), daemon=True)
    process.start()
    try:
        got = results.get(timeout=60)
    finally:
        process.join(timeout=10)
    expected = [batch["tokens"][:, 0].tolist() for batch in build_data_loader(
        CountingDataset(), consumed_samples=0, micro_batch_size=4, dp_rank=0, dp_size=1, num_workers=2)]
    assert got == expected == [list(range(start, start + 4)) for start in range(0, 40, 4)]


def test_a_workers_thread_error_is_printed_only_while_its_rank_lives(monkeypatch):
    """A DataLoader worker's thread error (multiprocessing's resource sharer) waits for the SIGKILL of a rank that is
    gone (data/sampler.py unless_the_rank_is_gone): after a rank's last word (base/errors.py exit_at_once) a worker's
    traceback must not follow it (CI saw one, 2026-11-26)."""
    import os

    import data.sampler as sampler

    monkeypatch.setattr(sampler, "ORPHAN_GRACE_S", 0.0)
    printed = []
    sampler.unless_the_rank_is_gone(os.getppid(), lambda *args: printed.append(args), "type", "value", "tb")
    assert printed == [("type", "value", "tb")]  # the rank (the worker's parent) lives: its hook prints
    sampler.unless_the_rank_is_gone(-1, lambda *args: printed.append(args), 1)
    assert len(printed) == 1  # the worker's parent is no longer the rank: silent
