"""ZeRO for a model with expert-parallel parameters: the experts' states over the expert data-parallel group.

An expert parameter (its sharding record replicated over "edp", parallel/sharding.py; Megatron-Core tags experts
`allreduce = False`) is held by the ranks of one expert DP group only; the others by the whole DP group. So ZeRO is
built twice, as Megatron-Core chains two DistributedOptimizers (optimizer/__init__.py; ChainedOptimizer):

    dense     buckets, reduction and optimizer partition over the DP group, as build_zero alone does
    experts   over the expert DP group, the experts' TP group standing for TP; the gradient still divided by the
              DENSE DP size before it is summed, as Megatron's expert_gradient_scaling_factor = 1 /
              data_parallel_world_size (each DP rank's loss is a mean over its own tokens)

The step clips both by ONE gradient norm (ChainedOptimizer.get_grad_norm): within a stage the dense squares summed
over TP and DP, the experts' over ETP, expert DP and EP (each expert counted once), added, then summed over the
stages once. One loss scaler serves both; an overflow anywhere skips both updates. A stage whose layers hold no
expert has no experts' part (training/build.py, as Megatron-Core builds its expert optimizer only `if
len(moe_param_groups) > 0`); the experts' groups are the stage's (parallel/mesh.py), so no other rank waits for it.

At stage 3 each part gathers its own chunks as the modules run; an expert with no rows still runs on its empty
slice, so its chunk is gathered and reduced on every rank. The expert part's reductions are counted on the
communicator's "dp" and "tp" counters (the groups are the experts'), the norm's sum over EP on "ep"."""

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
    """`state` as the experts' ZeRO sees it: the expert DP group where the DP group was, the expert
    tensor-parallel group where the TP group was (the same ranks, communicator and device)."""
    experts = state.experts
    dims = ParallelDims((state.dims["pp"],
                         MeshDim("dp", experts.data_size, experts.data_rank, experts.data_group),
                         MeshDim("cp", 1, 0, None),  # context parallelism folds into the experts' DP
                         MeshDim("tp", experts.tensor_size, experts.tensor_rank, experts.tensor_group)))
    # the experts' optimizer instances (Megatron's intra/inter-partial expert DP groups, parallel/state.py)
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
    """The dense and the expert gradient reducers, driven as one (what the training loop calls)."""

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
    """What checkpoint/ asks of an optimizer (zero/optimizer_state.py's CheckpointableOptimizer), over both parts.

    Each rank's experts are saved by their owner, never gathered: `model_state_dict` is the dense part (the
    names every data-parallel rank shares, written once per TP rank), `expert_model_state_dict` this rank's
    experts (named by global index), written by the expert data-parallel group's first rank into a file of its
    expert-parallel rank, as Megatron-LM names a checkpoint file by its expert rank too
    (megatron/training/checkpointing.py get_checkpoint_name, `expert_rank`) and Megatron-Core's experts save by
    global index from their own ranks (megatron/core/transformer/moe/experts.py sharded_state_dict).
    The partition a rank saves is its dense partition followed by its expert partition; which of its fragments it
    names is the save plan's (checkpoint/save_plan.py, by the parameters' sharding records: a part replicated over
    its data-parallel group at stage 0 by that group's first rank only). Fragments are found by name when loading,
    so the checkpoint loads at any expert-parallel size (and at EP 1 into a plain ShardedAdamW), each rank reading
    only its own experts."""

    def model_state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        """The dense parameters whole (every data-parallel rank takes part at stage 3); no expert."""
        return self.dense.model_state_dict(model, keep)

    def expert_model_state_dict(self, model: nn.Module) -> Optional[tuple[int, dict[str, torch.Tensor]]]:
        """(this rank's expert-parallel rank, its experts whole by global name) on the expert data-parallel
        group's first rank, which writes them; None on the others, which only take part (stage 3 gathers the
        chunks over that group) and hold no copies."""
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
    """One step over the dense and the expert optimizers: one norm over all parameters, one clip, one scaler."""

    def __init__(self, dense, experts, expert_parallel_group, loss_scaler: LossScaler,
                 data_parallel_rank: int = 0, expert_data_parallel_rank: int = 0, expert_parallel_rank: int = 0) -> None:
        self.dense, self.experts = dense, experts
        self.expert_parallel_group, self.expert_parallel_rank = expert_parallel_group, expert_parallel_rank
        self.data_parallel_rank, self.expert_data_parallel_rank = data_parallel_rank, expert_data_parallel_rank
        self.loss_scaler = loss_scaler
        self.comm = dense.comm
        self.pipeline_group = None  # set with pipeline stages (zero/pipeline_grads.py): the norm's sum over them

    @property
    def param_groups(self) -> list[dict]:
        """Both optimizers' groups (the loop sets each group's learning rate)."""
        return [*self.dense.param_groups, *self.experts.param_groups]

    @property
    def stage(self) -> int:
        return self.dense.stage

    @property
    def parts(self) -> tuple:
        return (self.dense, self.experts)

    # What memory reports and the planner read (training/memory_report.py, planner/dry_run.py): both parts'.
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
        """The dense part's parameter storage (its stage-3 gatherer is the one the planner reads)."""
        return self.dense.parameters

    def step_working_bytes(self, gather_copy_bytes: int = 0, norm_in_blocks: bool = False) -> int:
        return max(part.step_working_bytes(gather_copy_bytes, norm_in_blocks) for part in self.parts)

    def grad_norm_squared(self, grads: list[torch.Tensor]) -> torch.Tensor:
        """The squared norm over both parts' partition gradients `grads` (dense, experts) and every stage (module
        docstring): the stages sum once, whichever of them hold experts."""
        dense = self.dense.stage_grad_norm_squared(grads[0])
        experts = self.experts.stage_grad_norm_squared(grads[1])
        self.comm.all_reduce(experts, self.expert_parallel_group, "ep")
        total = dense + experts
        self.comm.all_reduce(total, self.pipeline_group, "pp")
        return total

    def step_collectives_only(self) -> None:
        """`step`'s collectives without its arithmetic (the dry run's step, planner/dry_run.py): the norm's and
        both publishes."""
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
    """What the training loop needs from ZeRO (as ZeroParts: reducer, optimizer.step, loss scaling), over a model
    with expert parameters; `dense` and `experts` are the two ZeroParts it drives."""

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
    """build_zero for a model some of whose parameters are experts (module docstring); the
    keyword arguments are build_zero's (`own_units` and `decoupled_lr_params`, never experts, go to the dense
    part only). A model without experts (a pipeline stage of dense layers) takes build_zero (module docstring)."""
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
        # Each part set the malloc threshold to its own smallest weight (zero/apply.py), the experts' last: an
        # expert's matrix, larger than the dense part's smallest (the router's), so freed activations below it
        # stayed in glibc's heap (an EP 2 run peaked 1.17x its plan). The model's smallest, as zero/host_memory.py
        # means it.
        itemsize = dense.optimizer.parameters.dtype.itemsize
        return_freed_blocks_to_system(min((param.numel() * itemsize for param in model.parameters()
                                           if param.requires_grad and param.dim() >= 2), default=0))
    return ExpertZeroParts(dense, experts, state)
