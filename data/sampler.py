"""Which samples each data-parallel rank reads, as Megatron's MegatronPretrainingSampler (and, for --dataloader-type
cyclic, its random sampler): rank r reads its micro-batch slice of each global chunk from ``consumed_samples`` on, so a
resume starts at that count.
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Iterator, Sequence

import torch


class _RankSampler:
    """The dataset's size, the samples consumed, and this rank's place in the DP group."""

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int, data_parallel_rank: int,
                 data_parallel_size: int):
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
        if data_parallel_size <= 0:
            raise ValueError(f"data_parallel_size must be positive, got {data_parallel_size}")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank={data_parallel_rank} must lie in [0, {data_parallel_size})")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.data_parallel_size = data_parallel_size

    @property
    def samples_per_step(self) -> int:
        """Samples all DP ranks read together for one micro-batch each."""
        return self.micro_batch_size * self.data_parallel_size


def _check_total(total_samples: int) -> None:
    if total_samples <= 0:
        raise ValueError(f"total_samples must be positive, got {total_samples}")


class PretrainingSampler(_RankSampler):
    """Yields this rank's micro-batches as lists of sample indices (a DataLoader batch_sampler)."""

    def __init__(
        self,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ):
        _check_total(total_samples)
        if not 0 <= consumed_samples < total_samples:
            raise ValueError(
                f"consumed_samples={consumed_samples} must lie in [0, total_samples={total_samples}); "
                f"the run has already read the whole dataset"
            )
        super().__init__(total_samples, consumed_samples, micro_batch_size, data_parallel_rank, data_parallel_size)
        self.drop_last = drop_last

    def _chunk_starts(self) -> range:
        remaining = self.total_samples - self.consumed_samples
        full_chunks = remaining // self.samples_per_step
        has_partial = remaining % self.samples_per_step and not self.drop_last
        stop = self.consumed_samples + (full_chunks + bool(has_partial)) * self.samples_per_step
        return range(self.consumed_samples, stop, self.samples_per_step)

    def _my_slice(self, chunk_start: int) -> range:
        start = chunk_start + self.data_parallel_rank * self.micro_batch_size
        return range(start, min(start + self.micro_batch_size, self.total_samples))

    def __len__(self) -> int:
        """Micro-batches this rank yields (with drop_last=False, possibly one fewer than rank 0)."""
        return sum(1 for start in self._chunk_starts() if len(self._my_slice(start)))

    def __iter__(self) -> Iterator[list[int]]:
        for chunk_start in self._chunk_starts():
            indices = self._my_slice(chunk_start)
            if len(indices):
                yield list(indices)


SINGLE = "single"
CYCLIC = "cyclic"
DATALOADER_TYPES = (SINGLE, CYCLIC)


class CyclicSampler(_RankSampler):
    """Megatron-LM's MegatronPretrainingRandomSampler (--dataloader-type cyclic), iterated as its loop restarts the
    loader: each epoch a randperm seeded by the epoch number, over rank r's bucket with data_sharding, else over all
    samples with rank r taking every dp-th index."""

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int, data_parallel_rank: int,
                 data_parallel_size: int, data_sharding: bool = True):
        _check_total(total_samples)
        super().__init__(total_samples, consumed_samples, micro_batch_size, data_parallel_rank, data_parallel_size)
        if total_samples < micro_batch_size * data_parallel_size:
            raise ValueError(f"total_samples={total_samples} is less than one micro-batch per data-parallel rank "
                             f"({micro_batch_size} x {data_parallel_size}): an epoch would hold no global batch")
        if consumed_samples < 0 or consumed_samples % (micro_batch_size * data_parallel_size):
            raise ValueError(f"consumed_samples={consumed_samples} must be a non-negative multiple of "
                             f"micro_batch_size x data_parallel_size = {micro_batch_size * data_parallel_size}")
        self.data_sharding = data_sharding

    @property
    def samples_per_epoch(self) -> int:
        """Megatron's active_total_samples."""
        return self.total_samples - self.total_samples % self.samples_per_step

    def __len__(self) -> int:
        """Micro-batches one epoch gives each rank (the iterator itself never ends)."""
        return self.samples_per_epoch // self.samples_per_step

    def epoch_indices(self, consumed_samples: int) -> list[int]:
        """This rank's indices from ``consumed_samples`` to the end of that epoch."""
        epoch, in_epoch = divmod(consumed_samples, self.samples_per_epoch)
        generator = torch.Generator()
        generator.manual_seed(epoch)
        if self.data_sharding:
            bucket_size = (self.total_samples // self.samples_per_step) * self.micro_batch_size
            start = self.data_parallel_rank * bucket_size
            order = torch.randperm(bucket_size, generator=generator).tolist()
            return [start + i for i in order[in_epoch // self.data_parallel_size:]]
        full_bucket_size = (self.total_samples // self.micro_batch_size) * self.micro_batch_size
        order = torch.randperm(full_bucket_size, generator=generator).tolist()
        return order[in_epoch:][self.data_parallel_rank::self.data_parallel_size]

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            indices = self.epoch_indices(self.consumed_samples)
            for start in range(0, len(indices) - self.micro_batch_size + 1, self.micro_batch_size):
                self.consumed_samples += self.samples_per_step
                yield indices[start:start + self.micro_batch_size]


def collate_tokens(samples: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack the samples' token tensors into one [micro_batch, seq_length + 1] batch."""
    return {"tokens": torch.stack([sample["tokens"] for sample in samples])}


def build_data_loader(
    dataset: torch.utils.data.Dataset,
    consumed_samples: int,
    micro_batch_size: int,
    dp_rank: int,
    dp_size: int,
    num_workers: int = 0,
    dataloader_type: str = SINGLE,
    data_sharding: bool = True,
) -> torch.utils.data.DataLoader:
    """A DataLoader over this DP rank's micro-batches after ``consumed_samples``: one pass (``single``) or Megatron-LM's
    random order, epoch after epoch (``cyclic``). A daemonic process loads in-process, reading the same samples."""
    if multiprocessing.current_process().daemon:
        num_workers = 0
    if dataloader_type == CYCLIC:
        sampler = CyclicSampler(len(dataset), consumed_samples, micro_batch_size, dp_rank, dp_size, data_sharding)
    elif dataloader_type == SINGLE:
        sampler = PretrainingSampler(len(dataset), consumed_samples, micro_batch_size, dp_rank, dp_size)
    else:
        raise ValueError(f"dataloader_type must be one of {DATALOADER_TYPES}, got {dataloader_type!r}")
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_tokens,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
        # A generator of its own for the workers' seeds leaves the global stream (dropout's) untouched.
        generator=torch.Generator().manual_seed(0),
        worker_init_fn=functools.partial(die_with_the_rank, os.getpid()),
    )


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_the_rank(rank_pid: int, worker_id: int) -> None:
    """A worker lives and dies with its rank: the kernel kills it with the rank (so the rank's sockets close), and it
    leaves the rank's process group so signals meant for the rank are the rank's to handle."""
    # A SIGTERM or Ctrl-C to the group is the rank's to handle (it saves and exits, its workers with it).
    os.setpgrp()
    sys.excepthook = functools.partial(unless_the_rank_is_gone, rank_pid, sys.excepthook)
    threading.excepthook = functools.partial(unless_the_rank_is_gone, rank_pid, threading.excepthook)
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != rank_pid:  # the rank died before the line above
        os.kill(os.getpid(), signal.SIGKILL)


ORPHAN_GRACE_S = 1.0  # How long a worker's thread error waits for the kernel's SIGKILL of a gone rank.


def unless_the_rank_is_gone(rank_pid: int, hook, *args) -> None:
    """A worker's thread error, printed by `hook` only while the rank lives (else it would follow the rank's last line).
    """
    time.sleep(ORPHAN_GRACE_S)
    if os.getppid() == rank_pid:
        hook(*args)
