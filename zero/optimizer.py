"""ZeroOptimizer: data parallelism with ZeRO-DP stages 0-3 and mixed precision, over the DP group.

What each stage keeps on a rank (Psi = parameters of this rank's TP shard, N = DP size; see
zero/memory.py for the byte counts):

    stage 0  16-bit params, 16-bit grads, fp32 master + Adam moments, all full size. Gradient buckets
             are all-reduced while backward runs (the DDP baseline, on ZeRO's buffers).
    stage 1  as stage 0, but the fp32 master and moments exist only for this rank's 1/N partition.
             Buckets are reduce-scattered; after the step each rank all-gathers the updated params.
    stage 2  as stage 1, and gradients are partitioned too: a gradient is copied into a constant-size
             bucket as soon as autograd produces it and then freed; a full bucket is reduce-scattered
             into this rank's partition while backward goes on.
    stage 3  as stage 2, and the 16-bit params are partitioned too: `zero.stage3.ParameterGatherer`
             gathers one flat chunk per transformer block (and one for the rest of the model) just in
             time for its forward and again for its backward, and frees it after.

Every stage shares one layout (`zero.flat_buffer.FlatLayout`): units (reduce buckets, or block chunks
in stage 3) padded so each splits into N aligned shards, rank r owning shard r of each. The fp32
master partition is those shards end to end; AdamW sees it as a handful of segment views, split by
weight decay. Communication volumes per iteration without accumulation: stages 0-2 send
2 Psi (N-1)/N elements per rank, stage 3 3 Psi (N-1)/N -- `zero/comm.py` counts them.

Overlap: reductions are issued with `async_op=True` and waited at the end of backward (or when a
scratch buffer is needed again), so they run while autograd computes earlier layers. On CUDA the
collectives run on NCCL's own stream; the small copies around them stay on the compute stream,
which keeps every buffer reuse ordered without extra events.

The training loop only calls `zero_grad()`, `backward(loss, last_micro_batch)` and `step()`.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from zero.flat_buffer import (DEFAULT_ALIGNMENT, BufferPool, FlatLayout, Unit, bucket_params,
                              unique_trainable_parameters)
from zero.loss_scaler import LossScaler, build_loss_scaler
from zero.stage3 import ParameterGatherer, stage3_unit_params

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepResult:
    grad_norm: float   # global norm of the unscaled, averaged gradient, before clipping
    skipped: bool      # True when an overflow made every rank skip the update (fp16)
    loss_scale: float  # the scale the gradients of this step were computed with


def apex_fused_adam():
    """NVIDIA apex's FusedAdam when the real apex (built from source) is installed, else None."""
    try:
        from apex.optimizers import FusedAdam
    except ImportError:
        return None
    return FusedAdam


def build_adamw(param_groups: list[dict], config, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with the fastest kernel available: apex FusedAdam on CUDA when the real apex is
    installed, else PyTorch's fused kernel on CUDA and its foreach kernel on CPU."""
    betas = (config.adam_beta1, config.adam_beta2)
    fused_adam = apex_fused_adam() if device.type == "cuda" else None
    if fused_adam is not None:
        return fused_adam(param_groups, lr=config.lr, betas=betas, eps=config.adam_eps, adam_w_mode=True)
    kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(param_groups, lr=config.lr, betas=betas, eps=config.adam_eps, **kernel)


@dataclass
class _PendingReduction:
    work: object                         # the async handle
    finish: Optional[Callable[[], None]]  # moves the reduced shard where it belongs
    release: Callable[[], None]           # returns scratch buffers to their pools


class ZeroOptimizer:
    """Wraps a model whose trainable parameters it takes over: they become views into flat 16-bit
    buffers (stages 0-2) or into per-chunk buffers that live only while needed (stage 3)."""

    def __init__(self, model: nn.Module, optimizer_config, zero_config, state, *,
                 dtype: torch.dtype = torch.float32, loss_scaler: Optional[LossScaler] = None,
                 stage3_units: Optional[Sequence[nn.Module]] = None,
                 alignment: int = DEFAULT_ALIGNMENT) -> None:
        if zero_config.stage not in (0, 1, 2, 3):
            raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, not {zero_config.stage}")
        self.stage = zero_config.stage
        self.zero_config = zero_config
        self.optimizer_config = optimizer_config
        self.state = state
        self.comm = state.comm
        self.group = state.data_parallel_group
        self.dp_size = state.data_parallel_size
        self.dtype = dtype
        self.device = state.device
        self.loss_scaler = loss_scaler or LossScaler(1.0)
        self.partitioned = self.stage >= 1
        self.part = state.data_parallel_rank if self.partitioned else 0
        parts = self.dp_size if self.partitioned else 1

        params = unique_trainable_parameters(model)
        if not params:
            raise ValueError("the model has no trainable parameters")
        for param in params:
            if param.device != self.device:
                raise ValueError(f"parameters must be on {self.device} before ZeRO wraps the model; "
                                 f"found one on {param.device}")
        if self.stage == 3:
            unit_params, unit_modules = stage3_unit_params(model, stage3_units)
        else:
            unit_params = bucket_params(params, zero_config.reduce_bucket_size)
        self.layout = FlatLayout(unit_params, parts, self.part, alignment)
        self.num_parameters = self.layout.num_parameters

        # fp32 master weights from the fp32 parameters, before anything is rounded to 16 bits.
        self.master = torch.empty(self.layout.partition_numel, dtype=torch.float32, device=self.device)
        self.flat_params: Optional[torch.Tensor] = None   # stages 0-2: every param is a view into it
        self.param_shard: Optional[torch.Tensor] = None   # stage 3: this rank's 16-bit shards
        self.flat_grads: Optional[torch.Tensor] = None    # stages 0-1: every .grad is a view into it
        self.grad_partition: Optional[torch.Tensor] = None  # stages 2-3: reduced shards, accumulated
        self._flatten_parameters()

        max_unit = max(unit.numel for unit in self.layout.units)
        max_shard = max(unit.shard_numel for unit in self.layout.units)
        self._staging = BufferPool(max_shard, dtype, self.device)   # reduce-scatter outputs
        self._buckets = BufferPool(max_unit, dtype, self.device)    # stages 2-3: gradient buckets
        self._filling: dict[int, torch.Tensor] = {}                  # unit index -> its pool buffer
        self._pending: list[_PendingReduction] = []
        self._ready = [0] * len(self.layout.units)
        self._reduce_in_this_backward = True

        self.gatherer: Optional[ParameterGatherer] = None
        if self.stage == 3:
            self.gatherer = ParameterGatherer(model, unit_modules, self.layout, self.param_shard, self.comm,
                                              self.group, dtype, self.device, zero_config)
        self._hooks = [param.register_post_accumulate_grad_hook(self._on_grad_ready)
                       for unit in self.layout.units for param in (slot.param for slot in unit.slots)]

        # AdamW over views of the master partition: one group with weight decay, one without.
        self._segments = self.layout.segments()
        self._segment_params = [nn.Parameter(self.master[s.start:s.end]) for s in self._segments]
        self._segment_index = {id(param): i for i, param in enumerate(self._segment_params)}
        groups = []
        for decay in (True, False):
            members = [p for p, s in zip(self._segment_params, self._segments) if s.kind.weight_decay == decay]
            if members:
                groups.append({"params": members,
                               "weight_decay": optimizer_config.weight_decay if decay else 0.0})
        self.optimizer = build_adamw(groups, optimizer_config, self.device)
        self.param_groups = self.optimizer.param_groups
        # The Adam moments are two flat tensors in partition coordinates, like the master: AdamW's
        # per-segment state is views into them, so a checkpoint saves (and an elastic resume
        # refills) each as one tensor. Created here rather than lazily at the first step, with the
        # zeros AdamW would have used, so nothing about the update changes.
        self.exp_avg = torch.zeros_like(self.master)
        self.exp_avg_sq = torch.zeros_like(self.master)
        for group in self.param_groups:
            step_on_device = group.get("fused") or group.get("capturable")
            for param in group["params"]:
                segment = self._segments[self._segment_index[id(param)]]
                self.optimizer.state[param] = {
                    "step": torch.zeros((), dtype=torch.float32,
                                        device=self.device if step_on_device else "cpu"),
                    "exp_avg": self.exp_avg[segment.start:segment.end],
                    "exp_avg_sq": self.exp_avg_sq[segment.start:segment.end]}
        self.zero_grad()

    # ---- layout -------------------------------------------------------------------------------

    def _flatten_parameters(self) -> None:
        layout, dtype = self.layout, self.dtype
        if self.stage < 3:
            self.flat_params = torch.zeros(layout.numel, dtype=dtype, device=self.device)
        else:
            self.param_shard = torch.zeros(layout.partition_numel, dtype=dtype, device=self.device)
        for unit in layout.units:
            full = torch.zeros(unit.numel, dtype=torch.float32, device=self.device)
            for slot in unit.slots:
                full[slot.start:slot.end] = slot.param.detach().reshape(-1)
            lo, hi = unit.shard_bounds(self.part)
            unit.in_partition(self.master).copy_(full[lo:hi])
            if self.stage < 3:
                unit_params = unit.in_buffer(self.flat_params)
                unit_params.copy_(full)
                for slot in unit.slots:
                    slot.param.data = unit_params[slot.start:slot.end].view(slot.shape)
            else:
                unit.in_partition(self.param_shard).copy_(full[lo:hi])
        if self.stage < 2:
            self.flat_grads = torch.zeros(layout.numel, dtype=dtype, device=self.device)
        else:
            self.grad_partition = torch.zeros(layout.partition_numel, dtype=dtype, device=self.device)

    def _owned_flat_slice(self, flat: torch.Tensor, unit: Unit) -> torch.Tensor:
        lo, hi = unit.shard_bounds(self.part)
        return unit.in_buffer(flat)[lo:hi]

    # ---- gradients ----------------------------------------------------------------------------

    def zero_grad(self) -> None:
        """Start a new accumulation: reset the gradient buffers (kept allocated) and re-attach the
        views, in case something set `.grad` to None."""
        if self.flat_grads is not None:
            self.flat_grads.zero_()
            for unit in self.layout.units:
                unit_grads = unit.in_buffer(self.flat_grads)
                for slot in unit.slots:
                    slot.param.grad = unit_grads[slot.start:slot.end].view(slot.shape)
        else:
            self.grad_partition.zero_()
            for unit in self.layout.units:
                for slot in unit.slots:
                    slot.param.grad = None

    def backward(self, loss: torch.Tensor, last_micro_batch: bool = True) -> None:
        """Backward of one micro-batch (`loss` already divided by the accumulation steps), with its
        gradient reduction. Stages 0-1 reduce only after the last micro-batch of an accumulation;
        stages 2-3 keep only a partition of the gradient, so they reduce after every micro-batch."""
        self._reduce_in_this_backward = last_micro_batch or self.stage >= 2
        self._ready = [0] * len(self.layout.units)
        scale = self.loss_scaler.scale
        (loss * scale if scale != 1.0 else loss).backward()
        self._finish_backward()

    def _on_grad_ready(self, param: nn.Parameter) -> None:
        unit = self.layout.unit_of[id(param)]
        if self.stage >= 2:
            # Copy into the bucket and free the gradient: a full gradient never exists.
            slot = self.layout.slot_of[id(param)]
            self._bucket_for(unit)[slot.start:slot.end].copy_(param.grad.reshape(-1))
            param.grad = None
        elif not self._reduce_in_this_backward:
            return  # accumulating locally into the flat gradient buffer
        self._ready[unit.index] += 1
        if self._ready[unit.index] == len(unit.slots):
            self._reduce(unit)

    def _bucket_for(self, unit: Unit) -> torch.Tensor:
        buffer = self._filling.get(unit.index)
        if buffer is None:
            while not self._buckets.has_free and self._pending:
                self._complete(self._pending.pop(0))
            buffer = self._buckets.acquire()
            buffer[:unit.numel].zero_()  # padding, and parameters that get no gradient this micro-batch
            self._filling[unit.index] = buffer
        return buffer[:unit.numel]

    def _staging_buffer(self) -> torch.Tensor:
        while not self._staging.has_free and self._pending:
            self._complete(self._pending.pop(0))
        return self._staging.acquire()

    def _reduce(self, unit: Unit) -> None:
        """Average `unit`'s gradient over the DP group, asynchronously."""
        self._ready[unit.index] = -1  # reduced; late hooks (none expected) cannot trigger it again
        if self.stage < 2:
            bucket = unit.in_buffer(self.flat_grads)
            bucket_buffer = None
        else:
            bucket_buffer = self._filling.pop(unit.index)
            bucket = bucket_buffer[:unit.numel]
        if self.dp_size > 1:
            bucket.div_(self.dp_size)  # average before summing: keeps fp16 sums in range

        released: list[tuple[BufferPool, torch.Tensor]] = []
        if bucket_buffer is not None:
            released.append((self._buckets, bucket_buffer))
        finish = None
        if self.stage == 0:
            work = self.comm.all_reduce(bucket, self.group, "dp", async_op=True)
        else:
            if self.zero_config.reduce_scatter:
                staging = self._staging_buffer()
                released.append((self._staging, staging))
                shard = staging[:unit.shard_numel]
                work = self.comm.reduce_scatter(shard, bucket, self.group, "dp", async_op=True)
            else:  # DeepSpeed's reduce_scatter=false: all-reduce, keep this rank's shard
                work = self.comm.all_reduce(bucket, self.group, "dp", async_op=True)
                lo, hi = unit.shard_bounds(self.part)
                shard = bucket[lo:hi]
            if self.stage == 1:
                target = self._owned_flat_slice(self.flat_grads, unit)
                finish = (lambda t=target, s=shard: t.copy_(s)) if target.data_ptr() != shard.data_ptr() else None
            else:
                target = unit.in_partition(self.grad_partition)
                finish = lambda t=target, s=shard: t.add_(s)  # noqa: E731 (accumulate across micro-batches)

        def release(buffers=tuple(released)) -> None:
            for pool, buffer in buffers:
                pool.release(buffer)

        self._pending.append(_PendingReduction(work, finish, release))
        if not self.zero_config.overlap_comm:
            self._complete_all()
        if self.gatherer is not None:
            self.gatherer.backward_done(unit)

    @staticmethod
    def _complete(pending: _PendingReduction) -> None:
        pending.work.wait()
        if pending.finish is not None:
            pending.finish()
        pending.release()

    def _complete_all(self) -> None:
        while self._pending:
            self._complete(self._pending.pop(0))

    def _finish_backward(self) -> None:
        """Reduce units whose gradients did not all arrive (unused parameters), in unit order so every
        rank issues the same collectives, then wait for every reduction."""
        if self._reduce_in_this_backward:
            for unit in self.layout.units:
                if self._ready[unit.index] == -1:
                    continue
                if self.stage < 2 or unit.index in self._filling:
                    self._reduce(unit)
        if self.gatherer is not None:
            self.gatherer.finish_backward()
        self._complete_all()

    # ---- the step -----------------------------------------------------------------------------

    def _partition_gradients(self) -> torch.Tensor:
        """This rank's partition of the averaged gradient in fp32, with the loss scale removed."""
        if self.grad_partition is not None:
            grads = self.grad_partition.to(torch.float32, copy=True)
        elif not self.partitioned:
            grads = self.flat_grads.to(torch.float32, copy=True)  # stage 0: the partition is everything
        else:
            grads = torch.empty_like(self.master)
            for unit in self.layout.units:
                unit.in_partition(grads).copy_(self._owned_flat_slice(self.flat_grads, unit))
        if self.loss_scaler.scale != 1.0:
            grads.mul_(1.0 / self.loss_scaler.scale)
        return grads

    def _global_grad_norm(self, grads: torch.Tensor) -> float:
        """L2 norm over the whole model: partitions are disjoint across DP ranks (stage 0's are all the
        same, so no DP sum), TP-sharded elements are disjoint across TP ranks, and TP-replicated
        elements are counted on TP rank 0 only."""
        sharded = [grads[s.start:s.end] for s in self._segments if s.kind.tensor_parallel]
        replicated = [grads[s.start:s.end] for s in self._segments if not s.kind.tensor_parallel]
        if self.state.tensor_parallel_rank != 0:
            replicated = []
        squares = [norm.square() for norm in torch._foreach_norm(sharded + replicated)] if sharded or replicated else []
        total = torch.stack(squares).sum() if squares else torch.zeros((), device=self.device)
        total = total.reshape(1).to(torch.float32)
        self.comm.all_reduce(total, self.state.tensor_parallel_group, "tp")
        if self.partitioned:
            self.comm.all_reduce(total, self.group, "dp")
        return total.sqrt().item()

    def step(self) -> StepResult:
        """Unscale, agree on overflow, clip by the global norm, update this rank's partition with AdamW
        and publish the new 16-bit parameters."""
        scale = self.loss_scaler.scale
        grads = self._partition_gradients()
        norm = self._global_grad_norm(grads)
        overflow = not math.isfinite(norm)  # every rank sees the same all-reduced norm
        if overflow and self.loss_scaler.skips_on_overflow:
            self.loss_scaler.update(overflow=True)
            return StepResult(norm, skipped=True, loss_scale=scale)

        max_norm = self.optimizer_config.clip_grad
        if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
            grads.mul_(max_norm / (norm + 1e-6))
        for param, segment in zip(self._segment_params, self._segments):
            param.grad = grads[segment.start:segment.end]
        self.optimizer.step()
        for param in self._segment_params:
            param.grad = None
        del grads
        self.publish_parameters()
        self.loss_scaler.update(overflow=False)
        return StepResult(norm, skipped=False, loss_scale=scale)

    def publish_parameters(self) -> None:
        """Make the 16-bit parameters reflect the master weights (after a step, or after a checkpoint
        refilled the master). Every DP rank must call it: stages 1-3 communicate."""
        if self.stage == 0:
            self.flat_params.copy_(self.master)
            return
        if self.stage == 3:
            self.param_shard.copy_(self.master)
            self.gatherer.refresh_persistent()
            return
        owned = self.master.to(self.dtype)  # a separate tensor, so no collective reads what it writes
        works, in_flight = [], 0
        for unit in self.layout.units:
            output = unit.in_buffer(self.flat_params)
            works.append(self.comm.all_gather(output, unit.in_partition(owned), self.group, "dp",
                                              async_op=True))
            in_flight += unit.numel
            if in_flight >= self.zero_config.allgather_bucket_size:
                for work in works:
                    work.wait()
                works, in_flight = [], 0
        for work in works:
            work.wait()

    # ---- checkpoint state ---------------------------------------------------------------------

    @property
    def adam_step(self) -> int:
        """Updates AdamW has applied (the same for every segment; skipped fp16 steps do not count)."""
        group = self.param_groups[0]
        if "step" in group:  # apex FusedAdam counts per group
            return int(group["step"])
        return int(self.optimizer.state[group["params"][0]]["step"].item())

    @adam_step.setter
    def adam_step(self, step: int) -> None:
        for group in self.param_groups:
            if "step" in group:
                group["step"] = step
            for param in group["params"]:
                self.optimizer.state[param]["step"].fill_(step)

    def gathered_parameters(self, unit: Unit):
        """A context in which `unit`'s parameters hold their full values (stage 3 gathers the chunk,
        a collective over the DP group, and frees it afterwards)."""
        if self.gatherer is None:
            return contextlib.nullcontext()
        return self.gatherer.gathered(unit)

    # ---- introspection ------------------------------------------------------------------------

    def model_state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The live tensors of the model states this rank holds, for zero/memory.py to measure (views
        of one flat buffer are de-duplicated there by storage)."""
        slots = [slot for unit in self.layout.units for slot in unit.slots]
        params = [slot.param.data for slot in slots]
        params += [t for t in (self.flat_params, self.param_shard) if t is not None]
        grads = [slot.param.grad for slot in slots if slot.param.grad is not None]
        grads += [t for t in (self.flat_grads, self.grad_partition) if t is not None]
        moments = [self.exp_avg, self.exp_avg_sq]
        buffers = self._buckets.buffers + self._staging.buffers
        return {"parameters": params, "gradients": grads, "master_weights": [self.master],
                "optimizer_states": moments, "buffers": buffers}

    @property
    def padding(self) -> int:
        """Alignment padding elements in the flat layout (what memory and bytes may exceed Psi by)."""
        return self.layout.padding


def build_zero_optimizer(model: nn.Module, config, state, stage3_units: Optional[Sequence[nn.Module]] = None
                         ) -> ZeroOptimizer:
    """The ZeroOptimizer a PretrainConfig asks for: its stage, buckets, precision and loss scaling."""
    training = config.training
    scaler = build_loss_scaler(training.fp16, training.loss_scale, training.initial_loss_scale,
                               training.loss_scale_window, training.hysteresis, training.min_loss_scale)
    return ZeroOptimizer(model, config.optimizer, config.zero, state, dtype=PRECISION_DTYPES[training.precision],
                         loss_scaler=scaler, stage3_units=stage3_units)
