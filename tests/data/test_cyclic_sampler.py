"""--dataloader-type cyclic reads Megatron-LM's MegatronPretrainingRandomSampler's order (data/sampler.py CyclicSampler).

Megatron-LM core_v0.16.1, megatron/training/datasets/data_samplers.py:251-330 (the sampler) and
megatron/training/training.py:3284 (cyclic_iter: the loader iterated again each time it ends, the sampler going on
from the samples it has consumed). The hard-coded cases below were computed once with that class (its source
executed, as `megatron_random_sampler` does) and hold without it; with MEGATRON_LM_KIT naming Megatron-LM's tree
or its megatron-lm-core_v0.16.1-min.tar.xz, the class itself is compared on more cases.
"""

from __future__ import annotations

import ast
import itertools
import os
import random
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from data.sampler import CyclicSampler, build_data_loader

SAMPLERS_PY = "megatron/training/datasets/data_samplers.py"

# (total, consumed, micro batch, DP rank, DP size, data_sharding) -> the first micro-batches Megatron's sampler
# yields under cyclic_iter (data_samplers.py:293-330 per epoch, training.py:3284 across epochs)
MEGATRON_CASES = {
    (10, 0, 2, 0, 2, True): [[0, 1], [3, 2]],
    (10, 0, 2, 1, 2, True): [[4, 5], [7, 6], [5, 7], [6, 4], [4, 5], [7, 6], [6, 7]],
    (10, 4, 2, 1, 2, True): [[7, 6]],
    (11, 0, 1, 2, 3, False): [[4], [8], [9]],
    (10, 12, 2, 0, 2, False): [[0, 9]],
    (13, 8, 2, 1, 2, False): [[1, 6]],
    (9, 0, 1, 0, 3, False): [[8], [3], [4], [4], [5], [8], [0]],
    (9, 6, 1, 2, 3, True): [[7], [7], [8], [6], [6], [8], [7]],
}


def ours(case: tuple, count: int) -> list[list[int]]:
    return list(itertools.islice(iter(CyclicSampler(*case)), count))


@pytest.mark.parametrize("case", list(MEGATRON_CASES), ids=str)
def test_the_order_is_megatrons_recorded_one(case):
    assert ours(case, len(MEGATRON_CASES[case])) == MEGATRON_CASES[case]


def megatron_random_sampler():
    """Megatron-LM's MegatronPretrainingRandomSampler, its source executed from MEGATRON_LM_KIT (the class reads
    only torch; its module's imports need Megatron-LM's training package)."""
    kit = os.environ.get("MEGATRON_LM_KIT")
    if not kit:
        pytest.skip("MEGATRON_LM_KIT names no Megatron-LM tree (megatron-lm-core_v0.16.1-min.tar.xz); "
                    "megatron-core is a benchmark-only peer (requirements-bench.txt)")
    if Path(kit).is_dir():
        source = (Path(kit) / SAMPLERS_PY).read_text()
    else:
        with tarfile.open(kit) as archive:
            member = next(name for name in archive.getnames() if name.endswith(SAMPLERS_PY))
            source = archive.extractfile(member).read().decode()
    tree = ast.parse(source)
    module = ast.Module(body=[node for node in tree.body if isinstance(node, ast.ClassDef)
                              and node.name in ("RandomSeedDataset", "MegatronPretrainingRandomSampler")],
                        type_ignores=[])
    namespace = {"torch": torch, "random": random, "np": np, "Dataset": torch.utils.data.Dataset}
    exec(compile(module, SAMPLERS_PY, "exec"), namespace)
    return namespace["MegatronPretrainingRandomSampler"]


def megatron_cyclic(sampler_class, case: tuple, count: int) -> list[list[int]]:
    sampler = sampler_class(None, case[0], *case[1:])

    def cyclic_iter():  # training.py:3284
        while True:
            yield from sampler
    return list(itertools.islice(cyclic_iter(), count))


def test_the_recorded_cases_are_megatrons():
    sampler_class = megatron_random_sampler()
    for case, expected in MEGATRON_CASES.items():
        assert megatron_cyclic(sampler_class, case, len(expected)) == expected, case


@pytest.mark.parametrize("data_sharding", [True, False])
def test_the_order_is_megatrons_over_epochs_ranks_and_resumes(data_sharding):
    sampler_class = megatron_random_sampler()
    for total, mbs, dp in ((40, 2, 2), (37, 3, 2), (50, 1, 4), (23, 4, 1), (64, 2, 8)):
        step, epoch = mbs * dp, (total - total % (mbs * dp))
        for consumed in sorted({0, step, 2 * step, epoch - step, epoch, epoch + 3 * step}):
            for rank in range(dp):
                case = (total, consumed, mbs, rank, dp, data_sharding)
                count = 3 * epoch // step
                assert ours(case, count) == megatron_cyclic(sampler_class, case, count), case


@pytest.mark.parametrize("data_sharding", [True, False])
def test_a_resume_continues_the_order_and_the_ranks_make_up_each_global_batch(data_sharding):
    """What a run resumed from consumed samples reads is the rest of the straight run's order, and each step's
    global batch is the DP ranks' micro-batches together: from each rank's bucket (data sharding) or the next
    mbs x dp indices of one permutation of the epoch (without)."""
    total, mbs, dp = 30, 2, 3
    straight = [ours((total, 0, mbs, rank, dp, data_sharding), 20) for rank in range(dp)]
    for steps in (1, 4, 5, 7, 12):
        assert [ours((total, steps * mbs * dp, mbs, rank, dp, data_sharding), 20 - steps) for rank in range(dp)] == \
            [batches[steps:] for batches in straight]
    steps_per_epoch = total // (mbs * dp)
    for epoch in range(2):
        order = torch.randperm(total, generator=torch.Generator().manual_seed(epoch)).tolist()
        for step in range(steps_per_epoch):
            for rank in range(dp):
                got = straight[rank][epoch * steps_per_epoch + step]
                if data_sharding:
                    bucket = total // (mbs * dp) * mbs
                    local = torch.randperm(bucket, generator=torch.Generator().manual_seed(epoch)).tolist()
                    assert got == [rank * bucket + i for i in local[step * mbs:(step + 1) * mbs]]
                else:
                    assert got == order[step * mbs * dp:(step + 1) * mbs * dp][rank::dp]


class CountingDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {"tokens": torch.tensor([i, i + 1])}


def test_the_cyclic_loader_goes_on_epoch_after_epoch():
    loader = build_data_loader(CountingDataset(), consumed_samples=0, micro_batch_size=2, dp_rank=1, dp_size=2,
                               dataloader_type="cyclic")
    assert len(loader) == 3
    got = [batch["tokens"][:, 0].tolist() for batch in itertools.islice(iter(loader), 9)]
    assert got == ours((12, 0, 2, 1, 2, True), 9)
    assert sorted(i for batch in got[:3] for i in batch) == list(range(6, 12))  # rank 1's bucket, each once
    with pytest.raises(ValueError, match="consumed_samples=2 must be a non-negative multiple"):
        CyclicSampler(12, 2, 2, 0, 2)
    with pytest.raises(ValueError, match="dataloader_type"):
        build_data_loader(CountingDataset(), 0, 2, 0, 1, dataloader_type="external")
