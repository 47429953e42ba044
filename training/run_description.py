"""The start-up line of a training run, printed once by the first rank: the model, the batch, the parallel sizes, the
ZeRO stage, what lives in host memory, the precision and the torch thread count."""

from __future__ import annotations

from typing import Optional

from arguments.training_config import TrainingConfig
from gpt.model_config import ModelConfig
from gpt.parallel_plan import tensor_parallel_plan
from parallel.config import ParallelismConfig
from parallel.state import ParallelState
from training.build import Built
from training.metrics import active_parameter_count, parameter_count
from training.run_settings import RunSettings
from training.threads import ThreadChoice
from zero.config import ActivationCheckpointConfig, ZeroConfig


def describe_model(settings: RunSettings, state: ParallelState, built: Built,
                   threads: Optional[ThreadChoice] = None) -> str:
    config = settings.config
    total = parameter_count(config.model, settings.padded_vocab_size)
    moe = config.model.moe
    count = f"{total:,} parameters" if moe is None else (
        f"{total:,} parameters, {active_parameter_count(config.model, settings.padded_vocab_size):,} active "
        f"({_moe_layers(sum(config.model.moe_layers()))} of {_experts(config.model)} experts, "
        f"top-{moe.router_topk}{', residual (PR-MoE)' if moe.deepspeed.use_residual else ''})")
    line = (f"> model: {count} "
            f"({config.model.num_layers} layers, hidden {config.model.hidden_size}, "
            f"{config.model.num_attention_heads} heads, vocab {settings.vocab_size} padded to "
            f"{settings.padded_vocab_size}) on {state.device}; global batch {settings.batch.describe()} = micro batch "
            f"{config.training.micro_batch_size} x {settings.batch.final_accumulation_steps} accumulation steps x "
            f"{state.data_parallel_size} data-parallel; {parallel_sizes(config.model, config.parallel, state)}; "
            f"{_pipeline_words(built)}ZeRO stage {built.zero.optimizer.stage}, {config.training.precision} "
            f"({config.training.gradient_precision} gradients); "
            f"{host_placement(config.zero, config.activations, config.training)}")
    if threads is not None and threads.differs:
        line += f"; {threads.words()}"
    return line


def _experts(model) -> str:
    """'8', or each MoE layer's count where they differ ('4/4/8')."""
    return "/".join(str(count) for count, is_moe in zip(model.experts_per_layer(), model.moe_layers()) if is_moe) \
        if model.experts.per_layer else str(model.moe.num_experts)


def _moe_layers(count: int) -> str:
    return f"{count} MoE layer{'s' if count != 1 else ''}"


def parallel_sizes(model: ModelConfig, parallel: ParallelismConfig, state: ParallelState) -> str:
    """'parallel sizes TP 2, SP on, PP 1, DP 4', then CP, experts and optimizer instances."""
    sequence = "on" if tensor_parallel_plan(state, parallel).sequence_parallel else "off"
    words = (f"parallel sizes TP {state.tensor_parallel_size}, SP {sequence}, PP {state.pipeline_parallel_size}, "
             f"DP {state.data_parallel_size}")
    if parallel.sequence_parallel and state.tensor_parallel_size == 1:
        words += " (--sequence-parallel has nothing to split at TP 1, as in Megatron-LM)"
    if state.context_parallel_size > 1:  # only then: the line of every other run stays as it was
        comm = model.attention.cp_comm_type
        if comm == "a2a+p2p":
            comm += " = all-to-all over {} x ring over {}".format(*state.hierarchical_context_sizes)
        words += (f", CP {state.context_parallel_size} ({comm}; gradients averaged and ZeRO's "
                  f"partition cut over DP x CP = {state.data_context_parallel_size})")
    experts = state.experts
    if experts.model_size > 1:
        # expert TP named only where the experts are split
        split = f" x expert TP {experts.tensor_size}" if experts.tensor_size > 1 else ""
        words += (f"; experts EP {experts.model_size}{split} x expert DP {experts.data_size} "
                  f"({parallel.dispatcher_name} dispatcher)")
    elif model.moe is not None and experts.tensor_size > 1:
        words += (f"; experts split over expert TP {experts.tensor_size} "
                  f"({parallel.dispatcher_name} dispatcher)")
    instances = state.optimizer_instances.count
    if instances > 1:
        words += (f"; {instances} distributed optimizer instances, each sharding the optimizer state over "
                  f"{state.partition_size} DP ranks and replicated across the instances")
        if experts.model_size > 1:  # the experts' optimizer is cut into the same instances
            words += f", the experts' over {experts.optimizer_instances.shard_size} expert DP ranks"
    return words


def host_placement(zero: ZeroConfig, activations: ActivationCheckpointConfig, training: TrainingConfig) -> str:
    """What ZeRO-Offload and ZeRO-R put in host memory, or that nothing is."""
    on_host = []
    fraction = zero.optimizer_offload_fraction if zero.offload_optimizer else 0.0
    if fraction == 1.0:
        on_host.append("optimizer states: fp32 master partition, Adam moments, gradient partition, AdamW step "
                       "(--offload-optimizer)")
    elif fraction > 0.0:  # Megatron-LM's hybrid optimizer
        on_host.append(f"optimizer states of the first {fraction:g} of the partition: fp32 master, Adam moments, AdamW "
                       f"step and a copy of their gradients (--offload-optimizer --optimizer-offload-fraction "
                       f"{fraction:g}; the rest on the device)")
    if zero.offload_param:
        on_host.append(f"{training.precision} parameter shards (--offload-param)")  # the model's dtype
    if activations.checkpoint_activations and activations.cpu_checkpointing:
        on_host.append("activation checkpoints (--cpu-checkpointing)")
    if not on_host:
        return "offload: none (everything on the device)"
    return "offloaded to host memory: " + "; ".join(on_host)


def _pipeline_words(built: Built) -> str:
    """The start line's words for pipeline stages (none without)."""
    stage, stages = built.model.stage, built.model.state.pipeline_parallel_size
    if stages == 1:
        return ""
    chunks = len(stage.chunks)
    schedule = f"interleaved 1F1B, {chunks} chunks a stage" if chunks > 1 else "1F1B"
    return f"{stages} pipeline stages ({schedule}); "
