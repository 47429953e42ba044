"""ZeRO stage 3 (P_os+g+p): parameters live as 1/N shards, gathered one chunk per transformer block (plus a root chunk)
only while in use, driven by module and gradient hooks. Each parameter is a permanent view into its chunk, whose storage
is resized to zero when freed, so saved tensors see the re-gathered values in backward."""

from __future__ import annotations

import contextlib
import functools
from typing import Iterable, Iterator, Optional, Sequence

import torch
from torch import nn

from base.eager_under_compile import eager_under_compile
from zero.flat_buffer import FlatLayout, Unit, unique_trainable_parameters

_RELEASED, _IN_FLIGHT, _READY = "released", "in flight", "ready"


def block_modules(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: the largest ModuleList's children."""
    best: list[nn.Module] = []
    best_numel = 0
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            numel = sum(p.numel() for p in module.parameters())
            if numel > best_numel:
                best, best_numel = list(module), numel
    return best


def stage3_unit_params(model: nn.Module, blocks: Optional[Sequence[nn.Module]] = None,
                       fp8_weights: frozenset = frozenset()) -> tuple[list[list[nn.Parameter]], list[nn.Module]]:
    """Parameters per chunk (root first, then each block's, its FP8 weights apart) and the module each chunk serves."""
    blocks = list(blocks) if blocks is not None else block_modules(model)
    claimed: set[int] = set()
    pairs = []
    for block in blocks:
        params = [p for p in unique_trainable_parameters(block) if id(p) not in claimed]
        claimed.update(id(p) for p in params)
        pairs += [([p for p in params if id(p) in fp8_weights], block),
                  ([p for p in params if id(p) not in fp8_weights], block)]
    root_params = [p for p in unique_trainable_parameters(model) if id(p) not in claimed]
    pairs = [(params, module) for params, module in [(root_params, model)] + pairs if params]
    return [params for params, _ in pairs], [module for _, module in pairs]


def _tensors(output) -> Iterable[torch.Tensor]:
    """Every tensor in a module's output (tensors, tuples, lists, dicts, ModelOutput)."""
    if torch.is_tensor(output):
        yield output
    elif isinstance(output, dict):
        for value in output.values():
            yield from _tensors(value)
    elif isinstance(output, (tuple, list)):
        for value in output:
            yield from _tensors(value)


class ParameterGatherer:
    """Gathers and frees a stage-3 model's chunks: `layout.units[i]` serves `modules[i]` and is backed by `flats[i]`."""

    def __init__(self, layout: FlatLayout, modules: Sequence[nn.Module], model: nn.Module,
                 flats: Sequence[torch.Tensor], param_shard: torch.Tensor, comm, group, zero_config, *,
                 shard_on_host: bool = False, fp8=None) -> None:
        self.layout, self.param_shard, self.comm, self.group = layout, param_shard, comm, group
        self.fp8 = fp8  # --fp8-param-gather: its units gather as bytes
        self.prefetch_numel = zero_config.stage3_prefetch_bucket_size
        self.max_live_numel = zero_config.stage3_max_live_parameters
        self.units = layout.units
        self.root = self.units[0] if modules and modules[0] is model else None
        self.persistent = {u.index for u in self.units if u.used < zero_config.stage3_param_persistence_threshold}
        self.flat = list(flats)
        self._nbytes = [unit.numel * flat.element_size() for unit, flat in zip(self.units, self.flat)]
        self._state = [_RELEASED] * len(self.units)
        self._work: dict[int, object] = {}
        # ZeRO-3 Offload: each gather's device copy lives until it is waited for
        self.shard_on_host = shard_on_host
        self._fetched: dict[int, torch.Tensor] = {}
        self._fetched_numel = 0
        self.live_numel = 0
        self.peak_live_numel = 0
        self.peak_device_numel = 0             # gathered plus fetched device copies
        self._trace: list[int] = []            # units in the order this forward ran them
        self._in_backward: set[int] = set()
        self._backward_started = False
        for index in sorted(self.persistent):
            self.flat[index].untyped_storage().resize_(self._nbytes[index])
            self._state[index] = _READY
            self.live_numel += self.units[index].numel
        self.peak_live_numel = self.peak_device_numel = self.live_numel
        self._handles = []
        for unit, module in zip(self.units, modules):
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._pre_forward, unit)))
            self._handles.append(module.register_forward_hook(functools.partial(self._post_forward, unit)))


    def _start_gather(self, unit: Unit) -> None:
        if self._state[unit.index] != _RELEASED:
            return
        flat = self.flat[unit.index]
        flat.untyped_storage().resize_(self._nbytes[unit.index])
        if self.fp8 is not None and self.fp8.holds(unit):  # FP8 bytes, dequantized once waited for
            self._work[unit.index] = self.fp8.start_gather(unit, async_op=True)
            self._mark_in_flight(unit)
            return
        shard = self._device_shard(unit)
        self._work[unit.index] = self.comm.all_gather(flat, shard, self.group, "dp", async_op=True)
        if self.shard_on_host:
            self._fetched[unit.index] = shard
            self._fetched_numel += shard.numel()
        self._mark_in_flight(unit)

    def _mark_in_flight(self, unit: Unit) -> None:
        self._state[unit.index] = _IN_FLIGHT
        self.live_numel += unit.numel
        self.peak_live_numel = max(self.peak_live_numel, self.live_numel)
        self.peak_device_numel = max(self.peak_device_numel, self.live_numel + self._fetched_numel)

    def _device_shard(self, unit: Unit) -> torch.Tensor:
        """This rank's piece of `unit` where the gather reads it."""
        shard = unit.in_partition(self.param_shard)
        return shard.to(self.flat[unit.index].device, copy=True) if self.shard_on_host else shard

    def _wait(self, unit: Unit) -> None:
        self._work.pop(unit.index).wait()
        fetched = self._fetched.pop(unit.index, None)
        if fetched is not None:
            self._fetched_numel -= fetched.numel()

    def _window_cost(self, unit: Unit) -> int:
        """Device elements `unit` takes in the prefetch window."""
        fetching = self.shard_on_host and (self._state[unit.index] == _RELEASED or unit.index in self._fetched)
        return unit.numel + (unit.shard_numel if fetching else 0)

    def fetch(self, unit: Unit) -> None:
        self._start_gather(unit)
        if self._state[unit.index] == _IN_FLIGHT:
            self._wait(unit)
            if self.fp8 is not None and self.fp8.holds(unit):
                self.fp8.dequantize(unit, self.flat[unit.index])
            self._state[unit.index] = _READY

    def release(self, unit: Unit) -> None:
        if unit.index in self.persistent or self._state[unit.index] == _RELEASED:
            return
        if self._state[unit.index] == _IN_FLIGHT:
            self._wait(unit)
        self.flat[unit.index].untyped_storage().resize_(0)
        if self.fp8 is not None and self.fp8.holds(unit):
            self.fp8.release(unit)
        self._state[unit.index] = _RELEASED
        self.live_numel -= unit.numel

    def _prefetch(self, candidates: Iterable[Unit]) -> None:
        """Keep the next chunks gathered or in flight up to the prefetch budget and the live cap. Chunks already
        gathered or in flight count against the window, so each hook tops it up rather than gathering most of the
        model."""
        budget = self.prefetch_numel
        for position, unit in enumerate(candidates):
            # a unit is a whole block: only the window's first may exceed what is left
            cost = self._window_cost(unit)
            if budget <= 0 or (position > 0 and cost > budget):
                break
            budget -= cost
            if self._state[unit.index] != _RELEASED:
                continue
            if self.live_numel + unit.numel > self.max_live_numel:
                break
            self._start_gather(unit)


    @eager_under_compile  # bookkeeping on Python state
    def _pre_forward(self, unit: Unit, module, args) -> None:
        if unit.index in self._in_backward:
            return  # a non-reentrant recompute: the backward gather serves it
        if self._backward_started:
            # a reentrant recompute has no gradient hook: its backward begins here
            self._begin_backward(unit)
            return
        if unit is self.root or unit.index in self._trace:
            self._trace.clear()  # a new forward
        self._trace.append(unit.index)
        self.fetch(unit)
        self._prefetch(self.units[unit.index + 1:])

    @eager_under_compile
    def _post_forward(self, unit: Unit, module, args, output) -> None:
        if unit.index in self._in_backward:
            return
        if torch.is_grad_enabled():
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(functools.partial(self._pre_backward, unit))
        self.release(unit)

    @eager_under_compile
    def _pre_backward(self, unit: Unit, grad: torch.Tensor) -> None:
        self._begin_backward(unit)

    def _begin_backward(self, unit: Unit) -> None:
        if unit.index in self._in_backward:
            return
        self._backward_started = True
        self._in_backward.add(unit.index)
        self.fetch(unit)
        self._prefetch(self.units[i] for i in reversed(self._trace) if i not in self._in_backward)


    def unit_reduced(self, unit: Unit) -> None:
        """No autograd node will read `unit` again."""
        if unit.index in self._in_backward:
            self.release(unit)

    def grad_sync_finished(self) -> None:
        """Free whatever backward left gathered (unused parameters, unused prefetches)."""
        for unit in self.units:
            self.release(unit)
        self._in_backward.clear()
        self._backward_started = False
        self._trace.clear()

    @contextlib.contextmanager
    def gathered(self, unit: Unit) -> Iterator[None]:
        """`unit` gathered for the body (outside forward and backward: checkpoint saving)."""
        was_released = self._state[unit.index] == _RELEASED
        self.fetch(unit)
        try:
            yield
        finally:
            if was_released:
                self.release(unit)

    def refresh_persistent(self) -> None:
        """Persistent chunks are re-gathered whole after the step."""
        for index in sorted(self.persistent):
            unit = self.units[index]
            if self.fp8 is not None and self.fp8.holds(unit):
                self.fp8.start_gather(unit, async_op=False)
                self.fp8.dequantize(unit, self.flat[index])
            else:
                self.comm.all_gather(self.flat[index], self._device_shard(unit), self.group, "dp")
