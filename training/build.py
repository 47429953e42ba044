"""One rank's model, built in one ordered sequence that the trainer (`pretrain_gpt.py`) and the dry run
(`planner/dry_run.py`) share, as torchtitan's `parallelize` is one ordered function of the model, the
parallel dimensions and the job config.

Everything `build` depends on is an argument: the resolved run settings, the rank's `ParallelState` (its
device, its groups and its communicator: a launched process group and the live communicator in
training; `virtual_state` on the meta device with the `DryRunCommunicator` in a dry run), and the
two things a dry run does differently, named at each call: whether the dropout RNG streams are made
and whether the blocks are compiled. (A dry run on the meta device captures no CUDA graph: the planner counts
their buffers from the plan, planner/dry_run.py.)
"""

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
    """What the build hands the loop (or the dry run's one iteration) and the checkpoint code."""
    model: GPTModel
    zero: ZeroParts                                   # the gradient reducer and the sharded optimizer
    activations: ActivationMonitor                    # the loop's view of saved tensors and recompute timings
    checkpointing: Optional[ActivationCheckpointing]  # None without --checkpoint-activations
    rng: Optional[TensorParallelRNG]                  # the dropout streams; None when not asked for (dry run)
    fp8: Optional[str] = None                         # --fp8-format's start-up line (gpt/fp8.py); None without
    # gradient accumulation fusion's start-up line (zero/fused_accumulation.py)
    gradient_accumulation_fusion: Optional[str] = None
    cuda_graphs: Optional[CudaGraphs] = None          # --cuda-graph-impl's (training/cuda_graphs.py); None without


def build(settings: RunSettings, state: ParallelState, *, dropout_rng: bool, torch_compile: bool,
          graph_backend: Optional[GraphBackend] = None) -> Built:
    """Build this rank's model on `state.device` as `settings.config` (resolved) asks.

    `dropout_rng`: make the dropout streams (`TensorParallelRNG`, which reseeds torch's default
    generators with the run's seed). A live run asks for them; a dry run does not: planning must not
    reseed its caller's generators, and meta tensors have no values to draw, so its model runs dropout
    on the default stream and its recompute replays no RNG state, with the same shapes and saved bytes.
    `torch_compile`: torch.compile each block (a live run with --compile; never a dry run, which has no
    kernels to compile).
    `graph_backend`: what captures the CUDA graphs --cuda-graph-impl asks for. None: CUDA's on a GPU, and nothing on
    another device (training/cuda_graphs.py says why in its line); tests pass the CPU stand-in
    (parallel/graph_backends.py RerunBackend) to run the capture code without a GPU.
    """
    # The RNG streams, first: the model and the checkpointing hold them (attention forks the per-TP-rank
    # stream, recompute replays both), and creating them reseeds torch's generators, so nothing drawn before
    # this point can shift a dropout mask. Weight values draw nothing from them (they are a function of the
    # seed and each parameter's name, filled in by ZeRO).
    if torch_compile:
        keep_marked_methods_eager()  # before anything registers a hook that binds a marked method
    graphs = cuda_graph_plan(settings.config, state.device.type, stand_in=graph_backend is not None)
    # A fork of the dropout streams inside a CUDA capture swaps generator states by reference (parallel/random.py)
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
    """Every dimension of this rank's model, in this order, as torchtitan's models/llama3/parallelize.py:
    1. Tensor and sequence parallelism: the declared plan (gpt/parallel_plan.py), decided here once from
       the `parallel` section and the TP group; the constructors build each layer as the plan names it.
    2. Pipeline parallelism: this rank's stage (its model chunks' layers, gpt/stage_layers.py). The model
       is built with both on the meta device: shapes only, no memory, no draws. With --fp8-format the
       blocks' TP linears then run their GEMMs in FP8 (gpt/fp8.py).
    3. Activation checkpointing: it installs itself as the model's run_blocks and allocates nothing.
    4. ZeRO over the data-parallel group (zero/apply.py, which also decides once where the parameter
       shards, the master weights and the optimizer states live: --offload-param/-optimizer): the flat
       layout from the meta parameters, then each rank allocates and fills only what it owns, the
       parameters become views of that storage, and the gradient hooks (and stage 3's gather hooks) go on.
       Then gradient accumulation fusion: the TP linears whose main gradient ZeRO holds in fp32 add their weight
       gradient into it inside the GEMM (zero/fused_accumulation.py), but in blocks steps 5 and 6 take over.
    5. torch.compile of each block: compile_blocks wants parallelism applied, so that the compiled
       blocks are the ones ZeRO left (parameters that are views of its storage, its hooks in place).
       Compilation itself happens at the first forward.
    6. CUDA graphs of the blocks (training/cuda_graphs.py), last: a graph reads the parameters at the addresses ZeRO
       gave them and ZeRO's hooks must be in place to be checked. It replaces run_blocks as step 3 would (the two
       exclude each other, as in Megatron-LM); a compiled block is not captured (said); the capture is in training.
    """
    config = settings.config
    plan = tensor_parallel_plan(state, config.parallel)                                   # 1. TP, SP
    stage = pipeline_stage(settings, state)
    model = GPTModel(config.model, state, rng=rng, stage=stage, plan=plan)                 # 2. PP
    # FP8 (gpt/fp8.py): the blocks' TP linears call the FP8 linear; it touches no parameter. On the meta device
    # too, so the dry run keeps what the FP8 linears keep (planner/dry_run.py); the guard, which reads its
    # counts' values, only where there are values.
    # --fp8-guard's verdicts, fallbacks and counts (parallel/fp8/guard.py), taken by the train step once an iteration
    guarded = config.model.fp8.enabled and config.model.fp8.guard and state.device.type != "meta"
    model.fp8_guard = guard_monitor(config.model, state, state.device) if guarded else None
    # A dense GEMM's rows: this rank's tokens of a micro-batch (its 1/CP of the sequence under context parallelism).
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
    # A tied embedding (or the MTP layers' copy, gpt/mtp.py) on two stages is a ZeRO unit of its own, so the two copies' gradients can be summed
    # shard by shard (zero/pipeline_grads.py).
    shared = [model.word_embeddings.weight] if state.pipeline_parallel_size > 1 and model.shares_word_embedding \
        and model.word_embeddings is not None else []
    mark_weight_decay(decayed_norm_params(model, config))
    # Where the experts' grid is not the dense one (expert parallelism, or expert TP 1 beside TP: each TP rank's
    # experts see its own sequence slice) the experts' states get a ZeRO of their own over the expert data-parallel
    # group (gpt/moe/layer.py tags them); a pipeline stage whose layers hold no expert has none (zero/experts.py).
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
    """The modules whose linears keep autograd's weight gradient under gradient accumulation fusion, and why: the
    output layer (the loss reads its weight and makes its gradient), compiled blocks (a compiled graph would break at
    the main gradient's owner) and CUDA-graphed regions (a captured backward hands autograd the gradients)."""
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
    """The layers pipeline rank `pp_rank` of `config`'s stages builds, by the split its flags give (even, uneven
    first/last, interleaved, the embedding and loss counted, or --pipeline-model-parallel-layout). The planner
    prices a layout at this split (planner/layout_of_config.py), so it is the one the build makes."""
    return stage_layers(model.num_layers, parallel.pipeline_model_parallel_size, pp_rank,
                        parallel.num_layers_per_virtual_pipeline_stage, parallel.decoder_first_pipeline_num_layers,
                        parallel.decoder_last_pipeline_num_layers,
                        virtual_stages=parallel.num_virtual_stages_per_pipeline_rank,
                        account_for_embedding=parallel.account_for_embedding_in_pipeline_split,
                        account_for_loss=parallel.account_for_loss_in_pipeline_split,
                        layout_counts=pipeline_layout_counts(model, parallel))


def checkpoint_slot_sets(settings: RunSettings, state: ParallelState, stage: Optional[StageLayers]) -> int:
    """How many micro-batches' checkpoints --contiguous-checkpointing's buffer holds (zero/checkpoint_buffer.py):
    one without pipeline stages; with them, the most checkpoints this rank's schedule keeps awaiting their backward
    at the run's largest batch, in whole micro-batches (1F1B: min(P - s, M) on stage s)."""
    if stage is None:
        return 1
    # a chunk's blocks are grouped from its first (zero/activations.py)
    by_chunk = [settings.config.activations.num_checkpoints(len(chunk)) for chunk in stage.chunks]
    slots = schedule(settings.batch.final_accumulation_steps, state.pipeline_parallel_size,
                     state.pipeline_parallel_rank, len(stage.chunks),
                     settings.config.parallel.microbatch_group_size_per_virtual_pipeline_stage)
    return max(1, -(-peak_held_by_forwards(slots, by_chunk) // max(1, sum(by_chunk))))


def decayed_norm_params(model: GPTModel, config) -> list:
    """The norms' parameters that --apply-wd-to-qk-layernorm decays: every parameter of --qk-layernorm's
    query and key norms, gains and biases, as Megatron-Core's get_standard_config_overrides
    (megatron/core/optimizer/__init__.py) exempts names containing "q_layernorm." or "k_layernorm." from its
    no-decay rule for 1-dim parameters and biases; none without the flag."""
    if not config.optimizer.apply_wd_to_qk_layernorm:
        return []
    return [param for name, param in model.named_parameters()
            if "q_layernorm." in name or "k_layernorm." in name]


def embedding_and_output_weights(model: GPTModel) -> list:
    """Megatron-LM's `is_embedding_or_output_parameter` weights this pipeline stage holds (the word embedding and an
    untied output layer): --optimizer muon leaves them to Adam (zero/muon.py), as `_is_muon_excluded`."""
    return [layer.weight for layer in (model.word_embeddings, model.output_layer) if layer is not None]


def decoupled_lr_params(model: GPTModel, config) -> list:
    """The weights --decoupled-lr steps: Megatron-LM's `is_embedding_or_output_parameter` ones
    (megatron/core/models/common/language_module/language_module.py), the word embedding and an untied
    output layer, those this pipeline stage holds; none without the flag."""
    if config.optimizer.decoupled_lr is None:
        return []
    return embedding_and_output_weights(model)
