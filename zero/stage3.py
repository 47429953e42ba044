"""ZeRO stage 3 (P_os+g+p): parameters live as 1/N shards and are gathered only while in use.

The unit of gathering is one flat chunk per transformer block, plus one *root* chunk for every parameter outside the
blocks (embeddings and final norm; the tied output layer uses the word embedding, so the root chunk stays gathered
for the whole forward). The caller passes the blocks (GPTModel's `model.blocks`); for a model we did not write
(transformers' GPT2LMHeadModel) they are the children of its largest `nn.ModuleList`. A chunk's life, driven by
module hooks, autograd tensor hooks and the gradient reducer's events (nothing calls into the gatherer in a step):

    forward pre-hook   gather (waiting for a prefetch in flight); prefetch the next chunks
    forward hook       hook the outputs' gradients, then free the chunk
    output grad hook   (backward reaches the block) gather again; prefetch the chunks backward needs next
    unit reduced       free the chunk (every autograd node that reads it has run)
    grad sync finished free whatever backward left gathered; the next forward starts afresh

Each parameter is a permanent view into its chunk's flat tensor; freeing resizes that storage to zero bytes and
gathering resizes it back and all-gathers into it, so tensors autograd saved (`weight.t()` in a linear) see the
re-gathered values in backward and no module code changes. A recompute runs a block's forward during its backward:
with the reentrant checkpoint (zero/activations.py) the original forward registered no hook, so the pre-hook, seeing
a forward after this backward began (the root chunk's output hook fires first in every backward), starts the chunk's
backward there; either way recompute and backward share one gather."""

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
    """The transformer blocks: the children of the ModuleList holding the most parameters."""
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
    """Parameters per chunk -- the root chunk first, then one per block -- and the module whose
    forward each chunk serves (the model itself for the root). With --fp8-param-gather a block's FP8
    linears' weights (`fp8_weights`, parameter ids) are a chunk of their own before the block's other
    parameters, serving the same block: it is gathered as FP8 bytes (zero/fp8_params.py)."""
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
    """Every tensor in a module's output (tensors, tuples, lists, dicts, transformers' ModelOutput)."""
    if torch.is_tensor(output):
        yield output
    elif isinstance(output, dict):
        for value in output.values():
            yield from _tensors(value)
    elif isinstance(output, (tuple, list)):
        for value in output:
            yield from _tensors(value)


class ParameterGatherer:
    """Gathers and frees the chunks of a stage-3 model. `layout.units[i]` serves `modules[i]` and is
    backed by `flats[i]` (its parameters are views into it, its storage freed); `param_shard` holds
    this rank's 16-bit shard of every unit (partition coordinates). Persistent chunks (smaller than
    the persistence threshold) get their storage back here and stay whole."""

    def __init__(self, layout: FlatLayout, modules: Sequence[nn.Module], model: nn.Module,
                 flats: Sequence[torch.Tensor], param_shard: torch.Tensor, comm, group, zero_config, *,
                 shard_on_host: bool = False, fp8=None) -> None:
        self.layout, self.param_shard, self.comm, self.group = layout, param_shard, comm, group
        self.fp8 = fp8  # --fp8-param-gather's Fp8WeightBytes (zero/fp8_params.py): its units gather as bytes
        self.prefetch_numel = zero_config.stage3_prefetch_bucket_size
        self.max_live_numel = zero_config.stage3_max_live_parameters
        self.units = layout.units
        self.root = self.units[0] if modules and modules[0] is model else None
        self.persistent = {u.index for u in self.units if u.used < zero_config.stage3_param_persistence_threshold}
        self.flat = list(flats)
        self._nbytes = [unit.numel * flat.element_size() for unit, flat in zip(self.units, self.flat)]
        self._state = [_RELEASED] * len(self.units)
        self._work: dict[int, object] = {}
        # ZeRO-3 Offload (zero/apply.py's placement, through the parameter storage): the shard lives in host
        # memory and each gather first copies its unit's piece to the device; the copy stays alive until its
        # gather is waited for.
        self.shard_on_host = shard_on_host
        self._fetched: dict[int, torch.Tensor] = {}
        self._fetched_numel = 0                # elements of those device copies alive now
        self.live_numel = 0
        self.peak_live_numel = 0               # the most parameter elements gathered at once
        self.peak_device_numel = 0             # the most gathered plus fetched (device copies) at once
        self._trace: list[int] = []            # units in the order this forward ran them
        self._in_backward: set[int] = set()    # units whose backward has started in this backward
        self._backward_started = False         # any unit's backward has begun since the last sync
        for index in sorted(self.persistent):
            self.flat[index].untyped_storage().resize_(self._nbytes[index])
            self._state[index] = _READY
            self.live_numel += self.units[index].numel
        self.peak_live_numel = self.peak_device_numel = self.live_numel
        self._handles = []
        for unit, module in zip(self.units, modules):
            self._handles.append(module.register_forward_pre_hook(functools.partial(self._pre_forward, unit)))
            self._handles.append(module.register_forward_hook(functools.partial(self._post_forward, unit)))

    # ---- gather and free ----------------------------------------------------------------------

    def _start_gather(self, unit: Unit) -> None:
        if self._state[unit.index] != _RELEASED:
            return
        flat = self.flat[unit.index]
        flat.untyped_storage().resize_(self._nbytes[unit.index])
        if self.fp8 is not None and self.fp8.holds(unit):  # FP8 bytes, dequantized into the chunk once waited for
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
        """This rank's piece of `unit` where the gather reads it: the shard itself, or with the shard on
        the host a device copy of the piece (a copy on a CPU too, so the offloaded path runs there)."""
        shard = unit.in_partition(self.param_shard)
        return shard.to(self.flat[unit.index].device, copy=True) if self.shard_on_host else shard

    def _wait(self, unit: Unit) -> None:
        self._work.pop(unit.index).wait()
        fetched = self._fetched.pop(unit.index, None)
        if fetched is not None:
            self._fetched_numel -= fetched.numel()

    def _window_cost(self, unit: Unit) -> int:
        """Device elements `unit` takes in the prefetch window: its chunk, and with the shard on the
        host the device copy of its piece that a gather not yet waited for holds (or will hold)."""
        fetching = self.shard_on_host and (self._state[unit.index] == _RELEASED or unit.index in self._fetched)
        return unit.numel + (unit.shard_numel if fetching else 0)

    def fetch(self, unit: Unit) -> None:
        """Make `unit`'s parameters usable now."""
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
        """Keep the next chunks gathered or in flight, up to the prefetch budget and the live-parameter
        cap. The budget is a window ahead of the chunk in use: chunks in it that are already gathered or
        in flight count against it too, so each hook tops the window up instead of starting a fresh
        budget's worth of gathers on top of the last one (which left most of the model gathered). With
        --offload-param each gather also holds a device copy of its 1/N piece until it is waited for:
        the window counts those too (`_window_cost`), so it bounds device memory, not only gathered
        parameters (the live-parameter cap stays in parameters, as DeepSpeed's)."""
        budget = self.prefetch_numel
        for position, unit in enumerate(candidates):
            # DeepSpeed starts the next parameter's gather whenever its budget is positive, however
            # large that parameter is. Our unit is a whole block, so only the first chunk of the
            # window may exceed what is left; the others fit in it (rounding the window up by a
            # block instead would add a block to every default run's peak).
            cost = self._window_cost(unit)
            if budget <= 0 or (position > 0 and cost > budget):
                break
            budget -= cost
            if self._state[unit.index] != _RELEASED:
                continue
            if self.live_numel + unit.numel > self.max_live_numel:
                break
            self._start_gather(unit)

    # ---- hooks --------------------------------------------------------------------------------

    @eager_under_compile  # bookkeeping on Python state: runs eagerly around a compiled block
    def _pre_forward(self, unit: Unit, module, args) -> None:
        if unit.index in self._in_backward:
            return  # a non-reentrant recompute: the backward gather serves it
        if self._backward_started:
            # A reentrant recompute (zero/activations.py): its forward runs with no gradient hook on
            # the outputs of the original forward, so this is where the block's backward begins.
            self._begin_backward(unit)
            return
        if unit is self.root or unit.index in self._trace:
            self._trace.clear()  # a new forward (also for models without a root chunk)
        self._trace.append(unit.index)
        self.fetch(unit)
        self._prefetch(self.units[unit.index + 1:])

    @eager_under_compile  # bookkeeping on Python state: runs eagerly around a compiled block
    def _post_forward(self, unit: Unit, module, args, output) -> None:
        if unit.index in self._in_backward:
            return
        if torch.is_grad_enabled():
            for tensor in _tensors(output):
                if tensor.requires_grad:
                    tensor.register_hook(functools.partial(self._pre_backward, unit))
        self.release(unit)

    @eager_under_compile  # bookkeeping on Python state: runs eagerly around a compiled block
    def _pre_backward(self, unit: Unit, grad: torch.Tensor) -> None:
        self._begin_backward(unit)

    def _begin_backward(self, unit: Unit) -> None:
        if unit.index in self._in_backward:
            return
        self._backward_started = True
        self._in_backward.add(unit.index)
        self.fetch(unit)
        self._prefetch(self.units[i] for i in reversed(self._trace) if i not in self._in_backward)

    # ---- the gradient reducer's events (zero.grad_reducer.ReductionListener) --------------------

    def unit_reduced(self, unit: Unit) -> None:
        """Every parameter of `unit` has its gradient: no autograd node will read it again."""
        if unit.index in self._in_backward:
            self.release(unit)

    def grad_sync_finished(self) -> None:
        """Free whatever backward left gathered (chunks with unused parameters, unused prefetches)."""
        for unit in self.units:
            self.release(unit)
        self._in_backward.clear()
        self._backward_started = False
        self._trace.clear()  # the next forward records its own order (models without a root chunk too)

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
        """Persistent chunks are never freed, so after the optimizer step they are re-gathered whole."""
        for index in sorted(self.persistent):
            unit = self.units[index]
            if self.fp8 is not None and self.fp8.holds(unit):
                self.fp8.start_gather(unit, async_op=False)
                self.fp8.dequantize(unit, self.flat[index])
            else:
                self.comm.all_gather(self.flat[index], self._device_shard(unit), self.group, "dp")
