"""One rank of any grid, planned from the real code: what `pretrain_gpt.py` does for that rank, on the `meta` device,
with a virtual process grid and a counting communicator, so model states, bytes per group and saved activations are the
live measurements'. What a meta device cannot know is listed, not guessed (`UNKNOWNS`). Bounded by `MAX_PLAN_LAYERS` and
`MAX_PLAN_EXPERTS`."""

from __future__ import annotations

import functools
import itertools
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from arguments.batch_schedule import BatchSchedule
from arguments.bounds import check_tensor_sizes
from arguments.config import ConfigError, PretrainConfig
from base.progress import ProgressLines
from checkpoint.global_load import load_read_bytes
from checkpoint.ours.async_save import staged_bytes_bound
from gpt.fp8 import delayed_states, fp8_weight_caches
from gpt.model_config import ModelConfig
from gpt.shape import model_shape
from parallel.context_parallel import batch_on_this_rank
from parallel.state import virtual_state
from planner.attention_kernel import AttentionKernelOf
from planner.meta_kernels import CachedMetaKernels
from planner.moe_plan import ExpertRowProbe, MoEFigures, moe_figures
from planner.pipeline_plan import PipelineFigures, PipelinePlanObserver, message_bytes
from planner.plan_observer import PlanObserver
from training.build import build
from training.cuda_graphs import cuda_graph_plan, static_buffer_bytes
from training.metrics import current_rss_bytes, flops_per_iteration, parameter_count
from training.pipeline_step import PipelineTrainStep
from training.recompute_share import recomputed_share
from training.run_settings import resolve_run_settings
from training.train_step import DataParallelTrainStep
from zero.activations import ActivationMonitor, SavedTensorMeter
from zero.config import ZeroConfig
from zero.flat_buffer import BufferPool
from zero.fused_accumulation import fused_weights
from zero.memory import MODEL_STATE_CATEGORIES, format_bytes, host_resident_tensors, measure_by_placement

META = torch.device("meta")
MAX_PLAN_LAYERS = 1024
MAX_PLAN_EXPERTS = 4096
PROGRESS_INTERVAL_S = 10.0
UNKNOWNS = (
    "the caching allocator's fragmentation and reserved-but-unused blocks",
    "NCCL's own buffers and communicators (hundreds of MB per process group on large jobs)",
    "the CUDA context and library workspaces (cuBLAS, cuDNN): about 0.5-1 GB per process",
)


@dataclass(frozen=True)
class Cluster:
    world_size: int
    gpus_per_node: int
    gpu_memory_bytes: Optional[int] = None
    device_type: str = "cuda"  # decides the attention kernel
    host_memory_bytes: Optional[int] = None
    host_memory_source: str = ""

    @property
    def ranks_per_node(self) -> int:
        return min(self.gpus_per_node, self.world_size)


@dataclass
class RankPlan:
    """What one rank holds and sends in one iteration. Bytes per GPU unless named otherwise."""
    rank: int
    tensor_parallel_rank: int
    data_parallel_rank: int
    tensor_parallel_size: int
    data_parallel_size: int
    stage: int
    precision: str
    gradient_precision: str
    parameters_total: int
    parameters_local: int
    model_state_bytes: dict[str, int]
    buffer_bytes: int                    # constant-size reduce buckets and scatter outputs (C_B)
    host_model_state_bytes: dict[str, int]
    host_buffer_bytes: int
    offload_copy_bytes: int
    stage3_live_chunk_bytes: int
    stage3_prefetch_elements: int
    checkpoint_bytes: dict[str, int]
    # M_D's buffer, held from the first checkpoint; its checkpoints are not in saved_activation_bytes
    contiguous_checkpoint_buffer_bytes: dict[str, int]
    saved_activation_bytes: dict[str, int]
    block_saved_bytes: dict[str, int]
    logits_bytes: int
    # the loss's fp32 softmax, main and MTP
    loss_softmax_bytes: int
    gradient_working_bytes: int
    step_working_bytes: int
    # a resume's read: its partition's master and moments
    checkpoint_read_bytes: int
    parameter_gradient_bytes: int
    transport_copy_bytes: dict[str, int]
    process_baseline_bytes: int  # CPU: this process's RSS at the start (not in total)
    comm_bytes: dict[str, dict[str, int]]
    flops_per_iteration: float
    flops_per_gpu: float
    total_bytes: int = 0  # the run's peak: from iteration 2 on, with the constant buffers
    first_iteration_bytes: int = 0  # iteration 1's peak (its constant buffers appear at its first reduction)
    budget_bytes: Optional[int] = None
    headroom_bytes: Optional[int] = None
    host_total_bytes: int = 0
    # --async-save's staged host copy
    checkpoint_staging_bytes: int = 0
    # delayed scaling's amaxes and scales, and --fp8-param-gather's bytes
    fp8_state_bytes: int = 0
    # FP8 weight casts kept through the iteration's micro-batches
    fp8_weight_cache_bytes: int = 0
    # CUDA graphs' buffers and pool (an upper bound)
    cuda_graph_static_bytes: int = 0
    cuda_graph_pool_bytes: int = 0
    ranks_per_node: int = 1
    host_budget_bytes: Optional[int] = None
    host_budget_source: str = ""
    unknowns: list[str] = field(default_factory=lambda: list(UNKNOWNS))
    notes: list[str] = field(default_factory=list)
    pipeline: Optional[PipelineFigures] = None
    moe: Optional[MoEFigures] = None
    micro_batches: int = 1
    simulated_micro_batches: int = 1

    @property
    def p2p_held_bytes(self) -> int:
        return self.pipeline.p2p_held_bytes if self.pipeline is not None else 0

    @property
    def host_node_bytes(self) -> int:
        return self.host_total_bytes * self.ranks_per_node

    @property
    def fits_host(self) -> Optional[bool]:
        return None if self.host_budget_bytes is None else self.host_node_bytes <= self.host_budget_bytes

    @property
    def fits_device(self) -> Optional[bool]:
        return None if self.budget_bytes is None else self.total_bytes <= self.budget_bytes

    @property
    def fits(self) -> Optional[bool]:
        if self.budget_bytes is None:
            return None
        return self.fits_device and self.fits_host is not False

    @property
    def binding(self) -> Optional[str]:
        """The tighter memory by the fraction of its budget used: "device" or "host" (None without both budgets)."""
        if self.budget_bytes is None or self.host_budget_bytes is None:
            return None
        return "host" if self.host_node_bytes / self.host_budget_bytes > self.total_bytes / self.budget_bytes \
            else "device"

    def to_json(self) -> dict:
        data = asdict(self)
        data["fits"] = self.fits
        return data


def _element_bytes(dtype: torch.dtype) -> int:
    return torch.finfo(dtype).bits // 8


class _BlockSavedProbe:
    """The saved-for-backward bytes each block adds, in forward and in a recompute."""

    def __init__(self, blocks, monitor: ActivationMonitor, progress: Optional["_Progress"] = None,
                 device_type: str = "cuda", attention_backend: str = "auto") -> None:
        self.monitor = monitor
        self.device_type = device_type
        self.attention_backend = attention_backend
        # torch runs a custom Function's backward with no torch-function mode on the stack, so each recompute re-enters
        # AttentionKernelOf, or the meta SDPA would plan the [b, heads, s, s] weights the device never keeps.
        self._recompute_kernel: Optional[AttentionKernelOf] = None
        self.backward_meter = SavedTensorMeter(META)
        self.phase = "forward"
        self.peak = {"forward": 0, "backward": 0}
        self.progress = progress
        # what is saved beyond the forward meter's peak, sampled where it peaks, split by whether the constant buffers
        # exist
        self.buffer_bytes = 0
        self.samples = {kind: {"before": 0, "with": 0, "any": 0} for kind in ("recompute", "saved", "copy")}
        self.forward_peak_at_buffers: Optional[int] = None
        self._before: dict[int, int] = {}
        self._handles = []
        for index, block in enumerate(blocks):
            self._handles.append(block.register_forward_pre_hook(functools.partial(self._start, index)))
            self._handles.append(block.register_forward_hook(functools.partial(self._stop, index)))

    def _live(self) -> int:
        meter = self.monitor.meter if self.phase == "forward" else self.backward_meter
        return 0 if meter is None else meter.live["device"] + meter.live["host"]

    def saved_now(self) -> int:
        forward = self.monitor.meter.live["device"] if self.monitor.meter is not None else 0
        return forward + (self.backward_meter.live["device"] if self.phase == "backward" else 0)

    def sample(self, kind: str, extra: int = 0) -> None:
        value = self.saved_now() + extra
        figures = self.samples[kind]
        figures["any"] = max(figures["any"], value)
        if self.buffer_bytes:
            figures["with"] = max(figures["with"], value + self.buffer_bytes)
        else:
            figures["before"] = max(figures["before"], value)

    def buffer_created(self, num_bytes: int) -> None:
        if not self.buffer_bytes and self.monitor.meter is not None:
            self.forward_peak_at_buffers = self.monitor.meter.peak["device"]
        self.buffer_bytes += num_bytes
        self.sample("saved")

    def first_iteration(self, kind: str) -> int:
        return max(self.samples[kind]["before"], self.samples[kind]["with"])

    def first_iteration_forward(self, forward_peak: int) -> int:
        if self.forward_peak_at_buffers is None or forward_peak <= self.forward_peak_at_buffers:
            return forward_peak
        return max(self.forward_peak_at_buffers, forward_peak + self.buffer_bytes)

    def _start(self, index, module, args) -> None:
        if self.phase == "backward" and self._recompute_kernel is None:
            self._recompute_kernel = AttentionKernelOf(self.device_type, self.attention_backend)
            self._recompute_kernel.__enter__()
        self._before[index] = self._live()

    def _leave_recompute_kernel(self) -> None:
        if self._recompute_kernel is not None:
            kernel, self._recompute_kernel = self._recompute_kernel, None
            kernel.__exit__(None, None, None)

    def _stop(self, index, module, args, output) -> None:
        self._leave_recompute_kernel()
        added = self._live() - self._before.pop(index, self._live())
        self.peak[self.phase] = max(self.peak[self.phase], added)
        if self.phase == "backward":
            self.sample("recompute")
        if self.progress is not None:
            self.progress.at(self.phase, index)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                # fires when backward reaches this block, which no forward hook sees
                output.register_hook(functools.partial(self._backward_reached, index))

    def _backward_reached(self, index, grad):
        self.progress.at("backward", index)

    def remove(self) -> None:
        self._leave_recompute_kernel()
        for handle in self._handles:
            handle.remove()


class _Progress:
    def __init__(self, emit: Callable[[str], None], layers: int, micro_batches: int) -> None:
        self.lines = ProgressLines(emit, PROGRESS_INTERVAL_S)
        self.layers, self.micro_batches = layers, micro_batches
        self.micro_batch = 0
        self.planned = micro_batches

    def at(self, phase: str, index: int) -> None:
        self.lines.update(lambda: f"dry run: micro-batch {self.micro_batch + 1} of the step's {self.micro_batches} "
                                  f"({self.planned} planned, the others repeat them), {phase}, "
                                  f"layer {index + 1}/{self.layers}")


def check_plannable(model: ModelConfig) -> None:
    if model.num_layers > MAX_PLAN_LAYERS:
        raise ConfigError(f"--num-layers {model.num_layers}: a dry run plans at most {MAX_PLAN_LAYERS} layers "
                          f"(MAX_PLAN_LAYERS in planner/dry_run.py; each costs about 0.02 s and 0.1 MB per micro-batch, "
                          f"and the deepest published Transformers have about 1,000); plan a shallower model")
    if model.num_layers + model.mtp.num_layers > MAX_PLAN_LAYERS:
        raise ConfigError(f"--num-layers {model.num_layers} and --mtp-num-layers {model.mtp.num_layers}: a dry run "
                          f"plans at most {MAX_PLAN_LAYERS} layers, MTP layers included (MAX_PLAN_LAYERS in "
                          f"planner/dry_run.py); plan fewer", flags=("--mtp-num-layers",))
    experts = model.moe.num_experts if model.moe is not None else 0
    if experts > MAX_PLAN_EXPERTS:
        raise ConfigError(f"--num-experts {experts}: a dry run plans at most {MAX_PLAN_EXPERTS} experts per layer "
                          f"(MAX_PLAN_EXPERTS in planner/dry_run.py; each expert is its own module, about 4 ms a layer "
                          f"to plan, and the most a published MoE has is Switch-C's 2,048); plan fewer",
                          flags=("--num-experts",))


def dry_run(config: PretrainConfig, cluster: Cluster, vocab_size: int, rank: int = 0,
            progress: Optional[Callable[[str], None]] = None, batch: Optional[BatchSchedule] = None) -> RankPlan:
    """Plan rank `rank` of a run of `config` on `cluster`; `batch`: the run's batch schedule when the caller has it."""
    check_plannable(config.model)
    check_tensor_sizes(config, vocab_size)
    # the planner's RSS stands in for a CPU rank's baseline of Python and torch
    baseline = current_rss_bytes() if cluster.device_type == "cpu" else 0
    tp, pp = config.parallel.tensor_model_parallel_size, config.parallel.pipeline_model_parallel_size
    try:
        state = virtual_state(cluster.world_size, tp, rank, META, pipeline_parallel_size=pp,
                              optimizer_instances=config.zero.distributed_optimizer_instances,
                              context_parallel_size=config.parallel.context_parallel_size,
                              expert_model_parallel_size=config.parallel.expert_model_parallel_size,
                              expert_tensor_parallel_size=config.parallel.expert_tensor_parallel_size,
                              hierarchical_context_parallel_sizes=config.parallel.hierarchical_context_parallel_sizes)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    plan = resolve_run_settings(config, vocab_size, tp, state.data_parallel_size, cluster.device_type, batch=batch)
    config = plan.config
    ticker = _Progress(progress, config.model.num_layers, plan.batch.final_accumulation_steps) if progress else None
    # no dropout streams: a plan must not reseed the caller's generators
    built = build(plan, state, dropout_rng=False, torch_compile=False)
    model, zero, monitor, checkpointing = built.model, built.zero, built.activations, built.checkpointing
    probe = _BlockSavedProbe(model.blocks, monitor, ticker, cluster.device_type, config.model.attention.attention_backend)
    expert_rows = ExpertRowProbe(model, probe._live, cluster.device_type) if config.model.moe is not None else None
    tokens = torch.zeros((config.training.micro_batch_size, config.model.seq_length + 1), dtype=torch.long, device=META)
    batches = itertools.repeat({"tokens": tokens})
    if pp > 1:
        observer = PipelinePlanObserver(state.comm, monitor, probe,
                                        message_bytes(model, config, batch_on_this_rank(tokens[:, :-1], state),
                                                      state.tensor_parallel_size))
        step = PipelineTrainStep(model, zero, batches, plan, state, monitor, observer=observer)
        observer.p2p = step.p2p
        fused = fused_weights(model)
        observer.watch_parameter_gradients(p for p in model.parameters() if p.requires_grad and id(p) not in fused)
    else:
        observer = PlanObserver(state.comm, monitor, probe)
        step = DataParallelTrainStep(model, zero, batches, plan, state, monitor, observer=observer)
    BufferPool.on_create = probe.buffer_created
    try:
        with AttentionKernelOf(cluster.device_type, config.model.attention.attention_backend), CachedMetaKernels():
            step.run_iteration(1, plan.batch.final_accumulation_steps, measure_activations=True)
    finally:
        BufferPool.on_create = None
        probe.remove()
        if expert_rows is not None:
            expert_rows.remove()
        state.comm.on_transport_copy = None
    copies = {"passes": observer.passes_copy, "step": state.comm.take_largest_transport_copy()}
    pipeline = observer.figures() if pp > 1 else None
    if cluster.device_type != "cpu":
        copies = {"passes": 0, "step": 0}  # NCCL reduces and gathers in place
    meter = monitor.finish_measurement()
    optimizer = zero.optimizer

    placed = measure_by_placement(optimizer.model_state_tensors(), host_resident_tensors(optimizer),
                                  include_meta=True)
    held, host_held = placed["device"], placed["host"]
    param_bytes = _element_bytes(plan.param_dtype)
    gatherer = getattr(optimizer.parameters, "gatherer", None)
    micro, seq = config.training.micro_batch_size, config.model.seq_length // state.context_parallel_size
    shape = model_shape(config.model, tp)
    local_vocab = shape.output_matmul(plan.padded_vocab_size).out_features
    if not model.stage.last:
        local_vocab = 0
    hidden_bytes = micro * seq * config.model.hidden_size * param_bytes
    logits = micro * seq * local_vocab * param_bytes
    # a block's backward gradients at the MLP's backward: the output's gradient, a recomputed output and the MLP's
    # activation gradients
    boundaries = (2 if config.activations.checkpoint_activations else 1) * hidden_bytes \
        // (tp if config.parallel.sequence_parallel else 1)
    mlp_features = micro * seq * shape.mlp_gradient_features if shape.dense_layers > shape.layers_without_mlp else 0
    if shape.moe_blocks and expert_rows is not None:
        mlp_features = max(mlp_features, expert_rows.rows_at_once * shape.moe_expert_gradient_features,
                           micro * seq * shape.moe_shared_gradient_features)
    block_gradients = boundaries + max(mlp_features * param_bytes, micro * seq * shape.mixer_only_gradient_bytes)
    result = RankPlan(
        rank=rank, tensor_parallel_rank=state.tensor_parallel_rank, data_parallel_rank=state.data_parallel_rank,
        tensor_parallel_size=tp, data_parallel_size=state.data_parallel_size, stage=optimizer.stage,
        precision=config.training.precision, gradient_precision=config.training.gradient_precision,
        parameters_total=parameter_count(config.model, plan.padded_vocab_size),
        parameters_local=optimizer.num_parameters,
        model_state_bytes={key: held[key] for key in (*MODEL_STATE_CATEGORIES, "total")},
        buffer_bytes=held.get("buffers", 0),
        host_model_state_bytes={key: host_held[key] for key in (*MODEL_STATE_CATEGORIES, "total")},
        host_buffer_bytes=host_held.get("buffers", 0),
        offload_copy_bytes=_offload_copy_bytes(config.zero, gatherer, param_bytes),
        stage3_live_chunk_bytes=gatherer.peak_live_numel * param_bytes if gatherer is not None else 0,
        stage3_prefetch_elements=config.zero.stage3_prefetch_bucket_size if gatherer is not None else 0,
        checkpoint_bytes=dict(meter.checkpointed_peak),
        contiguous_checkpoint_buffer_bytes=_buffer_bytes(checkpointing, config.activations.cpu_checkpointing),
        saved_activation_bytes=dict(meter.peak),
        block_saved_bytes=dict(probe.peak),
        logits_bytes=logits, loss_softmax_bytes=micro * seq * local_vocab * 4 * (1 + config.model.mtp.num_layers),
        gradient_working_bytes=logits + block_gradients,
        step_working_bytes=optimizer.step_working_bytes(copies["step"], norm_in_blocks=cluster.device_type == "cpu"),
        transport_copy_bytes=copies,
        checkpoint_read_bytes=load_read_bytes(model, optimizer),
        parameter_gradient_bytes=_parameter_gradient_bytes(model, param_bytes),
        pipeline=pipeline,
        process_baseline_bytes=baseline,
        comm_bytes=state.comm.stats.snapshot(),
        flops_per_iteration=flops_per_iteration(config.model, plan.batch.global_batch_size,
                                                activation_recompute=recomputed_share(config.activations, config.model,
                                                                                      config.parallel),
                                                padded_vocab_size=plan.padded_vocab_size),
        flops_per_gpu=0.0)
    result.flops_per_gpu = result.flops_per_iteration / cluster.world_size
    result.micro_batches = plan.batch.final_accumulation_steps
    result.simulated_micro_batches = pipeline.simulated_micro_batches if pipeline is not None else \
        len(observer.simulated)
    # the peak: model states and buffers, plus the larger of the passes' working set and the step's allocations, which
    # are never alive together
    result.fp8_weight_cache_bytes = sum(cache.peak_bytes for cache in fp8_weight_caches(model))
    transients = (result.stage3_live_chunk_bytes + logits + result.gradient_working_bytes
                  + result.parameter_gradient_bytes + result.offload_copy_bytes + result.fp8_weight_cache_bytes)
    in_backward = transients - 2 * logits
    copied = bool(copies["passes"])
    if pipeline is not None:
        passes = max(transients - result.parameter_gradient_bytes
                     + max(pipeline.pass_peak_bytes, pipeline.gradient_arrival_peak_bytes),
                     in_backward + probe.samples["recompute"]["any"] + pipeline.p2p_held_bytes
                     if probe.samples["recompute"]["any"] else 0)
    else:
        passes = max(transients + max(meter.peak["device"], observer.copy_peak_bytes if copied else 0),
                     in_backward + probe.samples["recompute"]["any"])
    result.fp8_state_bytes = fp8_state_bytes(model, optimizer.parameters)
    graphs = cuda_graph_plan(config, cluster.device_type)
    if graphs is not None and graphs.captures:
        result.cuda_graph_static_bytes = static_buffer_bytes(model, graphs, hidden_bytes)
        result.cuda_graph_pool_bytes = meter.peak["device"] + block_gradients
        result.notes.append(f"CUDA graphs ({graphs.impl}): from their capture on, their pool stays reserved through "
                            f"the optimizer step (counted beside it); an attention mask's copy per region is not "
                            f"counted")
    device_contiguous = result.contiguous_checkpoint_buffer_bytes["device"]
    result.total_bytes = held["total"] + result.fp8_state_bytes + result.buffer_bytes + device_contiguous \
        + result.cuda_graph_static_bytes + max(passes, result.step_working_bytes + result.cuda_graph_pool_bytes)
    # iteration 1 holds less: its constant buffers appear at its first reduction, after the forward's peak
    result.first_iteration_bytes = result.total_bytes
    if not (graphs is not None and graphs.captures and graphs.capture_iteration == 1):
        first_passes = passes if pipeline is not None else max(
            transients + max(probe.first_iteration_forward(meter.peak["device"]),
                             probe.first_iteration("copy") if copied else 0),
            in_backward + max(probe.first_iteration("recompute"), probe.first_iteration("saved")))
        result.first_iteration_bytes = held["total"] + result.fp8_state_bytes + device_contiguous \
            + max(first_passes, result.buffer_bytes + result.step_working_bytes)
    if config.checkpoint.saves_in_background:
        partition = sum(held[key] + host_held[key] for key in ("master_weights", "optimizer_states"))
        result.checkpoint_staging_bytes = staged_bytes_bound(sum(param.numel() for param in model.parameters()),
                                                             param_bytes, partition)
    result.host_total_bytes = host_held["total"] + result.host_buffer_bytes + meter.peak["host"] \
        + result.contiguous_checkpoint_buffer_bytes["host"] \
        + result.checkpoint_staging_bytes
    result.ranks_per_node = cluster.ranks_per_node
    result.host_budget_bytes = cluster.host_memory_bytes
    result.host_budget_source = cluster.host_memory_source
    if config.zero.offload_optimizer and cluster.device_type == "cuda" and \
            (optimizer.stage == 3 and not config.zero.offload_param or plan.param_dtype == torch.float32):
        result.notes.append("not counted: the device temporary of copying the host master into the parameters "
                            "(stage 3's copy_ across devices and dtypes; stages 1-2 in fp32)")
    if state.context_parallel_size > 1 and config.model.attention.cp_comm_type in ("p2p", "a2a+p2p"):
        # the CP ring's explicit scores: a transient the meter does not see
        heads, ring_seq = config.model.num_attention_heads // tp, seq
        if config.model.attention.cp_comm_type == "a2a+p2p":
            heads, ring_seq = heads // state.hierarchical_context_sizes[0], seq * state.hierarchical_context_sizes[0]
        scores = micro * heads * ring_seq * ring_seq * 4
        result.notes.append(f"not counted: the ring's per-block attention scores, fp32 [micro-batch, {heads} heads, "
                            f"{ring_seq}, {ring_seq}] = {format_bytes(scores)} a few at a time in each layer's forward and "
                            f"backward (computed explicitly, not by a fused kernel)")
    if checkpointing is not None and config.activations.contiguous_checkpointing and \
            config.activations.cpu_checkpointing:
        result.notes.append("the contiguous checkpoint buffer is in host memory (P_a+cpu)")
    if config.model.moe is not None:
        # no routing exists on the meta device; planner/moe_plan.py bounds what an unbalanced step adds
        ep = state.experts.model_size
        result.moe = moe_figures(config, state, optimizer, expert_rows,
                                 pipeline.peak_chunk_forwards_in_flight if pipeline is not None else 1)
        result.moe.worst_total_bytes = result.total_bytes + result.moe.worst_extra_bytes
        result.notes.append(
            "MoE routing assumed uniform: every expert receives an equal share of the tokens' top-k rows"
            + (f"; the {config.parallel.dispatcher_name} dispatcher's exchanges over the {ep} "
               "expert-parallel ranks are counted for that routing (under \"ep\")" if ep > 1 else ""))
    if cluster.gpu_memory_bytes is not None:
        result.budget_bytes = cluster.gpu_memory_bytes
        result.headroom_bytes = cluster.gpu_memory_bytes - result.total_bytes
    return result


def _offload_copy_bytes(zero: ZeroConfig, gatherer, param_bytes: int) -> int:
    """--offload-param: what the gatherer's host-to-device copies add to its gathered peak."""
    if gatherer is None or not zero.offload_param:
        return 0
    return (gatherer.peak_device_numel - gatherer.peak_live_numel) * param_bytes


def _parameter_gradient_bytes(model, param_bytes: int) -> int:
    """The largest gradient autograd materializes for one parameter before the reducer takes it (tied: summed)."""
    fused = fused_weights(model)
    largest = max((p.numel() for p in model.parameters() if id(p) not in fused), default=0)
    tied = getattr(getattr(model, "word_embeddings", None), "weight", None)
    if tied is not None and tied.numel() == largest and model.stage.first and model.stage.last:
        largest *= 2
    return largest * param_bytes


def fp8_state_bytes(model, parameter_storage) -> int:
    """What FP8 holds between steps besides the model states."""
    held = sum(tensor.numel() * tensor.element_size() for scaling in delayed_states(model).values()
               for tensor in (scaling.amax_history, scaling.scale))
    gathered = getattr(parameter_storage, "fp8", None)
    return held + (gathered.resident_bytes() if gathered is not None else 0)


def _buffer_bytes(checkpointing, on_host: bool) -> dict[str, int]:
    held = checkpointing.contiguous.nbytes() if checkpointing is not None and checkpointing.contiguous else 0
    return {"device": 0 if on_host else held, "host": held if on_host else 0}
