"""One rank's model, built in one ordered sequence (`parallelize`) that the trainer and the planner's dry run share, as
torchtitan's `parallelize`. Everything it depends on is an argument; a dry run differs only in making no dropout streams
and compiling nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.eager_under_compile import keep_marked_methods_eager
from gpt.fp8 import (
    apply_fp8,
    compile_options,
    delayed_scaling_passes,
    fp8_gathered_weights,
    fp8_weight_caches,
    guard_monitor,
)
from gpt.model import GPTModel, compile_blocks
from gpt.model_config import ModelConfig
from gpt.parallel_plan import tensor_parallel_plan
from gpt.pipeline_layout import pipeline_layout_counts
from gpt.stage_layers import StageLayers, stage_layers
from parallel.config import ParallelismConfig
from parallel.graph_backends import CudaGraphBackend, GraphBackend
from parallel.pipeline_schedules import peak_held_by_forwards, schedule
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState
from training.cuda_graphs import CudaGraphPlan, CudaGraphs, apply_cuda_graphs, cuda_graph_plan, graph_regions
from training.run_settings import RunSettings
from zero.activations import ActivationCheckpointing, ActivationMonitor, apply_activation_checkpointing
from zero.apply import ZeroParts, apply_zero
from zero.experts import build_zero_with_experts, holds_expert_parameters
from zero.flat_buffer import mark_weight_decay
from zero.fused_accumulation import apply_gradient_accumulation_fusion


@dataclass
class Built:
    """What the build hands the loop (or the dry run) and the checkpoint code."""
    model: GPTModel
    zero: ZeroParts
    activations: ActivationMonitor                    # the loop's view of saved tensors and recompute timings
    checkpointing: Optional[ActivationCheckpointing]  # None without --checkpoint-activations
    rng: Optional[TensorParallelRNG]                  # the dropout streams; None in a dry run
    fp8: Optional[str] = None                         # --fp8-format's start-up line; None without
    gradient_accumulation_fusion: Optional[str] = None
    cuda_graphs: Optional[CudaGraphs] = None          # --cuda-graph-impl's; None without


def build(settings: RunSettings, state: ParallelState, *, dropout_rng: bool, torch_compile: bool,
          graph_backend: Optional[GraphBackend] = None) -> Built:
    """Build this rank's model as `settings.config` asks. `dropout_rng`: make the dropout streams, which reseed torch's
    generators (a dry run must not); `graph_backend`: what captures CUDA graphs."""
    # The RNG streams first: creating them reseeds torch's generators.
    if torch_compile:
        keep_marked_methods_eager()  # before anything registers a hook that binds a marked method
    graphs = cuda_graph_plan(settings.config, state.device.type, stand_in=graph_backend is not None)
    # forking the streams inside a capture swaps generator states by reference
    graph_safe = graphs is not None and graphs.captures and state.device.type == "cuda"
    training = settings.config.training
    rng = TensorParallelRNG(training.seed, state, graph_safe=graph_safe,
                            data_parallel_random_init=training.data_parallel_random_init) if dropout_rng else None
    if graph_safe and graph_backend is None:
        graph_backend = CudaGraphBackend(state.device, rng.graph_generators() if rng is not None else [])
    return parallelize(settings, state, rng, torch_compile=torch_compile, graphs=graphs, graph_backend=graph_backend)


def parallelize(settings: RunSettings, state: ParallelState, rng: Optional[TensorParallelRNG], *,
                torch_compile: bool, graphs: Optional[CudaGraphPlan] = None,
                graph_backend: Optional[GraphBackend] = None) -> Built:
    """Every dimension of this rank's model, in this order, as torchtitan's llama3 parallelize: TP/SP plan and pipeline
    stage (built on meta), FP8, activation checkpointing, ZeRO over DP (each rank fills only what it owns), gradient
    accumulation fusion, torch.compile, then CUDA graphs over the parameters' final addresses."""
    config = settings.config
    plan = tensor_parallel_plan(state, config.parallel)                                   # 1. TP, SP
    stage = pipeline_stage(settings, state)
    model = GPTModel(config.model, state, rng=rng, stage=stage, plan=plan)                 # 2. PP
    # on meta too, so the dry run keeps what FP8 keeps; the guard needs values
    guarded = config.model.fp8.enabled and config.model.fp8.guard and state.device.type != "meta"
    model.fp8_guard = guard_monitor(config.model, state, state.device) if guarded else None
    # A dense GEMM's rows: this rank's tokens of a micro-batch.
    fp8 = apply_fp8(
        model.blocks, config.model,
        config.training.micro_batch_size * config.model.seq_length // state.context_parallel_size, state.device,
        state, model.fp8_guard, mtp_layers=model.mtp_layers, compiled=torch_compile)
    model.fp8_passes = delayed_scaling_passes(model, config.model, state)  # delayed scaling's update, once a pass
    model.fp8_weight_caches = fp8_weight_caches(model)  # forgotten as each iteration's micro-batches start
    activations = ActivationMonitor(state.device)
    checkpointing = None
    if config.activations.checkpoint_activations:                                          # 3. recompute
        checkpointing = apply_activation_checkpointing(model, config.activations, state, rng, activations,
                                                       slot_sets=checkpoint_slot_sets(settings, state, stage))
    # A tied embedding on two stages is a ZeRO unit of its own, summed shard by shard.
    shared = [model.word_embeddings.weight] if state.pipeline_parallel_size > 1 and model.shares_word_embedding \
        and model.word_embeddings is not None else []
    mark_weight_decay(decayed_norm_params(model, config))
    # Experts on a grid of their own get a ZeRO of their own over expert DP.
    own_experts = state.expert_grid is not None and config.model.moe is not None and holds_expert_parameters(model)
    zero = apply_zero(model, config, state, blocks=model.blocks, own_units=shared,                # 4. ZeRO, DP
                      decoupled_lr_params=decoupled_lr_params(model, config),
                      muon_excluded_params=embedding_and_output_weights(model),
                      build=build_zero_with_experts if own_experts else None,
                      fp8_gathered=fp8_gathered_weights(model) if config.model.fp8.param_gather else None)
    fusion = apply_gradient_accumulation_fusion(model, zero.reducer, config.zero.gradient_accumulation_fusion,
                                                state.device, left_out=unfused_linears(model, graphs, torch_compile))
    if torch_compile:                                                                      # 5. compile
        compile_blocks(model, compile_options(config.model, state.device))
    cuda_graphs = apply_cuda_graphs(model, graphs, state, graph_backend)                   # 6. CUDA graphs
    return Built(model=model, zero=zero, activations=activations, checkpointing=checkpointing, rng=rng, fp8=fp8,
                 gradient_accumulation_fusion=fusion, cuda_graphs=cuda_graphs)


def unfused_linears(model: GPTModel, graphs: Optional[CudaGraphPlan], torch_compile: bool) -> list:
    """The modules whose linears keep autograd's weight gradient under accumulation fusion, and why."""
    left_out = [(model.output_layer, "the loss's gradient (the output layer)")] if model.output_layer is not None \
        else []
    if torch_compile:
        left_out += [(block, "autograd's gradient in the compiled blocks (--compile)") for block in model.blocks]
    if graphs is not None and graphs.captures:
        left_out += [(module, "autograd's gradient in the CUDA-graphed regions") for spec in graph_regions(model, graphs)
                     for module in spec.modules]
    return left_out


def pipeline_stage(settings: RunSettings, state: ParallelState) -> Optional[StageLayers]:
    """This rank's layers with pipeline stages; None (the whole model) without."""
    if state.pipeline_parallel_size == 1:
        return None
    return config_stage_layers(settings.config.model, settings.config.parallel, state.pipeline_parallel_rank)


def config_stage_layers(model: ModelConfig, parallel: ParallelismConfig, pp_rank: int) -> StageLayers:
    """The layers pipeline rank `pp_rank` builds, by the split its flags give."""
    return stage_layers(model.num_layers, parallel.pipeline_model_parallel_size, pp_rank,
                        parallel.num_layers_per_virtual_pipeline_stage, parallel.decoder_first_pipeline_num_layers,
                        parallel.decoder_last_pipeline_num_layers,
                        virtual_stages=parallel.num_virtual_stages_per_pipeline_rank,
                        account_for_embedding=parallel.account_for_embedding_in_pipeline_split,
                        account_for_loss=parallel.account_for_loss_in_pipeline_split,
                        layout_counts=pipeline_layout_counts(model, parallel))


def checkpoint_slot_sets(settings: RunSettings, state: ParallelState, stage: Optional[StageLayers]) -> int:
    """How many micro-batches' checkpoints the contiguous buffer holds (the schedule's most in flight)."""
    if stage is None:
        return 1
    # a chunk's blocks are grouped from its first
    by_chunk = [settings.config.activations.num_checkpoints(len(chunk)) for chunk in stage.chunks]
    slots = schedule(settings.batch.final_accumulation_steps, state.pipeline_parallel_size,
                     state.pipeline_parallel_rank, len(stage.chunks),
                     settings.config.parallel.microbatch_group_size_per_virtual_pipeline_stage)
    return max(1, -(-peak_held_by_forwards(slots, by_chunk) // max(1, sum(by_chunk))))


def decayed_norm_params(model: GPTModel, config) -> list:
    """The query and key norms' parameters --apply-wd-to-qk-layernorm decays, as Megatron-Core's
    get_standard_config_overrides."""
    if not config.optimizer.apply_wd_to_qk_layernorm:
        return []
    return [param for name, param in model.named_parameters()
            if "q_layernorm." in name or "k_layernorm." in name]


def embedding_and_output_weights(model: GPTModel) -> list:
    """Megatron-LM's `is_embedding_or_output_parameter` weights this stage holds: --optimizer muon leaves them to
    Adam."""
    return [layer.weight for layer in (model.word_embeddings, model.output_layer) if layer is not None]


def decoupled_lr_params(model: GPTModel, config) -> list:
    """The weights --decoupled-lr steps; none without it."""
    if config.optimizer.decoupled_lr is None:
        return []
    return embedding_and_output_weights(model)
