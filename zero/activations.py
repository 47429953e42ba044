"""ZeRO-R for activations: full-recompute checkpointing of block groups (a custom autograd Function, Megatron's
reentrant form) with the forward's RNG streams restored for the recompute, and the kept input partitioned over TP (P_a),
held in host memory (P_a+cpu) or in one preallocated buffer (M_D)."""

from __future__ import annotations

import contextlib
import math
import time
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from parallel.fp8.recompute import delayed_scalings_in, recomputing, stash_for_recompute
from zero.checkpoint_buffer import ContiguousCheckpoints, SlotLease
from zero.memory import storage_identity


def _rng_states(rng, device: torch.device) -> dict:
    if rng is not None:
        return rng.get_states()
    states = {"default_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["default_cuda"] = torch.cuda.get_rng_state(device)
    return states


def _set_rng_states(rng, device: torch.device, states: dict) -> None:
    if rng is not None:
        rng.set_states(states)
        return
    torch.set_rng_state(states["default_cpu"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(states["default_cuda"], device)


def _held_bytes(tensor: torch.Tensor) -> int:
    """Bytes a saved tensor holds: a stride-0 dimension holds no more elements."""
    repeats = math.prod(size for size, stride in zip(tensor.shape, tensor.stride()) if stride == 0 and size > 1)
    return tensor.numel() // repeats * tensor.element_size()


class SavedTensorMeter:
    """Peak bytes autograd saves for backward, by location, and of the checkpointed inputs among them; parameters not
    counted, a storage once."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.live = {"device": 0, "host": 0}
        self.peak = {"device": 0, "host": 0}
        self.checkpointed_live = {"device": 0, "host": 0}
        self.checkpointed_peak = {"device": 0, "host": 0}
        self._counts: dict[tuple, int] = {}
        # Checkpointed inputs announced by the checkpoint function, recognised when autograd packs them.
        self._expected: dict[tuple, tuple[str, bool]] = {}  # where -> (location, in the contiguous buffer)

    @staticmethod
    def _where(tensor: torch.Tensor) -> tuple:
        """The allocation and offset a tensor starts at (meta included)."""
        return (*storage_identity(tensor), tensor.storage_offset(), tensor.numel())

    def expect_checkpoint(self, tensor: torch.Tensor, location: str, in_contiguous_buffer: bool = False) -> None:
        self._expected[self._where(tensor)] = (location, in_contiguous_buffer)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor):
        if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
            return tensor
        # on a CPU-only run P_a+cpu's host copies are known only from the announcement
        location = "host" if tensor.device.type == "cpu" and self.device.type != "cpu" else "device"
        location, in_buffer = self._expected.pop(self._where(tensor), (location, None))
        checkpointed = in_buffer is not None
        key = (self._where(tensor), _held_bytes(tensor), location, checkpointed, bool(in_buffer))
        self._counts[key] = self._counts.get(key, 0) + 1
        if self._counts[key] == 1:
            self._add(key, +1)
        return _Saved(tensor, self, key)

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _release(self, key) -> None:
        self._counts[key] -= 1
        if self._counts[key] == 0:
            del self._counts[key]
            self._add(key, -1)

    def _add(self, key, sign: int) -> None:
        _, nbytes, location, checkpointed, in_buffer = key
        if not in_buffer:
            self.live[location] += sign * nbytes
            self.peak[location] = max(self.peak[location], self.live[location])
        if checkpointed:
            self.checkpointed_live[location] += sign * nbytes
            self.checkpointed_peak[location] = max(self.checkpointed_peak[location],
                                                   self.checkpointed_live[location])


class _Saved:
    """A saved tensor; dropping it counts it freed."""

    __slots__ = ("tensor", "meter", "key")

    def __init__(self, tensor, meter, key):
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self):
        self.meter._release(self.key)


class ActivationMonitor:
    """What the loop observes of activations: saved-tensor measurement and checkpoint timings."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.meter: Optional[SavedTensorMeter] = None  # set while an iteration is measured
        self.timings: list[tuple[str, float]] = []     # (phase, seconds) with --profile-checkpointing

    @contextlib.contextmanager
    def measuring(self) -> Iterator[SavedTensorMeter]:
        """Measure what autograd saves while the body runs (wrap each forward)."""
        self.meter = SavedTensorMeter(self.device) if self.meter is None else self.meter
        with self.meter.hooks():
            yield self.meter

    def finish_measurement(self) -> Optional[SavedTensorMeter]:
        meter, self.meter = self.meter, None
        return meter

    def record_timing(self, phase: str, seconds: float) -> None:
        self.timings.append((phase, seconds))

    def take_timings(self) -> list[tuple[str, float]]:
        timings, self.timings = self.timings, []
        return timings


class ActivationCheckpointing:
    """Runs a model's blocks under activation checkpointing; owns the contiguous buffer."""

    def __init__(self, config, state, rng=None, chunk_layers: Sequence[int] = (),
                 monitor: Optional[ActivationMonitor] = None, input_is_split: bool = False,
                 slot_sets: int = 1) -> None:
        """`chunk_layers` and `slot_sets` (micro-batches in flight) size the contiguous buffer."""
        self.config = config
        self.state = state
        self.rng = rng
        self.device = state.device
        # `input_is_split`: the input is already this rank's slice (sequence parallelism)
        self.partition = config.partition_activations and state.tensor_parallel_size > 1 and not input_is_split
        self.offload = config.cpu_checkpointing
        self.pin = self.offload and self.device.type == "cuda"  # host checkpoints copied asynchronously
        self.monitor = monitor or ActivationMonitor(self.device)
        self.contiguous = ContiguousCheckpoints(config.buffer_checkpoints(*chunk_layers), slot_sets,
                                                self.host if self.offload else self.device, self.pin) \
            if config.contiguous_checkpointing else None

    @property
    def host(self) -> torch.device:
        """Where P_a+cpu keeps checkpoints: the CPU, or meta on a planner's rank."""
        return torch.device("meta") if self.device.type == "meta" else torch.device("cpu")

    def run(self, blocks: Sequence[nn.Module], hidden: torch.Tensor, documents=None) -> torch.Tensor:
        """`hidden` through one model chunk's blocks, checkpointing the groups --recompute-method picks."""
        if not torch.is_grad_enabled():
            return _run_in_order(blocks, hidden, documents)
        for first, end, checkpointed in self.config.checkpointed_groups(len(blocks)):
            group = blocks[first:end]
            hidden = _CheckpointFunction.apply(_BlockGroup(list(group), documents), self, hidden) if checkpointed \
                else _run_in_order(group, hidden, documents)
        return hidden


    def _slice_bounds(self, numel: int) -> tuple[int, int]:
        """This TP rank's [start, length) of a flattened input, padded to TP equal slices."""
        slice_numel = math.ceil(numel / self.state.tensor_parallel_size)
        start = self.state.tensor_parallel_rank * slice_numel
        return start, slice_numel

    def _destination(self, numel: int, dtype: torch.dtype) -> tuple[torch.Tensor, Optional[SlotLease]]:
        """A buffer slot (with its lease) or a fresh tensor for one kept slice."""
        if self.contiguous is not None:
            return self.contiguous.take(numel, dtype)
        return torch.empty(numel, dtype=dtype, device=self.host if self.offload else self.device, pin_memory=self.pin), \
            None

    def store(self, hidden: torch.Tensor) -> tuple[torch.Tensor, Optional[SlotLease]]:
        """The part of a group's input this rank keeps (all, or its 1/TP slice), and its slot's lease."""
        flat = hidden.detach().reshape(-1)
        if self.partition:
            start, slice_numel = self._slice_bounds(flat.numel())
            piece = flat[start:start + slice_numel]
            kept, lease = self._destination(slice_numel, flat.dtype)
            kept[:piece.numel()].copy_(piece, non_blocking=True)
            kept[piece.numel():].zero_()  # the last rank's padding
        else:
            kept, lease = self._destination(flat.numel(), flat.dtype)
            kept.copy_(flat, non_blocking=True)
        return kept, lease

    def restore(self, kept: torch.Tensor, shape: torch.Size, lease: Optional[SlotLease] = None) -> torch.Tensor:
        """Rebuild the full input from what `store` kept and free its slot."""
        piece = kept.to(self.device, non_blocking=True) if kept.device != self.device else kept
        if not self.partition:
            restored = piece.clone().view(shape)  # the kept one may be a reused buffer slot
        else:
            gathered = torch.empty(piece.numel() * self.state.tensor_parallel_size, dtype=piece.dtype,
                                   device=self.device)
            self.state.comm.all_gather(gathered, piece, self.state.tensor_parallel_group, "tp")
            restored = gathered[:shape.numel()].view(shape)
        if lease is not None:
            lease.give_back()
        return restored

    def synchronize(self) -> None:
        if self.config.synchronize_checkpoint_boundary and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class _BlockGroup:
    """A picklable stand-in for a closure over a group of blocks."""

    def __init__(self, blocks: list[nn.Module], documents=None) -> None:
        self.blocks, self.documents = blocks, documents
        # FP8 delayed scaling: the recompute casts with the forward's scales
        self.fp8_scalings = delayed_scalings_in(blocks)

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        return _run_in_order(self.blocks, hidden, self.documents)


def _run_in_order(blocks: Sequence[nn.Module], hidden: torch.Tensor, documents=None) -> torch.Tensor:
    for block in blocks:
        hidden = block(hidden) if documents is None else block(hidden, documents)
    return hidden


class _CheckpointFunction(torch.autograd.Function):
    """Forward without saving internals; backward restores the input and RNG, recomputes, backpropagates."""

    @staticmethod
    def forward(ctx, run: _BlockGroup, checkpointing: ActivationCheckpointing, hidden: torch.Tensor):
        checkpointing.synchronize()
        started = time.perf_counter()
        ctx.run, ctx.checkpointing, ctx.shape = run, checkpointing, hidden.shape
        ctx.rng_states = _rng_states(checkpointing.rng, checkpointing.device)
        stash_for_recompute(run.fp8_scalings)
        with torch.no_grad():
            output = run(hidden)
        kept, ctx.lease = checkpointing.store(hidden)
        if checkpointing.monitor.meter is not None:
            checkpointing.monitor.meter.expect_checkpoint(kept, "host" if checkpointing.offload else "device",
                                                          in_contiguous_buffer=ctx.lease is not None)
        ctx.save_for_backward(kept)
        if checkpointing.config.profile_checkpointing:
            checkpointing.monitor.record_timing("forward", time.perf_counter() - started)
        return output

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        checkpointing = ctx.checkpointing
        checkpointing.synchronize()
        started = time.perf_counter()
        (kept,) = ctx.saved_tensors
        hidden = checkpointing.restore(kept, ctx.shape, ctx.lease).detach().requires_grad_(True)
        current = _rng_states(checkpointing.rng, checkpointing.device)
        _set_rng_states(checkpointing.rng, checkpointing.device, ctx.rng_states)
        try:
            with torch.enable_grad(), recomputing(ctx.run.fp8_scalings):
                output = ctx.run(hidden)
        finally:
            _set_rng_states(checkpointing.rng, checkpointing.device, current)
        torch.autograd.backward(output, grad_output)
        if checkpointing.config.profile_checkpointing:
            checkpointing.monitor.record_timing("recompute+backward", time.perf_counter() - started)
        return None, None, hidden.grad


def apply_activation_checkpointing(model: nn.Module, config, state, rng=None,
                                   monitor: Optional[ActivationMonitor] = None,
                                   slot_sets: int = 1) -> ActivationCheckpointing:
    """Make `model` run its blocks under activation checkpointing (its `run_blocks` hook)."""
    if not hasattr(model, "run_blocks") or not hasattr(model, "blocks"):
        raise TypeError(f"{type(model).__name__} has no run_blocks hook: activation checkpointing applies to "
                        "models that run their blocks through model.run_blocks(blocks, hidden), like GPTModel")
    chunks = getattr(model, "chunk_blocks", None) or [model.blocks]
    checkpointing = ActivationCheckpointing(config, state, rng, [len(chunk) for chunk in chunks], monitor,
                                            input_is_split=getattr(model, "sequence_parallel", False),
                                            slot_sets=slot_sets)
    model.run_blocks = checkpointing.run
    return checkpointing

