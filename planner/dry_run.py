"""One rank of any grid, planned from the real code: build, materialize on the meta device, run one
iteration, and measure what the rank would hold and send.

`dry_run(config, cluster, rank)` does what `pretrain_gpt.py` does for that rank, with three changes: the device is
`meta` (shapes, no memory, no arithmetic), the process grid is `virtual_state` (groups that are only sizes) and
collectives go through `DryRunCommunicator` (the live byte accounting, no transport). The model, activation
checkpointing, ZeRO's layout and storages, the gradient hooks and buckets (the trainer's own `training.build.build`,
without dropout streams or compilation), the stage-3 gatherer and the train step itself (DataParallelTrainStep or
PipelineTrainStep, with an observer: planner/plan_observer.py) run as live. So model-state bytes are the live
measurement's (`zero.memory.measure_tensor_bytes`, equal to --report-memory), bytes per group and kind are the live
`comm_bytes` of iteration 1, saved activations the live `SavedTensorMeter`'s; what a meta device cannot know is
listed, not guessed (`UNKNOWNS`). With pipeline stages the rank runs its stage's slots (planner/pipeline_plan.py).

Its cost is bounded: every layer is a real module with hooks and graph (about 0.02 s and 0.1 MB per layer and
micro-batch on one core, measured at 100 and 400 layers of hidden 8192; repeated meta kernels are answered from
planner/meta_kernels.py's cache, 0.053 s a layer without it), so a dry run plans at most `MAX_PLAN_LAYERS` layers
(the deepest published Transformers have about 1,000; a million-layer typo would take a day), MTP layers among them,
and at most `MAX_PLAN_EXPERTS` experts per layer (twice Switch-C's 2,048; about 4 ms each). A dry run still running
after `PROGRESS_INTERVAL_S` says how far it is, one line at most that often."""

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
    gpu_memory_bytes: Optional[int] = None  # None: no budget to compare with
    device_type: str = "cuda"  # the device the run will use: it decides the attention kernel
    host_memory_bytes: Optional[int] = None  # per node; None: no host budget to compare with
    host_memory_source: str = ""  # where host_memory_bytes comes from when it is not --host-memory's

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
    parameters_total: int                # the whole model's parameters (tied counted once)
    parameters_local: int                # Psi of this rank's TP shard
    model_state_bytes: dict[str, int]    # parameters, gradients, master_weights, optimizer_states, total
    buffer_bytes: int                    # constant-size reduce buckets and scatter outputs (C_B)
    host_model_state_bytes: dict[str, int]  # the same categories in host memory (offload), per rank
    host_buffer_bytes: int               # host memory: constant buffers outside the model states (none today)
    offload_copy_bytes: int              # --offload-param: the device copies of shards in flight at the peak
    stage3_live_chunk_bytes: int         # the most gathered parameter bytes at once (stage 3)
    stage3_prefetch_elements: int
    checkpoint_bytes: dict[str, int]     # checkpointed inputs kept: {"device", "host"}
    # M_D's buffer (zero/checkpoint_buffer.py): a slot set per micro-batch in flight, allocated whole at the first
    # checkpoint and held; the checkpoints in it are not in saved_activation_bytes. {"device", "host" (P_a+cpu)}
    contiguous_checkpoint_buffer_bytes: dict[str, int]
    saved_activation_bytes: dict[str, int]  # peak saved for backward over the iteration: {"device", "host"}
    block_saved_bytes: dict[str, int]    # one block's saved tensors: {"forward", "backward"} (recompute)
    logits_bytes: int                    # one micro-batch's logits shard, in the training dtype
    # the fp32 softmax the vocab-parallel loss keeps for backward: the main loss's and each MTP layer's (gpt/mtp.py)
    loss_softmax_bytes: int
    gradient_working_bytes: int          # the logits gradient and a block backward's (gpt/shape.py's widths)
    step_working_bytes: int              # what the optimizer step allocates at its peak, copies included
    # what a resume reads on this rank: its partition's master and moments, at any saved layout (checkpoint/global_load.py)
    checkpoint_read_bytes: int
    parameter_gradient_bytes: int        # the largest gradient autograd hands the reducer (tied: summed)
    transport_copy_bytes: dict[str, int]  # gloo's copy of the largest collective: {"passes", "step"}
    process_baseline_bytes: int          # CPU: this process's RSS at the start of the plan (not in total)
    comm_bytes: dict[str, dict[str, int]]  # per group and kind, one iteration (as in metrics.jsonl)
    flops_per_iteration: float
    flops_per_gpu: float
    total_bytes: int = 0                 # the run's peak: from iteration 2 on (the constant buffers held throughout)
    first_iteration_bytes: int = 0       # iteration 1's peak (its constant buffers appear at its first reduction)
    budget_bytes: Optional[int] = None
    headroom_bytes: Optional[int] = None
    host_total_bytes: int = 0            # this rank's host memory: offloaded states, buffer, P_a+cpu checkpoints,
                                         # the staged checkpoint
    # --async-save: the copy of this rank's checkpoint files a save stages in host memory and holds until they are
    # written (checkpoint/ours/async_save.py staged_bytes_bound); 0 when saves are synchronous
    checkpoint_staging_bytes: int = 0
    # FP8 (gpt/fp8.py): delayed scaling's amax histories and scales, and --fp8-param-gather's FP8 bytes held
    # between steps (zero/fp8_params.py: each rank's shards, and under ZeRO 1-2 the gathered weights)
    fp8_state_bytes: int = 0
    # each FP8 weight's cast kept for the iteration's later micro-batches (parallel/fp8/weight_cache.py: its data and
    # transpose, ~2 bytes an element, and the block recipes' scales), alive from its first forward to the end of the
    # iteration's micro-batches: part of the passes' working set
    fp8_weight_cache_bytes: int = 0
    # --cuda-graph-impl local/transformer_engine on CUDA (training/cuda_graphs.py): the captured regions' static input
    # and incoming-gradient buffers and the gradient arena, held the whole run; and the graphs' pool, which keeps the
    # captured regions' activations and temporaries reserved through the optimizer step (an upper bound: every
    # activation saved at the forward's peak and the block gradients in flight)
    cuda_graph_static_bytes: int = 0
    cuda_graph_pool_bytes: int = 0
    ranks_per_node: int = 1
    host_budget_bytes: Optional[int] = None  # per node, shared by its ranks
    host_budget_source: str = ""         # "" for --host-memory; else whose memory it is (this machine's)
    unknowns: list[str] = field(default_factory=lambda: list(UNKNOWNS))
    notes: list[str] = field(default_factory=list)
    pipeline: Optional[PipelineFigures] = None  # with pipeline stages: the stage's schedule figures
    moe: Optional[MoEFigures] = None     # a mixture of experts: the experts' states and worst-case rows
    micro_batches: int = 1               # a step's micro-batches per DP rank (gradient accumulation, or the schedule's M)
    simulated_micro_batches: int = 1     # those the plan ran: one step's peak needs no more (planner/plan_observer.py)

    @property
    def p2p_held_bytes(self) -> int:
        return self.pipeline.p2p_held_bytes if self.pipeline is not None else 0

    @property
    def host_node_bytes(self) -> int:
        """Host memory of a node: every rank on it holds as much as this one (DP ranks hold equal shards)."""
        return self.host_total_bytes * self.ranks_per_node

    @property
    def fits_host(self) -> Optional[bool]:
        return None if self.host_budget_bytes is None else self.host_node_bytes <= self.host_budget_bytes

    @property
    def fits_device(self) -> Optional[bool]:
        return None if self.budget_bytes is None else self.total_bytes <= self.budget_bytes

    @property
    def fits(self) -> Optional[bool]:
        """Both memories: the device's budget, and the node's host memory where one was given."""
        if self.budget_bytes is None:
            return None
        return self.fits_device and self.fits_host is not False

    @property
    def binding(self) -> Optional[str]:
        """Which memory is the tighter, as the fraction of its budget used: "device" or "host" (None
        without both budgets)."""
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
    """The saved-for-backward bytes each block adds while it runs, in forward (read from the
    monitor's meter, the one --report-memory uses) and, for a recompute under checkpointing, in
    backward (from a meter of its own that is active only there): forward pre- and post-hooks on
    every block read them."""

    def __init__(self, blocks, monitor: ActivationMonitor, progress: Optional["_Progress"] = None,
                 device_type: str = "cuda", attention_backend: str = "auto") -> None:
        self.monitor = monitor
        self.device_type = device_type
        self.attention_backend = attention_backend
        # torch runs a custom Function's backward with no torch-function mode on the stack (the checkpoint's
        # recompute, zero/activations.py, included), so the dry run's AttentionKernelOf, entered around the
        # iteration, does not reach a recompute: each block re-enters it there, or the meta SDPA takes the math path
        # and plans the [b, heads, s, s] weights the planned device's kernel never keeps.
        self._recompute_kernel: Optional[AttentionKernelOf] = None
        self.backward_meter = SavedTensorMeter(META)
        self.phase = "forward"
        self.peak = {"forward": 0, "backward": 0}
        self.progress = progress
        # What is saved at once beyond the forward's meter's peak, sampled where it peaks: "recompute" at the end of
        # each block's recompute in backward (beside the checkpoints still kept), "copy" at each gloo copy (beside
        # what is saved as its collective starts), "saved" as each constant buffer is created. Split by whether the
        # constant buffers exist yet (zero/flat_buffer.py BufferPool: created at the first reduction, late in
        # iteration 1's backward), with them added ("with").
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
        """The device bytes saved for backward now: the iteration's meter and, in backward, the recompute's."""
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
        """The most a kind of sample held in iteration 1, with the constant buffers that existed then."""
        return max(self.samples[kind]["before"], self.samples[kind]["with"])

    def first_iteration_forward(self, forward_peak: int) -> int:
        """The forward meter's peak in iteration 1, with the constant buffers if it was reached after they appeared."""
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
        if self.phase == "backward":  # a recompute's saved tensors, all of them, beside the checkpoints not yet freed
            self.sample("recompute")
        if self.progress is not None:
            self.progress.at(self.phase, index)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                # Fires when backward reaches this block: the half of the work no forward hook sees.
                output.register_hook(functools.partial(self._backward_reached, index))

    def _backward_reached(self, index, grad):
        self.progress.at("backward", index)

    def remove(self) -> None:
        self._leave_recompute_kernel()  # a recompute that raised
        for handle in self._handles:
            handle.remove()


class _Progress:
    """Where a dry run is (micro-batch, phase, layer), said at most every PROGRESS_INTERVAL_S."""

    def __init__(self, emit: Callable[[str], None], layers: int, micro_batches: int) -> None:
        self.lines = ProgressLines(emit, PROGRESS_INTERVAL_S)
        self.layers, self.micro_batches = layers, micro_batches
        self.micro_batch = 0
        self.planned = micro_batches  # the micro-batches a plan runs: the step's M (or M') and the rest repeat them

    def at(self, phase: str, index: int) -> None:
        self.lines.update(lambda: f"dry run: micro-batch {self.micro_batch + 1} of the step's {self.micro_batches} "
                                  f"({self.planned} planned, the others repeat them), {phase}, "
                                  f"layer {index + 1}/{self.layers}")


def check_plannable(model: ModelConfig) -> None:
    """Refuse a model deeper, or with more experts per layer, than a dry run plans (see the module docstring)."""
    if model.num_layers > MAX_PLAN_LAYERS:
        raise ConfigError(f"--num-layers {model.num_layers}: a dry run plans at most {MAX_PLAN_LAYERS} layers "
                          f"(MAX_PLAN_LAYERS in planner/dry_run.py; each costs about 0.02 s and 0.1 MB per micro-batch, "
                          f"and the deepest published Transformers have about 1,000); plan a shallower model")
    if model.num_layers + model.mtp.num_layers > MAX_PLAN_LAYERS:  # each MTP layer is a block too
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
    """Plan rank `rank` of a run of `config` on `cluster` (see the module docstring). `progress`, if
    given, receives a line now and then while a long dry run works. `batch`: the run's batch schedule
    when the caller has it already (a training run's predicted peak), so it is not computed again."""
    check_plannable(config.model)
    check_tensor_sizes(config, vocab_size)
    # On CPU a rank's process holds Python, torch and our modules before it builds anything; the
    # planner's own process has the same, so its RSS now stands in for that baseline.
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
    # The trainer's build (training/build.py) on the meta device with the virtual state's counting
    # communicator; no dropout streams (a plan must not reseed the caller's generators) and nothing
    # to compile.
    built = build(plan, state, dropout_rng=False, torch_compile=False)
    model, zero, monitor, checkpointing = built.model, built.zero, built.activations, built.checkpointing
    probe = _BlockSavedProbe(model.blocks, monitor, ticker, cluster.device_type, config.model.attention.attention_backend)
    expert_rows = ExpertRowProbe(model, probe._live, cluster.device_type) if config.model.moe is not None else None
    # The trainer's own step (training/train_step.py, training/pipeline_step.py) runs one iteration, watched by the
    # plan's observer: every collective it makes is counted as it is made. Every micro-batch reads one meta batch.
    tokens = torch.zeros((config.training.micro_batch_size, config.model.seq_length + 1), dtype=torch.long, device=META)
    batches = itertools.repeat({"tokens": tokens})
    if pp > 1:
        # with context parallelism a stage runs and sends its CP rank's chunks (training/pipeline_step.py)
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

    # Split by which buffer each storage is (offload's host tensors, the rest on the device): on the
    # meta device, tensor.device cannot say.
    placed = measure_by_placement(optimizer.model_state_tensors(), host_resident_tensors(optimizer),
                                  include_meta=True)
    held, host_held = placed["device"], placed["host"]
    param_bytes = _element_bytes(plan.param_dtype)
    gatherer = getattr(optimizer.parameters, "gatherer", None)
    # with context parallelism a rank holds its CP chunks of each sequence
    micro, seq = config.training.micro_batch_size, config.model.seq_length // state.context_parallel_size
    # The logits' width on this rank, as the model's output layer has it (gpt/shape.py).
    shape = model_shape(config.model, tp)
    local_vocab = shape.output_matmul(plan.padded_vocab_size).out_features
    if not model.stage.last:  # the logits and the loss are the last stage's
        local_vocab = 0
    hidden_bytes = micro * seq * config.model.hidden_size * param_bytes
    logits = micro * seq * local_vocab * param_bytes
    # The gradients a block's backward holds beside its saved tensors, at its peak (the MLP's backward), read from
    # the block's shapes: the gradient arriving at its output (hidden-wide), under recompute the recomputed output
    # (the checkpoint's backward holds it until autograd has run through the block), and the MLP's activation
    # gradients (gpt/shape.py mlp_gradient_features: one ffn-wide for GPT-2, two for SwiGLU). A CPU profile of one
    # block's recompute and backward read these, 6 hidden-wide for GPT-2 and 7 for SwiGLU at ffn 2.5 x hidden
    # (whole sequences; under sequence parallelism the boundaries are this rank's slice, 1/TP of the sequence).
    # An MoE block's MLP is its experts (each its own --moe-ffn-hidden-size, on the rows an expert matmul takes at
    # once under the dry run's uniform routing: ExpertRowProbe) and the shared expert (every token); the widest
    # MLP backward among the model's blocks is the peak.
    boundaries = (2 if config.activations.checkpoint_activations else 1) * hidden_bytes \
        // (tp if config.parallel.sequence_parallel else 1)
    # (a pattern's mixer-only blocks run no MLP)
    mlp_features = micro * seq * shape.mlp_gradient_features if shape.dense_layers > shape.layers_without_mlp else 0
    if shape.moe_blocks and expert_rows is not None:
        mlp_features = max(mlp_features, expert_rows.rows_at_once * shape.moe_expert_gradient_features,
                           micro * seq * shape.moe_shared_gradient_features)
    # A mixer-only `M` or `G` block's backward: its scan's working memory in fp32 (gpt/shape.py ScanShape), if larger
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
        # on a CPU the norm's fp64 conversion is one block at a time (zero/grad_norm.py); CUDA's kernel copies nothing
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
    # The peak: model states and buffers always, and on top the larger of two working sets that are
    # never alive together. In forward and backward: the most parameters stage 3 gathers at once, the
    # most activations saved at once (checkpoints, a recomputed group, the loss's softmax) and,
    # transient at the loss, the logits and the gradients flowing back, parameter gradients before
    # the reducer takes them, and on CPU gloo's copy of the largest collective (all counted together:
    # an upper bound, but for the copy, which is read at its collective below).
    # In the step, after backward freed all of that: what the step allocates (the gradient partition,
    # or publishing's copies and gloo's copy of its largest gather; AdamW's fused kernel nothing, AdEMAMix three
    # fp32 windows: zero/ademamix.py, Sophia-G two: zero/sophia.py).
    # With pipeline stages, the saved activations, the held sends and gloo's copy peak at different slots of the
    # schedule: the simulation's peak of the three stands for their sum (planner/pipeline_plan.py).
    # Without stages, gloo's copy counts with the activations still saved when its collective starts
    # (planner/plan_observer.py): the gradients' reduction comes at the end of backward, when most are freed.
    # Under activation checkpointing a block's recompute in backward saves its tensors beside the checkpoints not
    # yet freed: the probe reads both meters at the end of each recompute, where that block's are all saved. By then
    # the output layer's backward has run, so the logits and their gradient are freed (`in_backward`).
    # The FP8 weights' casts, from each one's first forward to the end of the micro-batches (the most the dry run's
    # caches held: meta tensors of the live ones' shapes)
    result.fp8_weight_cache_bytes = sum(cache.peak_bytes for cache in fp8_weight_caches(model))
    transients = (result.stage3_live_chunk_bytes + logits + result.gradient_working_bytes
                  + result.parameter_gradient_bytes + result.offload_copy_bytes + result.fp8_weight_cache_bytes)
    in_backward = transients - 2 * logits
    copied = bool(copies["passes"])
    if pipeline is not None:
        # a parameter's gradient counts where it arrives (read at that moment), not on top of the schedule's peak;
        # a recompute in a backward slot: beside the checkpoints of every chunk-forward in flight then (the meter's),
        # and at most the sends held (an upper bound: the schedule's peak of the three is read at its slots)
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
    # M_D's buffer, allocated at iteration 1's first checkpoint and held
    device_contiguous = result.contiguous_checkpoint_buffer_bytes["device"]
    result.total_bytes = held["total"] + result.fp8_state_bytes + result.buffer_bytes + device_contiguous \
        + result.cuda_graph_static_bytes + max(passes, result.step_working_bytes + result.cuda_graph_pool_bytes)
    # Iteration 1 holds less than the later ones: the constant buffers appear at its first reduction (late in the
    # last micro-batch's backward, after the forward's peak), and are held from then on. Its peak, what a live run's
    # line after iteration 1 measures, takes each figure with the buffers that exist when it is reached. With
    # pipeline stages the schedule's peak is the same in every iteration (its slots come before the last backward's
    # reduction): measured on a PP 2 x DP 2 CPU run, each rank's peak RSS grew by the buffers' 6 MiB in iteration 2
    # (tests/planner/test_plan_pipeline_live.py).
    result.first_iteration_bytes = result.total_bytes
    if not (graphs is not None and graphs.captures and graphs.capture_iteration == 1):
        first_passes = passes if pipeline is not None else max(
            transients + max(probe.first_iteration_forward(meter.peak["device"]),
                             probe.first_iteration("copy") if copied else 0),
            in_backward + max(probe.first_iteration("recompute"), probe.first_iteration("saved")))
        result.first_iteration_bytes = held["total"] + result.fp8_state_bytes + device_contiguous \
            + max(first_passes, result.buffer_bytes + result.step_working_bytes)
    if config.checkpoint.saves_in_background:  # the partition: the fp32 master and the moments, wherever they live
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
        # gpt/cp_attention.py computes each ring block's scores explicitly (no fused kernel per block): a transient
        # the saved-tensor meter does not see; a2a+p2p's ring holds 1/A of the heads over A times the tokens
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
        # gpt/moe/layer.py _balanced_on_meta: no routing decision exists on the meta device; planner/moe_plan.py
        # bounds what an unbalanced step adds
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
    """--offload-param: each gather copies its unit's 1/N piece of the host shard to the device and
    holds it until the gather completes (zero/stage3.py). The replay's gatherer tracks gathered chunks
    and those copies together: what its joint peak holds beyond the gathered peak, so the two rows sum
    to the device's peak of both."""
    if gatherer is None or not zero.offload_param:
        return 0
    return (gatherer.peak_device_numel - gatherer.peak_live_numel) * param_bytes


def _parameter_gradient_bytes(model, param_bytes: int) -> int:
    """The largest gradient autograd materializes for one parameter before the reducer's hook takes
    it, in the parameter's dtype: the token embedding's, which arrives twice (the embedding lookup and
    the tied output layer) and is summed while both are alive. A weight whose linear fuses its gradient's
    accumulation (zero/fused_accumulation.py) has none: its GEMM adds into the main gradient."""
    fused = fused_weights(model)
    largest = max((p.numel() for p in model.parameters() if id(p) not in fused), default=0)
    tied = getattr(getattr(model, "word_embeddings", None), "weight", None)
    # both uses on one stage only: with pipeline stages the first holds the lookup, the last the output layer
    if tied is not None and tied.numel() == largest and model.stage.first and model.stage.last:
        largest *= 2
    return largest * param_bytes


def fp8_state_bytes(model, parameter_storage) -> int:
    """What FP8 holds between steps besides the model states: each delayed-scaling linear's amax history
    (history length x 3 fp32) and scales (3 fp32), and --fp8-param-gather's bytes (zero/fp8_params.py)."""
    held = sum(tensor.numel() * tensor.element_size() for scaling in delayed_states(model).values()
               for tensor in (scaling.amax_history, scaling.scale))
    gathered = getattr(parameter_storage, "fp8", None)
    return held + (gathered.resident_bytes() if gathered is not None else 0)


def _buffer_bytes(checkpointing, on_host: bool) -> dict[str, int]:
    """M_D's buffer by where it lives: the device, or host memory with P_a+cpu."""
    held = checkpointing.contiguous.nbytes() if checkpointing is not None and checkpointing.contiguous else 0
    return {"device": 0 if on_host else held, "host": held if on_host else 0}
