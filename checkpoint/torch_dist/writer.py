"""`--ckpt-format torch_dist`: --save writes Megatron-LM's distributed checkpoint (a DCP save, common.pt, metadata.json)
with Megatron-Core's keys and the optimizer layout its run builds from the same flags, so Megatron-LM resumes it. Each
rank writes its own partition's regions; random states are not written (Megatron-LM starts from --seed).
"""

from __future__ import annotations

import io
import json
import shutil
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType

from base.errors import CheckpointError
from checkpoint.finite_check import non_finite_training_state
from checkpoint.format import (
    METADATA_FILE,
    STAGING_SUFFIX,
    TRACKER_FILE,
    iteration_dir_name,
    remove_stale_saves,
    replace_directory,
    write_text_atomic,
)
from checkpoint.global_load import parameter_records
from checkpoint.integrity import file_digest
from checkpoint.regions import box_numel, flat_range_boxes, flat_start, shift
from checkpoint.router_state import expert_biases
from checkpoint.save_plan import coordinates, named_fragments
from checkpoint.torch_dist.args import megatron_args
from checkpoint.torch_dist.common import (
    COMMON_FILE,
    FILE_DIGESTS_KEY,
    INDEX_DIGEST_KEY,
    TORCH_DIST_BACKEND,
    index_digest,
)
from checkpoint.torch_dist.dcp_failures import DCP_FAILURES, failure_line, os_cause
from checkpoint.torch_dist.grad_scaler import GRAD_SCALER, megatron_grad_scaler
from checkpoint.torch_dist.names import (
    EXPERT_BIAS,
    EXPERTS,
    LAYERS,
    MOE_NORM_ALIASES,
    MTP_INNER,
    MTP_LAYERS,
    MTP_TRANSFORMER,
    OUR_MTP_LAYERS,
    GdnHeads,
    hybrid_layer,
    hybrid_layer_symbols,
    hybrid_megatron_placement,
    megatron_placement,
    split_gdn_parts,
)
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer

CHECKPOINT_VERSION = 3.0  # generate_state_dict
FULLY_RESHARDABLE = "fully_reshardable"
BACKEND_CONFIG = {"sharded_backend": TORCH_DIST_BACKEND, "sharded_backend_version": 1, "common_backend": "torch",
                  "common_backend_version": 1}
# Local-spec linears whose sharded state holds an `_extra_state` object per layer (None for them).
ATTENTION_EXTRA_STATE_MODULES = ("self_attention.linear_proj", "self_attention.linear_qkv")
MAMBA_EXTRA_STATE_MODULES = ("mixer.in_proj", "mixer.out_proj")
GDN_EXTRA_STATE_MODULES = ("self_attention.in_proj", "self_attention.out_proj")
EXTRA_STATE_MODULES = ATTENTION_EXTRA_STATE_MODULES + ("mlp.linear_fc1", "mlp.linear_fc2")
EXPERT_EXTRA_STATE_MODULES = ("linear_fc1", "linear_fc2")  # an MoE layer's: each SequentialMLP expert's
SHARED_EXPERT_EXTRA_STATE_MODULES = ("mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2")
MLA_EXTRA_STATE_MODULES = {
    False: ("self_attention.linear_proj", "self_attention.linear_q_proj", "self_attention.linear_kv_down_proj",
            "self_attention.linear_kv_up_proj"),
    True: ("self_attention.linear_proj", "self_attention.linear_q_down_proj", "self_attention.linear_q_up_proj",
           "self_attention.linear_kv_down_proj", "self_attention.linear_kv_up_proj")}


class _Planner(DefaultSavePlanner):
    """DCP's default planner over this rank's chunks and objects (objects saved as Megatron-Core's ShardedObject:
    torch.save([data]))."""

    def __init__(self, tensors: dict, shapes: dict, objects: dict) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.chunks, self.shapes, self.objects = tensors, shapes, objects

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        self._data = {}
        for key, pieces in self.chunks.items():
            for offsets, values in pieces:
                self._data[MetadataIndex(key, torch.Size(offsets))] = values
        for key, data in self.objects.items():
            self._data[MetadataIndex(key)] = data

    def create_local_plan(self) -> SavePlan:
        items = []
        for index, data in self._data.items():
            if isinstance(data, torch.Tensor):
                size, dtype = self.shapes[index.fqn]
                items.append(WriteItem(index=index, type=WriteItemType.SHARD, tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=index.offset, sizes=data.size()),
                    properties=TensorProperties(dtype=dtype), size=torch.Size(size))))
            else:
                items.append(WriteItem(index=index, type=WriteItemType.BYTE_IO))
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem):
        data = self._data[write_item.index]
        if isinstance(data, torch.Tensor):
            return data
        buffer = io.BytesIO()
        torch.save([data], buffer)
        return buffer


def _state_keys(shard, distributed: bool, param_dtype: torch.dtype) -> dict[str, str]:
    """The DCP key prefix of each state this save writes -> the partition tensor it comes from."""
    keys = {"": "master"}  # the model weights, the master rounded to the training dtype (what the model holds)
    if distributed:
        keys["optimizer.state.param."] = "master"
    elif param_dtype != torch.float32:
        keys["optimizer.state.fp32_param."] = "master"
    keys.update({f"optimizer.state.{moment}.": moment for moment in ("exp_avg", "exp_avg_sq")})
    return keys


def _chunks(model, optimizer: CheckpointableOptimizer, shard, config, state: ParallelState
            ) -> tuple[dict, dict]:
    """This rank's chunks of every Megatron tensor, and each tensor's global shape and dtype."""
    records = parameter_records(model)
    distributed = config.zero.stage >= 1
    param_dtype = shard.param_dtype
    tensors: dict[str, list] = defaultdict(list)
    shapes: dict[str, tuple] = {}
    # Each element once, by the first replica of its optimizer state.
    for fragment in named_fragments(shard, records, coordinates(state)):
        _, record = records[fragment.name]
        placed = _placements(fragment.name, record.global_shape, config)
        if placed is None:
            raise CheckpointError(f"{fragment.name}: Megatron-Core's torch_dist layout has no place for it")
        for box in flat_range_boxes(record.local_shape, fragment.param_offset,
                                    fragment.param_offset + fragment.numel):
            at = fragment.partition_offset + flat_start(record.local_shape, box) - fragment.param_offset
            region = shift(box, record.global_offset)
            numel, ours = box_numel(region), [part.stop - part.start for part in region]
            for placement, global_shape in placed:
                keys = (placement.key, *_norm_aliases(placement.key, config))
                for theirs, within in placement.pieces(region):
                    offsets = tuple(part.start for part in theirs)
                    sizes = [part.stop - part.start for part in theirs]
                    for prefix, source in _state_keys(shard, distributed, param_dtype).items():
                        dtype = param_dtype if prefix == "" else torch.float32
                        values = shard.tensors[source][at:at + numel].to(dtype).reshape(ours)[within]
                        values = values.reshape(sizes).clone()
                        for key in keys:
                            tensors[prefix + key].append((offsets, values))
                            shapes[prefix + key] = (global_shape, dtype)
    _expert_bias_chunks(model, config, state, tensors, shapes)
    # Every rank plans every shape: DCP's global plan takes each key's metadata from its writers.
    return dict(tensors), shapes


def _pattern(config) -> Optional[str]:
    """The run's --hybrid-layer-pattern (saves then take HybridModel's layout); None for GPTModel's."""
    return config.model.hybrid_layer_pattern


def _placement(name: str, shape, config):
    """Where our tensor `name` goes (a Gated DeltaNet part whole, before _placements splits it)."""
    if _pattern(config):
        return hybrid_megatron_placement(name, shape, _pattern(config), _experts_per_layer(config))
    return megatron_placement(name, shape, config.model.num_layers, _experts_per_layer(config), _per_layer(config),
                              config.model.mla.multi_latent_attention, _gdn_layers(config))


def _placements(name: str, shape, config):
    """Each Megatron-Core tensor holding a part of our tensor `name`, with its global shape; None where none does."""
    placed = _placement(name, shape, config)
    return None if placed is None else split_gdn_parts(*placed, GdnHeads.of(config.model.gdn))


def _gdn_layers(config) -> frozenset[int]:
    """The GPT path's Gated DeltaNet layers (--experimental-attention-variant gated_delta_net)."""
    model = config.model
    if model.hybrid_layer_pattern or not model.gdn.gated_delta_net:
        return frozenset()
    return frozenset(layer for layer, gdn in enumerate(model.gdn.gdn_layers(model.num_layers)) if gdn)


def _mtp_is_moe(config) -> bool:
    """Whether the MTP transformer layer is MoE: Megatron-Core builds it as the last decoder layer's kind."""
    return bool(config.model.mtp.num_layers) and config.model.moe is not None and config.model.moe_layers()[-1]


def _norm_aliases(key: str, config) -> tuple[str, ...]:
    """The other names an MoE layer's pre-MLP norm is written under (MOE_NORM_ALIASES)."""
    if not _experts_per_layer(config) or _pattern(config):  # HybridModel's own layout names the norm once
        return ()
    if key in MOE_NORM_ALIASES:
        return (MOE_NORM_ALIASES[key],)
    if key.startswith(MTP_LAYERS) and _mtp_is_moe(config):
        for fused, own in MOE_NORM_ALIASES.items():
            if key.endswith(f".{MTP_TRANSFORMER}{fused[len(LAYERS):]}"):
                return (key[:-len(fused) + len(LAYERS)] + own[len(LAYERS):],)
    return ()


def _expert_bias_chunks(model, config, state: ParallelState, tensors: dict, shapes: dict) -> None:
    """The routers' expert bias, [layers, experts] fp32: a row per router of this stage, written by its first replica.
    """
    if config.model.moe is None or not config.model.moe.router_enable_expert_bias or state.data_parallel_rank \
            or state.tensor_parallel_rank or state.context_parallel_rank:
        return
    experts = _experts_per_layer(config)
    for name, values in expert_biases(model).items():
        layer = int(name.split(".")[1])  # blocks.<global layer>.mlp.router.expert_bias, or mtp_layers.<k>....
        values = torch.tensor(values, dtype=torch.float32)
        if name.startswith(OUR_MTP_LAYERS):  # an MoE MTP layer's router: its own key, unstacked
            key = f"{MTP_LAYERS}{layer}.{MTP_TRANSFORMER}{EXPERT_BIAS}"
            tensors[key].append(((0,), values))
            shapes[key] = ((experts,), torch.float32)
            continue
        if _pattern(config):  # HybridModel's MoE layer of our block, under its own key
            layer = hybrid_layer(hybrid_layer_symbols(_pattern(config)), layer, attention=False)
            key, offsets, shape = f"{LAYERS}{layer}.{EXPERT_BIAS}", (0,), (experts,)
        elif _per_layer(config):
            key, offsets, shape = f"{LAYERS}{layer}.{EXPERT_BIAS}", (0,), (experts,)
        else:
            key, offsets, shape, values = f"{LAYERS}{EXPERT_BIAS}", (layer, 0), (config.model.num_layers, experts), \
                values.reshape(1, -1)
        tensors[key].append((offsets, values))
        shapes[key] = (shape, torch.float32)


def _experts_per_layer(config) -> Optional[int]:
    """Every MoE layer's expert count, or None for a dense model."""
    return config.model.moe.num_experts if config.model.moe is not None else None


def _per_layer(config) -> bool:
    """Whether Megatron-Core saves each layer under its own key (non_homogeneous_layers): an --moe-layer-freq list or
    |freq| > 1 (Megatron-Core's own `> 1` would stack a negative pattern's mixed layers)."""
    freq, gdn = config.model.experts.layer_freq, config.model.gdn
    # Or an attention/Gated DeltaNet mix under --linear-attention-freq.
    return config.model.moe is not None and (isinstance(freq, str) or abs(freq) > 1) or gdn.gated_delta_net and (
        isinstance(gdn.linear_attention_freq, str) or (gdn.linear_attention_freq or 1) > 1)


def _extra_states(model, config, state: ParallelState) -> dict[str, None]:
    """The `_extra_state` object of each local-spec linear of this stage's layers, written by the first replica of the
    experts held."""
    names = parameter_records(model)
    layers = sorted({int(name.split(".")[1]) for name in names if name.startswith("blocks.")})
    total, experts, per_layer = config.model.num_layers, _experts_per_layer(config), _per_layer(config)
    mla = config.model.mla
    attention = MLA_EXTRA_STATE_MODULES[mla.q_lora_rank is not None] if mla.multi_latent_attention else \
        ATTENTION_EXTRA_STATE_MODULES
    dense_mlp = EXTRA_STATE_MODULES[len(ATTENTION_EXTRA_STATE_MODULES):]
    shared = SHARED_EXPERT_EXTRA_STATE_MODULES if config.model.experts.shared_expert_intermediate_size else ()
    moe_layers = config.model.moe_layers()
    first_replica = not (state.tensor_parallel_rank or state.data_parallel_rank or state.context_parallel_rank)
    if _pattern(config):  # each mixer's own linears: a `*` layer's attention, a `+` layer's MLA, `M`'s, `G`'s
        mixers = {"*": ATTENTION_EXTRA_STATE_MODULES, "+": MLA_EXTRA_STATE_MODULES[mla.q_lora_rank is not None],
                  "M": MAMBA_EXTRA_STATE_MODULES, "G": GDN_EXTRA_STATE_MODULES}
        return _hybrid_extra_states(names, config, state, mixers, dense_mlp, shared, first_replica)
    objects, gdn_layers = {}, _gdn_layers(config)
    if first_replica:
        for layer in layers:
            mixer = GDN_EXTRA_STATE_MODULES if layer in gdn_layers else attention
            modules = mixer + (shared if moe_layers[layer] else dense_mlp)
            objects.update({f"{LAYERS}{layer}.{module}._extra_state/shard_0_1" if per_layer else
                            f"{LAYERS}{module}._extra_state/shard_{layer}_{total}": None for module in modules})
        # MTP layers: one unstacked ShardedObject each, their transformer layer as the last decoder layer's kind.
        mtp_mlp = shared if _mtp_is_moe(config) else dense_mlp
        for mtp_layer in sorted({int(name.split(".")[1]) for name in names if name.startswith(OUR_MTP_LAYERS)}):
            for module in ("eh_proj", *(f"{MTP_TRANSFORMER}{module}" for module in attention + mtp_mlp)):
                objects[f"{MTP_LAYERS}{mtp_layer}.{module}._extra_state/shard_0_1"] = None
    if experts is None or state.experts.tensor_rank or state.experts.data_rank or state.context_parallel_rank:
        return objects
    held = {tuple(int(part) for part in name.split(".")[1:5:3]) for name in names
            if name.startswith("blocks.") and name.split(".")[2:4] == ["mlp", "experts"]}
    for layer, expert in sorted(held):
        for module in EXPERT_EXTRA_STATE_MODULES:
            objects[f"{LAYERS}{layer}.{EXPERTS}{module}._extra_state/shard_{expert}_{experts}" if per_layer else
                    f"{LAYERS}{EXPERTS}{module}._extra_state/shard_{layer}.{expert}_{total}.{experts}"] = None
    mtp_held = {(int(parts[1]), int(parts[5])) for parts in (name.split(".") for name in names)
                if parts[0] == OUR_MTP_LAYERS[:-1] and parts[2:5] == [MTP_TRANSFORMER[:-1], "mlp", "experts"]}
    for mtp_layer, expert in sorted(mtp_held):
        for module in EXPERT_EXTRA_STATE_MODULES:
            objects[f"{MTP_LAYERS}{mtp_layer}.{MTP_TRANSFORMER}{EXPERTS}{module}._extra_state/"
                    f"shard_{expert}_{experts}"] = None
    return objects


def _hybrid_extra_states(names, config, state: ParallelState, mixers, dense_mlp, shared, first_replica: bool
                         ) -> dict[str, None]:
    """HybridModel's `_extra_state` objects, one ShardedObject per linear under its own layer's key."""
    pattern = _pattern(config)
    symbols, mtp_parts = hybrid_layer_symbols(pattern), pattern.split("/")[1:]
    experts = _experts_per_layer(config)
    objects = {}
    blocks = sorted({int(name.split(".")[1]) for name in names if name.startswith("blocks.")})
    if first_replica:
        for block in blocks:  # a block may lack its mixer or its MLP (`M`, `G` or `-` alone)
            mlp_layer, mixer_layer = (hybrid_layer(symbols, block, attention) for attention in (False, True))
            objects.update({f"{LAYERS}{mixer_layer}.{module}._extra_state/shard_0_1": None
                            for module in (mixers[symbols[mixer_layer]] if mixer_layer is not None else ())})
            objects.update({f"{LAYERS}{mlp_layer}.{module}._extra_state/shard_0_1": None for module in (
                () if mlp_layer is None else shared if symbols[mlp_layer] == "E" else dense_mlp)})
        for depth in sorted({int(name.split(".")[1]) for name in names if name.startswith(OUR_MTP_LAYERS)}):
            inner = f"{MTP_LAYERS}{depth}.{MTP_INNER}"
            objects[f"{MTP_LAYERS}{depth}.eh_proj._extra_state/shard_0_1"] = None
            mixer_layer = hybrid_layer(mtp_parts[depth], 0, attention=True)
            objects.update({f"{inner}{mixer_layer}.{module}._extra_state/shard_0_1": None
                            for module in mixers[mtp_parts[depth][mixer_layer]]})
            objects.update({f"{inner}{hybrid_layer(mtp_parts[depth], 0, attention=False)}.{module}._extra_state/"
                            f"shard_0_1": None for module in dense_mlp})
        if state.is_last_stage:
            objects["output_layer._extra_state/shard_0_1"] = None
    if experts is None or state.experts.tensor_rank or state.experts.data_rank or state.context_parallel_rank:
        return objects
    held = {tuple(int(part) for part in name.split(".")[1:5:3]) for name in names
            if name.startswith("blocks.") and name.split(".")[2:4] == ["mlp", "experts"]}
    for block, expert in sorted(held):
        layer = hybrid_layer(symbols, block, attention=False)
        for module in EXPERT_EXTRA_STATE_MODULES:
            objects[f"{LAYERS}{layer}.{EXPERTS}{module}._extra_state/shard_{expert}_{experts}"] = None
    return objects


def _weight_decay_groups(records, experts: Optional[bool]) -> tuple[float, ...]:
    """The wd_mult of each group Megatron-Core's _get_param_groups makes, for the expert-parallel parameters (`experts`
    True), the others (False) or all (None)."""
    no_decay = [name.endswith(".bias") or len(record.global_shape) == 1 for name, (_, record) in records.items()
                if experts is None or record.is_expert == experts]
    return tuple(wd_mult for wd_mult, present in ((1.0, not all(no_decay)), (0.0, any(no_decay))) if present)


def _param_groups(config, lr: float, step: Optional[int], wd_mults: tuple[float, ...],
                  experts: bool = False) -> list[dict]:
    """Megatron-Core's param groups as torch's AdamW state_dict leaves them, params removed."""
    adam = config.optimizer
    groups = []
    for wd_mult in wd_mults:
        group = {"is_expert_parallel": experts, "default_config": True, "wd_mult": wd_mult, "lr_mult": 1.0,
                 "is_decoupled_lr": False, "max_lr": adam.lr, "min_lr": adam.min_lr, "lr": lr,
                 "betas": (adam.adam_beta1, adam.adam_beta2), "eps": adam.adam_eps,
                 "weight_decay": adam.weight_decay * wd_mult, "amsgrad": False, "maximize": False,
                 "foreach": None, "capturable": False, "differentiable": False, "fused": None,
                 "decoupled_weight_decay": True}
        if step is not None:
            group["step"] = step
        groups.append(group)
    return groups


def scheduler_state(config, batch, schedule_samples: int) -> dict:
    """OptimizerParamScheduler.state_dict as Megatron-LM builds it from the same flags, at this run's position."""
    from arguments.schedule import build_lr_schedule, train_iterations

    schedule = build_lr_schedule(config.optimizer, config.training, config.model.seq_length, batch)
    training = config.training
    wd_steps = training.train_samples if training.train_samples is not None else \
        train_iterations(config.training, batch) * batch.lr_schedule_batch
    weight_decay = config.optimizer.weight_decay
    state = {"max_lr": schedule.max_lr, "lr_warmup_steps": schedule.warmup_samples, "num_steps": schedule_samples,
             "lr_decay_style": schedule.style, "lr_decay_steps": schedule.decay_samples, "min_lr": schedule.min_lr,
             "start_wd": weight_decay, "end_wd": weight_decay, "wd_incr_style": "constant", "wd_incr_steps": wd_steps}
    if schedule.wsd_decay_samples is not None:
        state.update(wsd_decay_steps=schedule.wsd_decay_samples, lr_wsd_decay_style=schedule.wsd_style)
    return state


def _saved_optimizer(config, shard, lr: float, records, experts: Optional[bool]) -> dict:
    """One Megatron-Core optimizer's common.pt state: the plain one's Adam state_dict or the distributed one's param
    groups, with fp16's grad scaler."""
    wd_mults = _weight_decay_groups(records, experts)
    if config.zero.stage >= 1:
        saved = {"optimizer": {"param_groups": _param_groups(config, lr, shard.adam_step, wd_mults, bool(experts))},
                 "param_state_sharding_type": FULLY_RESHARDABLE}
    else:
        saved = {"state": {"common_step": torch.tensor(float(shard.adam_step))},
                 "param_groups": _param_groups(config, lr, None, wd_mults, bool(experts))}
        if shard.param_dtype != torch.float32:
            # A 16-bit run's Float16OptimizerWithFloat16Params keeps Adam one level down, where Megatron-LM's bf16 load
            # looks.
            saved = {"optimizer": saved}
    if config.training.precision == "fp16":  # Megatron-Core's 16-bit optimizers keep the grad scaler's state beside Adam's
        saved[GRAD_SCALER] = megatron_grad_scaler(shard.loss_scaler_type, shard.loss_scaler_state)
    return saved


def _common(config, state, shard, records, iteration, consumed_samples, lr, batch, schedule_samples) -> dict:
    content = {"distrib_optim_sharding_type": FULLY_RESHARDABLE,
               "distrib_optim_fully_reshardable_mem_efficient": False} if config.zero.stage >= 1 else {}
    if _experts_per_layer(config) is not None and config.parallel.expert_model_parallel_size > 1:
        # A ChainedOptimizer (dense, then expert-parallel) as {index: each one's}; at EP 1 the experts are not
        # expert-parallel.
        saved_optimizer = {index: _saved_optimizer(config, shard, lr, records, experts)
                           for index, experts in enumerate((False, True))}
    else:
        saved_optimizer = _saved_optimizer(config, shard, lr, records, None)
    content.update(singleton_local_shards=False, chained_optim_avoid_prefix=True)
    return {"args": megatron_args(config, state, iteration, consumed_samples), "checkpoint_version": CHECKPOINT_VERSION,
            "iteration": iteration, "optimizer": saved_optimizer,
            "opt_param_scheduler": scheduler_state(config, batch, schedule_samples),
            "num_floating_point_operations_so_far": 0, "content_metadata": content}


def _raise_if_any(state: ParallelState, problem: Optional[str], staging: Path) -> None:
    problems = [p for p in state.comm.all_gather_object(problem) if p]
    if problems:
        if state.is_first_rank:
            shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(problems[0])


def saving_mode_line(config, rerun_validates: bool) -> str:
    """The start-up line of a run that saves in this layout: what it does not hold."""
    line = ("> checkpoints: saved synchronously in Megatron-LM's torch_dist layout"
            + (" (--async-save writes this project's format only)" if config.checkpoint.async_save else ""))
    if config.model.fp8.enabled and config.model.fp8.recipe == "delayed":
        line += ("; without delayed FP8 scaling's amax histories (TransformerEngine's _extra_state): a resume from "
                 "these starts them fresh at scale 1, said again at the load")
    if rerun_validates:
        line += ("; without the rerun state machine's state: a job resumed from the checkpoint of an exit 16 trains "
                 "that iteration afresh instead of re-running it to decide")
    return line


def save_megatron_checkpoint(save_dir: str | Path, iteration: int, consumed_samples: int, model,
                             optimizer: CheckpointableOptimizer, config, state: ParallelState, batch, *, lr: float,
                             schedule_samples: Optional[int] = None) -> Path:
    """Write iteration `iteration` in Megatron-LM's torch_dist layout and name it in the tracker; every rank calls this.
    """
    save_dir = Path(save_dir)
    final = save_dir / iteration_dir_name(iteration)
    staging = final.with_name(final.name + STAGING_SUFFIX)
    if state.is_first_rank:
        print(f" saving Megatron-LM torch_dist checkpoint at iteration {iteration} to {final} (its random states "
              f"are not written: Megatron-LM starts its streams from --seed)", flush=True)
    shard = optimizer.sharded_state_dict(model)
    _raise_if_any(state, non_finite_training_state(shard), staging)
    problem, mine = None, {}
    if state.is_first_rank:
        try:
            save_dir.mkdir(parents=True, exist_ok=True)
            remove_stale_saves(save_dir)  # what killed saves left (.partial folders, pointers' temporaries)
            staging.mkdir()
        except OSError as failure:
            problem = f"cannot create {staging}: {failure}"
    _raise_if_any(state, problem, staging)
    try:  # Planned before DCP's collectives: a rank that cannot plan must not leave them waiting.
        tensors, shapes = _chunks(model, optimizer, shard, config, state)
        objects = _extra_states(model, config, state)
    except CheckpointError as failure:
        problem = f"cannot write {staging}: {failure}"
    _raise_if_any(state, problem, staging)
    try:
        distributed = dist.is_available() and dist.is_initialized() and state.world_size > 1
        with warnings.catch_warnings():  # "torch.distributed is disabled ... save in a single process": yes
            warnings.simplefilter("ignore", UserWarning)
            dcp.save({}, storage_writer=dcp.FileSystemWriter(staging), planner=_Planner(tensors, shapes, objects),
                     no_dist=not distributed)
        del tensors
        # Each rank digests its own .distcp files from the page cache; the first rank records them all in common.pt.
        mine = {path.name: file_digest(path, "sha256") for path in sorted(staging.glob(f"__{state.rank}_*.distcp"))}
    except DCP_FAILURES as failure:  # disk full, DCP's own errors (BaseException-derived): every rank must hear
        problem = f"cannot write {staging}: {failure_line(failure)}{os_cause(failure, staging)}"
    _raise_if_any(state, problem, staging)
    digests = {name: digest for part in state.comm.all_gather_object(mine) for name, digest in part.items()}
    if state.is_first_rank:
        try:
            with open(staging / COMMON_FILE, "wb") as file:
                common = _common(config, state, shard, parameter_records(model), iteration, consumed_samples, lr,
                                 batch, consumed_samples if schedule_samples is None else schedule_samples)
                torch.save({**common, INDEX_DIGEST_KEY: index_digest(staging), FILE_DIGESTS_KEY: digests}, file)
            (staging / METADATA_FILE).write_text(json.dumps(BACKEND_CONFIG))
            replace_directory(staging, final)
            write_text_atomic(save_dir / TRACKER_FILE, str(iteration))
        except Exception as failure:  # noqa: BLE001 - as above
            problem = f"cannot commit {staging}: {failure}"
    _raise_if_any(state, problem, staging)
    if state.is_first_rank:
        size = sum(path.stat().st_size for path in final.iterdir() if path.is_file())
        print(f" saved Megatron-LM torch_dist checkpoint {final} ({size / 2**20:.1f} MiB)", flush=True)
    return final

