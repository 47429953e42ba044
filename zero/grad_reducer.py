"""Gradient reduction over the DP group: post-accumulate-grad hooks, buckets, and asynchronous all-reduce or
reduce-scatter overlapping backward. FullGradients (stages 0-1) keeps a full flat gradient and reduces at the last
micro-batch; PartitionedGradients (stages 2-3) copies each gradient into a bucket and reduces it every micro-batch.
Under offload each reduced shard goes straight to a host partition."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Protocol

import torch
from torch import nn

from zero.flat_buffer import BufferPool, FlatLayout, Unit


class ReductionListener(Protocol):
    def unit_reduced(self, unit: Unit) -> None: ...

    def grad_sync_finished(self) -> None: ...


@dataclass
class _PendingReduction:
    work: object
    finish: Optional[Callable[[], None]]  # moves the reduced shard where it belongs
    release: Callable[[], None]           # returns scratch buffers to their pools


class _ThenAllReduce:
    """A reduction's handle that, waited on, also all-reduces its shard across the optimizer instances (in issue
    order)."""

    def __init__(self, first, comm, shard: torch.Tensor, replica_group) -> None:
        self.first, self.comm, self.shard, self.replica_group = first, comm, shard, replica_group

    def wait(self) -> None:
        self.first.wait()
        self.comm.all_reduce(self.shard, self.replica_group, "dp")


class GradientReducer(ABC):
    """What both storages share: hooks, per-unit gradient counts, in-flight reductions, listeners."""

    def __init__(self, layout: FlatLayout, grad_dtype: torch.dtype, comm, group, data_parallel_size: int,
                 scatter: bool, overlap: bool, device: torch.device, replica_group=None) -> None:
        self.layout = layout
        self.grad_dtype = grad_dtype
        # `replica_group` joins the optimizer instances' copies of the partition
        self.comm, self.group, self.dp_size = comm, group, data_parallel_size
        self.replica_group = replica_group
        self.scatter = scatter
        self.overlap = overlap
        self.device = device
        self._staging = BufferPool(max(unit.shard_numel for unit in layout.units), grad_dtype, device)
        self._pending: list[_PendingReduction] = []
        self._ready = [0] * len(layout.units)
        self._syncing = True
        # Whether the backward in progress reduces, fixed by no_sync() or its first gradient.
        self._backward_syncs: Optional[bool] = None
        self._listeners: list[ReductionListener] = []
        self._hooks = []
        self.host_partition: Optional[torch.Tensor] = None  # set by the subclasses under offload

    def host_tensors(self) -> list[torch.Tensor]:
        """The gradient tensors in host memory, for zero/memory.py."""
        return [] if self.host_partition is None else [self.host_partition]

    def attach(self) -> None:
        """Hook every parameter of the layout (once they are in their final place)."""
        self._hooks = [slot.param.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for unit in self.layout.units for slot in unit.slots]

    def subscribe(self, listener: ReductionListener) -> None:
        self._listeners.append(listener)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate locally where the storage allows. Entering marks the coming backward as not
        reducing even if it brings this reducer no gradient."""
        if self._backward_syncs is None:
            self._backward_syncs = False
        self._syncing = False
        try:
            yield
        finally:
            self._syncing = True


    def _on_grad_ready(self, param: nn.Parameter) -> None:
        if self._backward_syncs is None:
            self._backward_syncs = self._syncing
        unit = self.layout.unit_of[id(param)]
        if not self._take_gradient(unit, self.layout.slot_of[id(param)], param):
            return
        self._ready[unit.index] += 1
        if self._ready[unit.index] == len(unit.slots):
            self._reduce(unit)

    @abstractmethod
    def _take_gradient(self, unit: Unit, slot, param: nn.Parameter) -> bool:
        """Store the gradient autograd produced; True when it counts toward reducing the unit (fused ones count too)."""

    @abstractmethod
    def main_grad(self, param: nn.Parameter) -> torch.Tensor:
        """Where gradient accumulation fusion adds `param`'s gradient."""

    def holds(self, param: nn.Parameter) -> bool:
        return id(param) in self.layout.slot_of

    def gradient_reducers(self) -> tuple["GradientReducer", ...]:
        """The reducers the loop drives through this one (BothReducers has two)."""
        return (self,)

    def _reduce(self, unit: Unit) -> None:
        self._ready[unit.index] = -1  # issued; a late hook cannot issue it again
        self._pending.append(self._issue_reduction(unit))
        if not self.overlap:
            self._complete_all()
        for listener in self._listeners:
            listener.unit_reduced(unit)

    @abstractmethod
    def _issue_reduction(self, unit: Unit) -> _PendingReduction:
        """Start averaging `unit`'s gradient over the DP group."""

    def _averaged_collective(self, unit: Unit, bucket: torch.Tensor, released: list, in_place: bool = False
                             ) -> tuple[object, torch.Tensor]:
        """Start averaging `bucket` over DP; returns the work and where this rank's shard will be. `in_place`: into its
        own chunk, as Megatron-Core's distributed optimizer, with no staging buffer."""
        if self.dp_size > 1:
            bucket.div_(self.dp_size)  # average before summing: keeps 16-bit sums in range
        if self.scatter and in_place:
            lo, hi = unit.shard_bounds(self.layout.part)
            shard = bucket[lo:hi]
            work = self.comm.reduce_scatter(shard, bucket, self.group, "dp", async_op=True)
        elif self.scatter:
            staging = self._staging_buffer()
            released.append((self._staging, staging))
            shard = staging[:unit.shard_numel]
            work = self.comm.reduce_scatter(shard, bucket, self.group, "dp", async_op=True)
        else:
            lo, hi = unit.shard_bounds(self.layout.part)
            shard = bucket[lo:hi]
            work = self.comm.all_reduce(bucket, self.group, "dp", async_op=True)
        if self.replica_group is not None:
            # optimizer instances: reduce-scatter inside, then all-reduce across
            work = _ThenAllReduce(work, self.comm, shard, self.replica_group)
        return work, shard

    def _staging_buffer(self) -> torch.Tensor:
        while not self._staging.has_free and self._pending:
            self._complete(self._pending.pop(0))
        return self._staging.acquire()

    @staticmethod
    def _to_host(shard: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """`shard` copied synchronously to `target`'s device."""
        return shard if shard.device == target.device else shard.to(target.device)

    @staticmethod
    def _release_all(buffers: list) -> Callable[[], None]:
        def release(buffers=tuple(buffers)) -> None:
            for pool, buffer in buffers:
                pool.release(buffer)
        return release

    @staticmethod
    def _complete(pending: _PendingReduction) -> None:
        pending.work.wait()
        if pending.finish is not None:
            pending.finish()
        pending.release()

    def _complete_all(self) -> None:
        while self._pending:
            self._complete(self._pending.pop(0))


    def finish_grad_sync(self) -> None:
        """After each micro-batch's backward: reduce units left over (in unit order), wait for all, tell the
        listeners."""
        if self._must_reduce_now():
            for unit in self.layout.units:
                if self._ready[unit.index] != -1 and self._has_gradient(unit):
                    self._reduce(unit)
        self._complete_all()
        self._ready = [0] * len(self.layout.units)
        self._backward_syncs = None
        for listener in self._listeners:
            listener.grad_sync_finished()

    def _must_reduce_now(self) -> bool:
        return self._syncing if self._backward_syncs is None else self._backward_syncs

    def _has_gradient(self, unit: Unit) -> bool:
        return True

    @abstractmethod
    def partition_gradients(self) -> torch.Tensor:
        """This rank's averaged fp32 gradient partition, which the step unscales and clips in place."""

    @abstractmethod
    def reduced_shard(self, unit: Unit) -> torch.Tensor:
        """This rank's shard of `unit`'s averaged gradient (a view)."""

    @abstractmethod
    def partition_working_bytes(self) -> int:
        """Bytes `partition_gradients` allocates."""

    @abstractmethod
    def zero_grad(self) -> None:
        """Start a new accumulation."""

    @abstractmethod
    def gradient_tensors(self) -> list[torch.Tensor]:
        """The live tensors that hold gradients (for zero/memory.py)."""

    def buffer_tensors(self) -> list[torch.Tensor]:
        """Constant-size scratch buffers (C_B)."""
        return list(self._staging.buffers)


class FullGradients(GradientReducer):
    """Stages 0-1: the whole gradient in one flat buffer."""

    def __init__(self, layout: FlatLayout, param_dtype: torch.dtype, grad_dtype: torch.dtype, comm, group,
                 data_parallel_size: int, scatter: bool, overlap: bool, device: torch.device,
                 host_partition: Optional[torch.Tensor] = None, replica_group=None) -> None:
        super().__init__(layout, grad_dtype, comm, group, data_parallel_size, scatter, overlap, device, replica_group)
        self.buffer = torch.zeros(layout.numel, dtype=grad_dtype, device=device)
        self.host_partition = host_partition
        # same dtype: autograd accumulates into views of the buffer
        self.grads_are_views = grad_dtype == param_dtype

    def zero_grad(self) -> None:
        self.buffer.zero_()
        if self.host_partition is not None:
            self.host_partition.zero_()
        for unit in self.layout.units:
            for slot in unit.slots:
                slot.param.grad = self._main_grad(unit, slot) if self.grads_are_views else None

    def _main_grad(self, unit: Unit, slot) -> torch.Tensor:
        return unit.in_buffer(self.buffer)[slot.start:slot.end].view(slot.shape)

    def _take_gradient(self, unit: Unit, slot, param: nn.Parameter) -> bool:
        if not self.grads_are_views and param.grad is not None:  # None: fused into the main gradient
            self._main_grad(unit, slot).add_(param.grad)
            param.grad = None
        return self._backward_syncs  # under no_sync the gradient just accumulates here

    def main_grad(self, param: nn.Parameter) -> torch.Tensor:
        return self._main_grad(self.layout.unit_of[id(param)], self.layout.slot_of[id(param)])

    def _issue_reduction(self, unit: Unit) -> _PendingReduction:
        bucket = unit.in_buffer(self.buffer)
        released: list = []
        work, shard = self._averaged_collective(unit, bucket, released, in_place=True)
        if self.host_partition is not None:
            target = unit.in_partition(self.host_partition)
            return _PendingReduction(work, lambda: target.copy_(self._to_host(shard, target)),
                                     self._release_all(released))
        lo, hi = unit.shard_bounds(self.layout.part)
        owned = bucket[lo:hi]
        finish = (lambda: owned.copy_(shard)) if owned.data_ptr() != shard.data_ptr() else None
        return _PendingReduction(work, finish, self._release_all(released))

    def reduced_shard(self, unit: Unit) -> torch.Tensor:
        if self.host_partition is not None:  # offloaded, the step reads the host copy
            return unit.in_partition(self.host_partition)
        lo, hi = unit.shard_bounds(self.layout.part)
        return unit.in_buffer(self.buffer)[lo:hi]

    def partition_working_bytes(self) -> int:
        if self.host_partition is not None:
            return 0
        # the step needs this rank's scattered shards in one partition
        return self.layout.partition_numel * 4

    def partition_gradients(self) -> torch.Tensor:
        if self.host_partition is not None:
            return self.host_partition
        grads = torch.empty(self.layout.partition_numel, dtype=torch.float32, device=self.device)
        for unit in self.layout.units:
            lo, hi = unit.shard_bounds(self.layout.part)
            unit.in_partition(grads).copy_(unit.in_buffer(self.buffer)[lo:hi])
        return grads

    def gradient_tensors(self) -> list[torch.Tensor]:
        slots = [slot for unit in self.layout.units for slot in unit.slots]
        return [slot.param.grad for slot in slots if slot.param.grad is not None] + [self.buffer] \
            + self.host_tensors()


class PartitionedGradients(GradientReducer):
    """Stages 2-3: only this rank's gradient partition, plus constant-size buckets."""

    def __init__(self, layout: FlatLayout, grad_dtype: torch.dtype, comm, group, data_parallel_size: int,
                 scatter: bool, overlap: bool, device: torch.device,
                 host_partition: Optional[torch.Tensor] = None, host_fp32: Optional[torch.Tensor] = None,
                 replica_group=None) -> None:
        super().__init__(layout, grad_dtype, comm, group, data_parallel_size, scatter, overlap, device, replica_group)
        # Offloaded, shards accumulate on the host; `host_fp32` is a 16-bit run's fp32 copy.
        self.host_partition = host_partition
        self._host_fp32 = host_fp32 if host_fp32 is not host_partition else None
        self.partition = host_partition if host_partition is not None else \
            torch.zeros(layout.partition_numel, dtype=grad_dtype, device=device)
        self._buckets = BufferPool(max(unit.numel for unit in layout.units), grad_dtype, device)
        self._filling: dict[int, torch.Tensor] = {}  # unit index -> its bucket while gradients arrive

    def zero_grad(self) -> None:
        self.partition.zero_()
        for unit in self.layout.units:
            for slot in unit.slots:
                slot.param.grad = None

    def _take_gradient(self, unit: Unit, slot, param: nn.Parameter) -> bool:
        # added: accumulation fusion may have written the slot already
        bucket = self._bucket_for(unit)
        if param.grad is not None:
            bucket[slot.start:slot.end].add_(param.grad.reshape(-1))
            param.grad = None
        return True

    def main_grad(self, param: nn.Parameter) -> torch.Tensor:
        unit, slot = self.layout.unit_of[id(param)], self.layout.slot_of[id(param)]
        return self._bucket_for(unit)[slot.start:slot.end].view(slot.shape)

    def _bucket_for(self, unit: Unit) -> torch.Tensor:
        buffer = self._filling.get(unit.index)
        if buffer is None:
            while not self._buckets.has_free and self._pending:
                self._complete(self._pending.pop(0))
            buffer = self._buckets.acquire()
            buffer[:unit.numel].zero_()  # padding, and parameters without a gradient this micro-batch
            self._filling[unit.index] = buffer
        return buffer[:unit.numel]

    def _issue_reduction(self, unit: Unit) -> _PendingReduction:
        bucket_buffer = self._filling.pop(unit.index)
        released: list = [(self._buckets, bucket_buffer)]
        work, shard = self._averaged_collective(unit, bucket_buffer[:unit.numel], released)
        target = unit.in_partition(self.partition)
        return _PendingReduction(work, lambda: target.add_(self._to_host(shard, target)),
                                 self._release_all(released))

    def _must_reduce_now(self) -> bool:
        return True

    def _has_gradient(self, unit: Unit) -> bool:
        return unit.index in self._filling

    def reduced_shard(self, unit: Unit) -> torch.Tensor:
        return unit.in_partition(self.partition)

    def partition_gradients(self) -> torch.Tensor:
        # An fp32 partition is handed over itself (a copy cost +1x at the step's peak).
        if self.partition.dtype == torch.float32:
            return self.partition
        if self._host_fp32 is not None:
            return self._host_fp32.copy_(self.partition)
        return self.partition.to(torch.float32)

    def partition_working_bytes(self) -> int:
        held = self.partition.dtype == torch.float32 or self._host_fp32 is not None
        return 0 if held else self.layout.partition_numel * 4

    def host_tensors(self) -> list[torch.Tensor]:
        return super().host_tensors() + ([] if self._host_fp32 is None else [self._host_fp32])

    def gradient_tensors(self) -> list[torch.Tensor]:
        slots = [slot for unit in self.layout.units for slot in unit.slots]
        return [slot.param.grad for slot in slots if slot.param.grad is not None] + [self.partition] \
            + ([] if self._host_fp32 is None else [self._host_fp32])

    def buffer_tensors(self) -> list[torch.Tensor]:
        return list(self._buckets.buffers) + super().buffer_tensors()
