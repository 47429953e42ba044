"""ZeRO for a model with expert parameters, built twice as Megatron-Core chains two DistributedOptimizers: the dense
part over the DP group, the experts over the expert DP group (their gradient still divided by the dense DP size). One
gradient norm over both clips both, and one loss scaler serves both."""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Optional

import torch
from torch import nn

from parallel.mesh import MeshDim, ParallelDims
from parallel.sharding import record_of
from parallel.state import ParallelState
from zero.apply import ZeroParts, build_zero
from zero.host_memory import return_freed_blocks_to_system
from zero.loss_scaler import LossScaler
from zero.optimizer import StepResult
from zero.optimizer_state import CheckpointableOptimizer, NamedFragment, ShardedOptimizerState


def is_expert_parameter(param: nn.Parameter) -> bool:
    return record_of(param).is_expert


def holds_expert_parameters(model: nn.Module) -> bool:
    """Whether `model` (this rank's pipeline stage) trains an expert parameter."""
    return any(is_expert_parameter(param) for param in model.parameters() if param.requires_grad)


def expert_data_parallel_state(state: ParallelState) -> ParallelState:
    """`state` with the expert DP and expert TP groups where DP and TP were."""
    experts = state.experts
    dims = ParallelDims((state.dims["pp"],
                         MeshDim("dp", experts.data_size, experts.data_rank, experts.data_group),
                         MeshDim("cp", 1, 0, None),  # context parallelism folds into the experts' DP
                         MeshDim("tp", experts.tensor_size, experts.tensor_rank, experts.tensor_group)))
    # the experts' optimizer instances
    return ParallelState(device=state.device, dims=dims, comm=state.comm, optimizer_instances=experts.optimizer_instances)


def _build_part(model: nn.Module, chosen, zero_config, optimizer_config, state, **kwargs) -> ZeroParts:
    frozen = [param for param in model.parameters() if param.requires_grad and not chosen(param)]
    for param in frozen:
        param.requires_grad_(False)
    try:
        return build_zero(model, zero_config, optimizer_config, state, **kwargs)
    finally:
        for param in frozen:
            param.requires_grad_(True)


class BothReducers:
    """The dense and the expert gradient reducers, driven as one."""

    def __init__(self, dense, experts) -> None:
        self.parts = (dense, experts)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        with self.parts[0].no_sync(), self.parts[1].no_sync():
            yield

    def finish_grad_sync(self) -> None:
        for part in self.parts:
            part.finish_grad_sync()

    def zero_grad(self) -> None:
        for part in self.parts:
            part.zero_grad()

    def gradient_reducers(self) -> tuple:
        return self.parts


class CheckpointableChain(CheckpointableOptimizer):
    """CheckpointableOptimizer over both parts. Each expert DP group's first rank writes its experts by global name into
    a file of its EP rank, so a checkpoint loads at any EP size."""

    def model_state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        """The dense parameters whole; no expert."""
        return self.dense.model_state_dict(model, keep)

    def expert_model_state_dict(self, model: nn.Module) -> Optional[tuple[int, dict[str, torch.Tensor]]]:
        """(EP rank, its experts by global name) on the expert DP group's first rank; None on the others."""
        writes = self.expert_data_parallel_rank == 0
        weights = self.experts.model_state_dict(model, keep=writes)
        return (self.expert_parallel_rank, weights) if writes else None

    def sharded_state_dict(self, model: nn.Module) -> ShardedOptimizerState:
        dense, experts = self.dense.sharded_state_dict(model), self.experts.sharded_state_dict(model)
        offset = next(iter(dense.tensors.values())).numel()
        shifted = [NamedFragment(f.name, f.param_offset, f.partition_offset + offset, f.numel)
                   for f in experts.fragments]
        return ShardedOptimizerState(
            tensors={key: torch.cat([dense.tensors[key], experts.tensors[key]]) for key in dense.tensors},
            fragments=dense.fragments + shifted, replicated=False, zero_stage=dense.zero_stage,
            adam_step=dense.adam_step, loss_scaler_type=dense.loss_scaler_type,
            loss_scaler_state=dense.loss_scaler_state, param_dtype=dense.param_dtype, optimizer=dense.optimizer)

    def load_sharded_state_dict(self, tensors: dict[str, torch.Tensor], adam_step: Optional[int] = None,
                                loss_scaler_state: Optional[dict] = None) -> None:
        split = self.dense.master.numel()
        dense = {key: tensor[:split] for key, tensor in tensors.items()}
        experts = {key: tensor[split:] for key, tensor in tensors.items()}
        tensors.clear()
        self.dense.load_sharded_state_dict(dense, adam_step, loss_scaler_state)
        self.experts.load_sharded_state_dict(experts, adam_step)


class ChainedStep(CheckpointableChain):
    """One step over both optimizers: one norm, one clip, one scaler."""

    def __init__(self, dense, experts, expert_parallel_group, loss_scaler: LossScaler,
                 data_parallel_rank: int = 0, expert_data_parallel_rank: int = 0, expert_parallel_rank: int = 0) -> None:
        self.dense, self.experts = dense, experts
        self.expert_parallel_group, self.expert_parallel_rank = expert_parallel_group, expert_parallel_rank
        self.data_parallel_rank, self.expert_data_parallel_rank = data_parallel_rank, expert_data_parallel_rank
        self.loss_scaler = loss_scaler
        self.comm = dense.comm
        self.pipeline_group = None  # the norm's sum over pipeline stages (zero/pipeline_grads.py)

    @property
    def param_groups(self) -> list[dict]:
        return [*self.dense.param_groups, *self.experts.param_groups]

    @property
    def stage(self) -> int:
        return self.dense.stage

    @property
    def parts(self) -> tuple:
        return (self.dense, self.experts)

    # What memory reports and the planner read: both parts'.
    def model_state_tensors(self) -> dict[str, list[torch.Tensor]]:
        merged: dict[str, list[torch.Tensor]] = {}
        for part in self.parts:
            for key, tensors in part.model_state_tensors().items():
                merged.setdefault(key, []).extend(tensors)
        return merged

    @property
    def num_parameters(self) -> int:
        return self.dense.num_parameters + self.experts.num_parameters

    @property
    def padding(self) -> int:
        return self.dense.padding + self.experts.padding

    @property
    def parameters(self):
        """The dense part's parameter storage (the planner reads its gatherer)."""
        return self.dense.parameters

    def step_working_bytes(self, gather_copy_bytes: int = 0, norm_in_blocks: bool = False) -> int:
        return max(part.step_working_bytes(gather_copy_bytes, norm_in_blocks) for part in self.parts)

    def grad_norm_squared(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The squared norm over both parts and every stage."""
        dense = self.dense.stage_grad_norm_squared(grads[0])
        experts = self.experts.stage_grad_norm_squared(grads[1])
        self.comm.all_reduce(experts, self.expert_parallel_group, "ep")
        total = dense + experts
        self.comm.all_reduce(total, self.pipeline_group, "pp")
        return total

    def step_collectives_only(self) -> None:
        """`step`'s collectives without its arithmetic (the dry run's step)."""
        self.grad_norm_squared([part.gradients.partition_gradients() for part in self.parts])
        for part in self.parts:
            part.publish_parameters()

    def step(self) -> StepResult:
        scale = self.loss_scaler.scale
        grads = [part.gradients.partition_gradients() for part in (self.dense, self.experts)]
        if scale != 1.0:
            for grad in grads:
                grad.mul_(1.0 / scale)
        norm = self.grad_norm_squared(grads).sqrt().item()
        if not math.isfinite(norm) and self.loss_scaler.skips_on_overflow:
            self.loss_scaler.update(overflow=True)
            return StepResult(norm, skipped=True, loss_scale=scale)
        max_norm = self.dense.optimizer_config.clip_grad
        for part, grad in zip((self.dense, self.experts), grads):
            if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
                grad.mul_(max_norm / (norm + 1e-6))
            part.parameters.wait_all()  # an overlapped gather may still read the master the update writes
            part.update(grad)
            part.publish_parameters()
        self.loss_scaler.update(overflow=False)
        return StepResult(norm, skipped=False, loss_scale=scale)


class ExpertZeroParts:
    """ZeroParts' interface over the dense and the expert ZeroParts."""

    def __init__(self, dense: ZeroParts, experts: ZeroParts, state: ParallelState) -> None:
        self.dense, self.experts = dense, experts
        self.reducer = BothReducers(dense.reducer, experts.reducer)
        self.optimizer = ChainedStep(dense.optimizer, experts.optimizer, state.experts.model_group,
                                     dense.optimizer.loss_scaler, state.data_parallel_rank, state.experts.data_rank,
                                     state.experts.model_rank)

    @property
    def loss_scaler(self) -> LossScaler:
        return self.optimizer.loss_scaler

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.dense.scale_loss(loss)


def build_zero_with_experts(model: nn.Module, zero_config, optimizer_config, state: ParallelState, *,
                            loss_scaler: Optional[LossScaler] = None, own_units=(), decoupled_lr_params=(),
                            **kwargs) -> ExpertZeroParts:
    """build_zero for a model with experts; `own_units` and `decoupled_lr_params` go to the dense part."""
    if not holds_expert_parameters(model):
        raise ValueError("build_zero_with_experts: the model has no expert parameter (a record replicated over edp): "
                         "build it with build_zero")
    scaler = loss_scaler or LossScaler(1.0)
    expert_ids = {id(param) for param in model.parameters() if is_expert_parameter(param)}
    dense = _build_part(model, lambda param: id(param) not in expert_ids, zero_config, optimizer_config, state,
                        loss_scaler=scaler, own_units=own_units, decoupled_lr_params=decoupled_lr_params, **kwargs)
    bound_dense = {id(param) for param in model.parameters() if param.requires_grad} - expert_ids
    experts = _build_part(model, lambda param: id(param) not in bound_dense, zero_config, optimizer_config,
                          expert_data_parallel_state(state), loss_scaler=scaler,
                          gradient_divisor=state.data_context_parallel_size, **kwargs)
    if state.device.type == "cpu":
        # Each part set the malloc threshold to its own smallest weight; the model's smallest is the one meant.
        itemsize = dense.optimizer.parameters.dtype.itemsize
        return_freed_blocks_to_system(min((param.numel() * itemsize for param in model.parameters()
                                           if param.requires_grad and param.dim() >= 2), default=0))
    return ExpertZeroParts(dense, experts, state)
