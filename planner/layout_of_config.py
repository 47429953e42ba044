"""A launch's flags as the layout model's Layout, so the dry run (`dry-run --hardware P`) and the layout search give one
layout one step time. `trainer` decides what a few flags are worth: pretrain_gpt.py prices the Megatron-LM flags it
accepts with no effect as nothing, megatron-lm prices them as Megatron with Transformer Engine runs them."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from arguments.config import ConfigError
from arguments.training_config import TrainingConfig
from gpt.model_config import ModelConfig
from parallel.config import ParallelismConfig
from planner.layout_ep import DISPATCHERS
from planner.layout_perf import Layout, ModelCounts
from training.build import config_stage_layers
from zero.config import ActivationCheckpointConfig, ZeroConfig

PRETRAIN_GPT, MEGATRON_LM = "pretrain_gpt.py", "megatron-lm"
TRAINERS = (PRETRAIN_GPT, MEGATRON_LM)


def stage_counts_of(model: ModelConfig, parallel: ParallelismConfig) -> Optional[tuple[tuple[int, ...], ...]]:
    """[pipeline rank][model chunk] -> the layers the build gives it; None without stages."""
    pp = parallel.pipeline_model_parallel_size
    if pp == 1:
        return None
    return tuple(tuple(len(chunk) for chunk in config_stage_layers(model, parallel, rank).chunks) for rank in range(pp))


def precision_of(model: ModelConfig, training: TrainingConfig) -> Optional[str]:
    """The layout model's precision: fp8, bf16 for 16-bit training (fp16 runs at the same peak), None for fp32."""
    if model.fp8.enabled:
        return "fp8"
    return None if training.precision == "fp32" else "bf16"


def _recompute_fraction(activations: ActivationCheckpointConfig, model: ModelConfig, counts: ModelCounts, stage_counts,
                        megatron: bool) -> float:
    """Of the blocks' forward GEMMs, the share recomputed in backward."""
    if activations.checkpoint_activations and activations.recompute_method == "block":
        chunk_layers = min(layers for rank in (stage_counts or ((model.num_layers,),)) for layers in rank)
        return min(1.0, activations.checkpoint_num_layers / max(chunk_layers, 1))
    if activations.checkpoint_activations:
        return 1.0
    if not megatron:
        return 0.0  # selective recompute here keeps nothing more than flash attention does (arguments/megatron/flags.py)
    # Megatron's selective modules that recompute GEMMs: "mlp" (dense layers only) and "mla_up_proj"
    recomputed = {"mlp": counts.dense_mlp_flops_per_token, "mla_up_proj": counts.mla_up_flops_per_token}
    modules = model.recompute.modules  # empty unless --recompute-granularity selective, as Megatron reads it
    return sum(recomputed.get(name, 0.0) for name in modules) / \
        (counts.blocks_flops_per_token - counts.attention_flops_per_token)


def _dispatcher(parallel: ParallelismConfig, megatron: bool) -> str:
    if parallel.moe_token_dispatcher_type != "flex":
        return parallel.moe_token_dispatcher_type
    if not megatron:
        return "alltoall"  # this trainer runs flex as alltoall
    if parallel.flex_backend not in DISPATCHERS:
        raise ConfigError(f"--moe-flex-dispatcher-backend {parallel.flex_backend}: the layout model prices "
                          f"{', '.join(DISPATCHERS)}", flags=("--moe-flex-dispatcher-backend",))
    return parallel.flex_backend


def check_expert_tp(model: ModelConfig, parallel: ParallelismConfig, tp: int) -> None:
    """Refuse an MoE run whose expert TP is not 1: the layout model prices the experts split by EP alone, as
    Megatron-Bridge's MoE recipes run them."""
    expert_tp = parallel.expert_tensor_parallel_size or tp
    if model.moe is not None and expert_tp != 1:
        raise ConfigError(f"expert tensor-parallel size {expert_tp} (--expert-tensor-parallel-size, default the TP "
                          f"size): the layout model prices expert TP 1, as Megatron-Bridge's MoE recipes run it; "
                          f"give --expert-tensor-parallel-size 1", flags=("--expert-tensor-parallel-size",))


def layout_of_config(model: ModelConfig, parallel: ParallelismConfig, training: TrainingConfig, zero: ZeroConfig,
                     activations: ActivationCheckpointConfig, gpus: int, counts: ModelCounts, trainer: str = PRETRAIN_GPT,
                     megatron_flags: Optional[Mapping[str, Any]] = None) -> Layout:
    """`config` on `gpus` GPUs as `trainer` runs it. `megatron_flags`: the Megatron-LM flags given that this trainer
    accepts with no effect."""
    if trainer not in TRAINERS:
        raise ConfigError(f"--trainer {trainer}: one of {', '.join(TRAINERS)}")
    megatron, flags = trainer == MEGATRON_LM, megatron_flags or {}
    tp = parallel.tensor_model_parallel_size
    check_expert_tp(model, parallel, tp)
    precision = "fp8" if precision_of(model, training) == "fp8" else "bf16"  # fp32: planner/layout_prediction.py decides
    stage_counts = stage_counts_of(model, parallel)
    stage = zero.stage
    return Layout(
        gpus=gpus, tp=tp, pp=parallel.pipeline_model_parallel_size,
        vp=len(stage_counts[0]) if stage_counts else 1, cp=parallel.context_parallel_size,
        ep=parallel.expert_model_parallel_size, micro_batch_size=training.micro_batch_size,
        global_batch_size=training.global_batch_size, precision=precision,
        recompute_fraction=_recompute_fraction(activations, model, counts, stage_counts, megatron),
        distributed_optimizer=stage >= 1, zero_stage=stage if stage >= 2 else None,
        tp_comm_overlap=megatron and tp > 1 and "--tp-comm-overlap" in flags,
        moe_dispatcher=_dispatcher(parallel, megatron),
        ep_overlap=megatron and "--overlap-moe-expert-parallel-comm" in flags,
        overlap_grad_reduce=zero.overlap_comm, overlap_param_gather=zero.overlap_param_gather,
        stage_counts=stage_counts, fp8_recipe=model.fp8.recipe, fp8_wgrad=model.fp8.wgrad)
