"""tests/host_syncs.py counts what would wait for the device on a GPU, in forward and in an autograd Function's
backward, with the line that asked, in the train step's window it fell in; and nothing that would not (the counter
tests/training/test_host_syncs_per_micro_batch.py relies on)."""

from __future__ import annotations

import collections

import torch

from parallel.pipeline_schedules import Slot
from tests.host_syncs import IN_A_MICRO_BATCH, HostSyncCounter, SyncCountingObserver


class _ReadsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        grad.sum().item()
        grad.tolist()
        return grad * 2


def test_each_kind_of_host_read_is_counted_with_its_line_and_nothing_else():
    counter = HostSyncCounter()
    methods = (torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.to)
    x = torch.randn(8, requires_grad=True)
    with counter.watching():
        counter.active = True
        y = _ReadsInBackward.apply(x)
        y.sum().backward()
        _ = x[x > 0]                                     # boolean indexing: a nonzero
        torch.bincount(torch.tensor([0, 2]), minlength=4)
        torch.repeat_interleave(torch.tensor([1, 2]))   # sums its repeats on the host
        if (x > 5).any():                                # bool(): _local_scalar_dense
            pass
        x.detach().cpu()
        x.detach().to("cpu")
        # none of these wait for the device
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        x.detach()[torch.tensor([0, 3])]
        torch.zeros(4).scatter_add_(0, torch.tensor([0, 2]), torch.ones(2))
        x.detach().to(torch.float64)
        x.detach().to("cpu", non_blocking=True)            # ordered by the stream: the host does not wait
        counter.active = False
        x.sum().item()                                   # not counted: the counter is off
    seen = {(what, site.rsplit(":", 1)[0]) for (_, what, site) in counter.counts}
    here = "tests/test_host_syncs.py"
    assert seen == {("aten._local_scalar_dense.default", here), ("Tensor.tolist", here),
                    ("aten.index.Tensor", here), ("aten.bincount.default", here),
                    ("aten.repeat_interleave.Tensor", here), ("Tensor.cpu", here), ("Tensor.to(cpu)", here)}
    assert sum(counter.counts.values()) == 8  # item in backward, tolist, mask, bincount, repeat, any, cpu, to
    assert (torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.to) == methods  # put back


def test_the_observer_names_a_window_per_micro_batch_and_pipeline_slot():
    """What a train step does inside a micro-batch, or a pipeline slot, is counted in its window; what it does between
    them is `outside`; the windows opened while counting are listed (so a test sees that the step turned them)."""
    counter = HostSyncCounter()
    observer = SyncCountingObserver(counter)
    slot = Slot("B", 1)
    with counter.watching():
        observer.micro_batch_start(5)                     # not counting yet: not listed
        observer.micro_batch_end(5)
        counter.active = True
        observer.micro_batch_start(0)
        torch.ones(()).item()
        observer.micro_batch_end(0)
        observer.slot_start(3, slot)
        torch.ones(()).item()
        torch.ones(()).item()
        observer.slot_end(3, slot)
        torch.ones(()).item()
    assert counter.opened == ["micro_batch 0", "slot 3 B 1"]
    by_window = collections.Counter()
    for (window, _, _), count in counter.counts.items():
        by_window[window] += count
    assert by_window == {"micro_batch 0": 1, "slot 3 B 1": 2, "outside": 1}
    assert sum(counter.in_windows(IN_A_MICRO_BATCH).values()) == 3
