"""`apply_zero`: ZeRO data parallelism applied to a plain model. The stage is decided here, once, by which storages the
model states get (replicated or sharded parameters, full or partitioned gradients); nothing downstream tests it. A
meta-built model is never held whole: each rank fills only its own storage."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn

from parallel.init import ParameterInitializer
from zero.flat_buffer import DEFAULT_ALIGNMENT, FlatLayout, bucket_params, unique_trainable_parameters
from zero.grad_reducer import FullGradients, GradientReducer, PartitionedGradients
from zero.host_memory import return_freed_blocks_to_system
from zero.hybrid_offload import HybridDeviceAdamW, host_cut, split_zeros
from zero.loss_scaler import LossScaler, build_loss_scaler
from zero.muon import muon_matrices, takes_muon
from zero.offload import HOST, HostOffloadedAdamW, OffloadSettings, host_zeros
from zero.optimizer import PRECISION_DTYPES, ShardedAdamW, decoupled_ranges, uses_muon
from zero.param_storage import (
    InitializerSource,
    ParameterStorage,
    ReplicatedParameters,
    ShardedParameters,
    TensorSource,
    ValueSource,
)
from zero.placement import Placement, placement_of
from zero.stage3 import stage3_unit_params


@dataclass
class ZeroParts:
    """What the training loop and the checkpoint code need from ZeRO."""
    reducer: GradientReducer
    optimizer: ShardedAdamW
    placement: Placement = Placement()

    @property
    def loss_scaler(self) -> LossScaler:
        return self.optimizer.loss_scaler

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on: times the fp16 loss scale."""
        scale = self.optimizer.loss_scaler.scale
        return loss * scale if scale != 1.0 else loss


def apply_zero(model: nn.Module, config, state, blocks: Optional[Sequence[nn.Module]] = None,
               own_units: Sequence[nn.Parameter] = (),
               decoupled_lr_params: Sequence[nn.Parameter] = (), build=None,
               muon_excluded_params: Sequence[nn.Parameter] = (), fp8_gathered: Optional[dict] = None) -> ZeroParts:
    """ZeRO as a resolved PretrainConfig asks for; `build`: build_zero or build_zero_with_experts."""
    build = build or build_zero
    training = config.training
    precision = training.mixed_precision
    scaler = build_loss_scaler(precision.fp16, precision.loss_scale, precision.initial_loss_scale,
                               precision.loss_scale_window, precision.hysteresis, precision.min_loss_scale)
    settings = dict(param_dtype=PRECISION_DTYPES[training.precision],
                    grad_dtype=PRECISION_DTYPES[training.gradient_precision], loss_scaler=scaler,
                    seed=training.seed, blocks=blocks, own_units=own_units, decoupled_lr_params=decoupled_lr_params)
    if config.optimizer.optimizer == "muon":
        settings["muon_excluded_params"] = muon_excluded_params
    if fp8_gathered:
        settings["fp8_gathered"] = fp8_gathered
    return build(model, config.zero, config.optimizer, state, **settings)


def build_zero(model: nn.Module, zero_config, optimizer_config, state, *, param_dtype: torch.dtype = torch.float32,
               grad_dtype: Optional[torch.dtype] = None, loss_scaler: Optional[LossScaler] = None,
               seed: Optional[int] = None, blocks: Optional[Sequence[nn.Module]] = None,
               alignment: int = DEFAULT_ALIGNMENT, own_units: Sequence[nn.Parameter] = (),
               decoupled_lr_params: Sequence[nn.Parameter] = (),
               gradient_divisor: Optional[int] = None,
               muon_excluded_params: Sequence[nn.Parameter] = (), fp8_gathered: Optional[dict] = None) -> ZeroParts:
    """The explicit form of `apply_zero`. `own_units`: units alone, last, so a tied embedding's shards line up across
    stages. `gradient_divisor`: default the DP size. `fp8_gathered`: FP8 weights gathered as bytes."""
    stage = zero_config.stage
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, not {stage}")
    instances = getattr(zero_config, "distributed_optimizer_instances", 1)
    if instances != state.optimizer_instances.count:  # the groups are the grid's, built by initialize()
        raise ValueError(f"--num-distributed-optimizer-instances {instances}, but the process grid was built "
                         f"with {state.optimizer_instances.count}: pass it to parallel.state.initialize()")
    grad_dtype = grad_dtype or param_dtype
    params = unique_trainable_parameters(model)
    if not params:
        raise ValueError("the model has no trainable parameters")
    source = _value_source(model, params, state, seed)
    device = state.device

    modules: list[nn.Module] = []
    fp8_gathered = fp8_gathered or {}
    if fp8_gathered and stage == 0:  # gpt/fp8.py's check_fp8 refuses it first
        raise ValueError("--fp8-param-gather needs sharded parameters (ZeRO stage 1-3)")
    if stage == 3:
        unit_params, modules = stage3_unit_params(model, blocks, frozenset(fp8_gathered))
    else:
        alone = {id(param) for param in own_units}
        # --fp8-param-gather: the FP8 weights in buckets of their own
        unit_params = bucket_params([p for p in params if id(p) not in alone and id(p) not in fp8_gathered],
                                    zero_config.reduce_bucket_size)
        unit_params += bucket_params([p for p in params if id(p) not in alone and id(p) in fp8_gathered],
                                     zero_config.reduce_bucket_size)
        unit_params += [[param] for param in own_units]
    # cut over DP x CP (Megatron's "dp-cp"), or within this rank's optimizer instance
    partition_group = state.partition_group if stage >= 1 else None
    parts, part = (state.partition_size, state.partition_rank) if stage >= 1 else (1, 0)
    replica_group = state.partition_replica_group if stage >= 1 else None
    layout = FlatLayout(unit_params, parts, part, alignment)
    placement = placement_of(zero_config)

    storage: ParameterStorage
    if stage == 3:
        storage = ShardedParameters(layout, param_dtype, device, state.comm, partition_group, zero_config, modules,
                                    placement, fp8_gathered)
    else:
        storage = ReplicatedParameters(layout, param_dtype, device, state.comm, partition_group,
                                       zero_config.allgather_bucket_size, zero_config.overlap_param_gather,
                                       fp8_gathered)
    if device.type == "cpu":  # else glibc's heap keeps the large blocks every iteration frees
        weights = [p.numel() * param_dtype.itemsize for p in params if p.dim() >= 2]
        return_freed_blocks_to_system(min(weights, default=0))
    offload = OffloadSettings(placement.pin_memory, zero_config.sub_group_size) if placement.optimizer_on_host \
        else None
    if offload is not None:
        master = host_zeros(layout.partition_numel, offload.pins, device if device.type == "meta" else HOST)
    elif placement.optimizer_split:
        master = split_zeros(layout.partition_numel, host_cut(layout, placement.optimizer_host_fraction),
                             placement.pins, device)
    else:
        master = torch.zeros(layout.partition_numel, dtype=torch.float32, device=device)  # padding stays 0
    if device.type != "meta":  # a planner's rank has shapes only
        storage.fill(source, master)
    decoupled = decoupled_ranges(layout, decoupled_lr_params)  # before bind replaces the parameters
    muon = []
    if uses_muon(optimizer_config):  # also before bind
        excluded = {id(param) for param in muon_excluded_params}
        muon = muon_matrices(layout, [param for param in params if takes_muon(param, excluded)])
    layout = storage.bind(model)

    scatter = stage >= 1 and zero_config.reduce_scatter
    # Offloaded, reduced gradients go to the host as each reduction completes (16-bit ones accumulate in their own
    # buffer).
    host = device if device.type == "meta" else HOST
    host_fp32 = None if offload is None else host_zeros(layout.partition_numel, offload.pins, host)
    reducer: GradientReducer
    if stage >= 2:
        accumulated = host_fp32 if host_fp32 is None or grad_dtype == torch.float32 else \
            host_zeros(layout.partition_numel, offload.pins, host, grad_dtype)
        reducer = PartitionedGradients(layout, grad_dtype, state.comm, partition_group,
                                       gradient_divisor or state.data_context_parallel_size, scatter,
                                       zero_config.overlap_comm, device, accumulated, host_fp32,
                                       replica_group=replica_group)
    else:
        reducer = FullGradients(layout, param_dtype, grad_dtype, state.comm,
                                partition_group if stage >= 1 else state.data_context_parallel_group,
                                gradient_divisor or state.data_context_parallel_size, scatter, zero_config.overlap_comm,
                                device, host_fp32,
                                replica_group=replica_group)
    reducer.attach()
    if isinstance(storage, ShardedParameters):
        reducer.subscribe(storage.gatherer)
    reducer.zero_grad()
    optimizer_args = (layout, master, reducer, storage, optimizer_config, loss_scaler or LossScaler(1.0), state,
                      partition_group, stage, decoupled, muon)
    optimizer: ShardedAdamW
    if offload is not None:
        optimizer = HostOffloadedAdamW(*optimizer_args, offload=offload)
    elif placement.optimizer_split:  # its gradient partition stays on the device, as Megatron-LM's
        optimizer = HybridDeviceAdamW(*optimizer_args, pin_memory=placement.pin_memory)
    else:
        optimizer = ShardedAdamW(*optimizer_args)
    return ZeroParts(reducer, optimizer, placement)


def _value_source(model: nn.Module, params: list[nn.Parameter], state, seed: Optional[int]) -> ValueSource:
    """Initial values: the counter-based initializer for a meta-built model, else its tensors."""
    on_meta = [p.device.type == "meta" for p in params]
    if all(on_meta):
        if seed is None:
            raise ValueError("the model is on the meta device: pass the seed its values are drawn from")
        names = {id(param): name for name, param in model.named_parameters()}
        initializer = ParameterInitializer(seed)
        return InitializerSource(initializer, names)
    if any(on_meta):
        raise ValueError("some parameters are on the meta device and some are not: build the model on one")
    for param in params:
        if param.device != state.device:
            raise ValueError(f"parameters must be on {state.device} before ZeRO takes the model over; "
                             f"found one on {param.device}")
    return TensorSource()
