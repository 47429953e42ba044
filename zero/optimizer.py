"""The sharded optimizer: this rank's fp32 master partition, its Adam moments, and the step.

What a rank keeps depends only on its partition (zero.flat_buffer.FlatLayout): the whole TP shard with one part
(stage 0), 1/N of it with N parts (stages 1-3). The step never asks which stage it is:
    1. take this rank's partition of the averaged gradient from the reducer (fp32), unscale it;
    2. the global gradient norm: squares summed in fp64 (zero/grad_norm.py), all-reduced over TP (TP-replicated
       elements counted on TP rank 0 only) and over the group the partition is cut across;
    3. with fp16 loss scaling, an overflow (the agreed norm not finite) skips the step;
    4. clip, update the master with AdamW (PyTorch's fused kernel on CUDA and CPU, or the real apex's FusedAdam on
       CUDA): in place, nothing allocated the size of the partition;
    5. publish: the parameter storage makes the 16-bit parameters equal the new master weights.

AdamW sees the master as a handful of segment views (one run of one kind each), with and without weight decay, and
with Megatron-LM's --decoupled-lr the same two for the embedding and output weights, cut out of the segments (the
norm still reads whole segments): a cut a multiple of 64 elements from its segment's start changes no bit of the
fused CPU kernel's result (zero/offload.py PIECE_ALIGNMENT); elsewhere a neighbour may differ in the last bit. The
moments are flat tensors in partition coordinates, so a checkpoint saves each as one tensor and an elastic resume
refills them element by element. --optimizer ademamix (zero/ademamix.py) adds a third state, exp_avg_slow, treated
alike; --optimizer sophiag (zero/sophia.py) keeps its Hessian estimate in exp_avg_sq's place; --optimizer muon
(zero/muon.py) takes its matrices' ranges out of AdamW's pieces and steps them after AdamW, its momentum in exp_avg."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import nn

from zero.ademamix import TEMPORARIES as ADEMAMIX_TEMPORARIES
from zero.ademamix import WINDOW as ADEMAMIX_WINDOW
from zero.ademamix import AdEMAMix
from zero.flat_buffer import FlatLayout, Unit
from zero.grad_norm import block_copy_bytes, sum_of_squares
from zero.grad_reducer import GradientReducer
from zero.loss_scaler import LossScaler
from zero.muon import MuonMatrix, MuonTensorParallel, muon_ranges, muon_step
from zero.optimizer_state import CheckpointableOptimizer, NamedFragment, ShardedOptimizerState, check_partition_tensors
from zero.param_storage import ParameterStorage
from zero.precision_aware import TEMPORARIES as PRECISION_AWARE_TEMPORARIES
from zero.precision_aware import WINDOW as PRECISION_AWARE_WINDOW
from zero.precision_aware import PrecisionAwareAdamW
from zero.sophia import TEMPORARIES as SOPHIA_TEMPORARIES
from zero.sophia import WINDOW as SOPHIA_WINDOW
from zero.sophia import SophiaG

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class StepPiece:
    """A range of the partition [start, end) that AdamW sees as one parameter, of one decay kind and one
    learning rate (the decoupled one of the embedding and output weights, or the others')."""
    start: int
    end: int
    weight_decay: bool
    decoupled_lr: bool = False


@dataclass(frozen=True)
class StepResult:
    grad_norm: float   # global norm of the unscaled, averaged gradient, before clipping
    skipped: bool      # True when an overflow made every rank skip the update (fp16)
    loss_scale: float  # the scale the gradients of this step were computed with


def apex_fused_adam():
    """NVIDIA apex's FusedAdam when the real apex (built from source) is installed, else None."""
    try:
        from apex.optimizers import FusedAdam
    except ImportError:
        return None
    return FusedAdam


def build_adamw(param_groups: list[dict], config, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with the fastest kernel available: apex FusedAdam on CUDA when the real apex is
    installed, else PyTorch's fused kernel (CUDA and CPU)."""
    betas = (config.adam_beta1, config.adam_beta2)
    fused_adam = apex_fused_adam() if device.type == "cuda" else None
    if fused_adam is not None:
        return fused_adam(param_groups, lr=config.lr, betas=betas, eps=config.adam_eps, adam_w_mode=True)
    # The fused kernel updates each element in one pass; the foreach kernel would allocate
    # temporaries the size of the partition during the step (on CPU, +1x the fp32 partition).
    return torch.optim.AdamW(param_groups, lr=config.lr, betas=betas, eps=config.adam_eps, fused=True)


def uses_ademamix(config) -> bool:
    """Whether `config` (an OptimizerConfig) asks for swiss-ai's AdEMAMix (--optimizer ademamix)."""
    return getattr(config, "optimizer", "adam") == "ademamix"


def uses_sophiag(config) -> bool:
    """Whether `config` (an OptimizerConfig) asks for ALCF's Sophia-G (--optimizer sophiag, zero/sophia.py)."""
    return getattr(config, "optimizer", "adam") == "sophiag"


def muon_tensor_parallel(mode: str, state) -> MuonTensorParallel:
    """The TP group the Muon matrices cut over TP are stepped over, per --muon-tp-mode (zero/muon.py)."""
    group, comm = state.tensor_parallel_group, state.comm
    return MuonTensorParallel(mode, state.tensor_parallel_size, state.tensor_parallel_rank,
                              lambda output, shard: comm.all_gather(output, shard, group, "tp"),
                              lambda tensor: comm.all_reduce(tensor, group, "tp"))


def uses_muon(config) -> bool:
    """Whether `config` (an OptimizerConfig) asks for Megatron-LM's Muon (--optimizer muon, zero/muon.py)."""
    return getattr(config, "optimizer", "adam") == "muon"


def moment_dtypes(config) -> dict[str, torch.dtype]:
    """The stored dtype of each Adam moment (--exp-avg-dtype, --exp-avg-sq-dtype: fp32 or bf16)."""
    algorithms = getattr(config, "algorithms", None)
    return {key: PRECISION_DTYPES[getattr(algorithms, f"{key}_dtype", "fp32")] for key in ("exp_avg", "exp_avg_sq")}


def uses_precision_aware_moments(config) -> bool:
    """Whether a moment is stored in a lower precision than fp32 (zero/precision_aware.py steps it)."""
    return any(dtype != torch.float32 for dtype in moment_dtypes(config).values())


def build_step_optimizer(param_groups: list[dict], config, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer --optimizer names over the partition's views: AdamW, AdEMAMix (zero/ademamix.py) or Sophia-G
    (zero/sophia.py, its momentum and Hessian estimate in Adam's two slots); AdamW with bf16 moments is
    zero/precision_aware.py's."""
    if (uses_ademamix(config) or uses_sophiag(config)) and uses_precision_aware_moments(config):
        raise ValueError("AdEMAMix and Sophia-G keep fp32 states (the forks'); bf16 moments are Adam's only")
    if uses_sophiag(config):
        algorithms = config.algorithms
        return SophiaG(param_groups, lr=config.lr, betas=(algorithms.sophiag_beta1, algorithms.sophiag_beta2),
                       rho=algorithms.sophiag_rho)
    if uses_ademamix(config):
        algorithms = config.algorithms
        return AdEMAMix(param_groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2, algorithms.ademamix_beta3),
                        alpha=algorithms.ademamix_alpha, beta3_warmup=algorithms.ademamix_beta3_warmup,
                        alpha_warmup=algorithms.ademamix_alpha_warmup, eps=config.adam_eps)
    if uses_precision_aware_moments(config):
        return PrecisionAwareAdamW(param_groups, lr=config.lr, betas=(config.adam_beta1, config.adam_beta2),
                                   eps=config.adam_eps)
    return build_adamw(param_groups, config, device)


class ShardedAdamW(CheckpointableOptimizer):
    """AdamW over this rank's fp32 master partition; see the module docstring for the step."""

    def __init__(self, layout: FlatLayout, master: torch.Tensor, gradients: GradientReducer,
                 parameters: ParameterStorage, optimizer_config, loss_scaler: LossScaler, state,
                 partition_group, stage: int, decoupled_lr_ranges: Sequence[tuple[int, int]] = (),
                 muon: Sequence[MuonMatrix] = ()) -> None:
        self.layout = layout
        self.master = master
        self.gradients = gradients
        self.parameters = parameters
        self.optimizer_config = optimizer_config
        self.loss_scaler = loss_scaler
        self.parallel_state = state
        self.comm = state.comm
        self.partition_group = partition_group  # the DP group the partition is cut across; None if whole
        self.stage = stage  # for reports and checkpoint metadata only
        # With pipeline stages (zero/pipeline_grads.py): the group over which the norm's square is summed too,
        # and the partition ranges the norm leaves out (the last stage's copy of a tied embedding).
        self.pipeline_group = None
        self.norm_excluded: list[tuple[int, int]] = []
        self.device = master.device

        # AdamW over views of the master partition: one group with weight decay, one without (and the same
        # two at the decoupled learning rate, marked "decoupled_lr" for whoever sets the rates). The norm
        # reads the layout's segments; AdamW's views are its pieces (the segments cut at the decoupled
        # parameters' edges here, cut further by the host step's sub-groups in zero/offload.py).
        self._segments = layout.segments()
        self._decoupled_ranges = list(decoupled_lr_ranges)  # [start, end) in the partition: decoupled_ranges()
        self._muon = list(muon)  # --optimizer muon: every Muon matrix, with this rank's piece (zero/muon.py)
        self._muon_ranges = muon_ranges(self._muon)
        self._pieces = self.step_pieces()
        self._segment_params = [nn.Parameter(master[p.start:p.end]) for p in self._pieces]
        if self._muon:
            if type(self) is not ShardedAdamW:
                raise ValueError("--optimizer muon steps on the training device, not in the offloaded host step")
            # Muon's own group: its learning rate is set with the others' (training/train_step.py), its decay is
            # --weight-decay (Megatron-LM's Muon takes config.weight_decay).
            self._muon_group = {"params": [], "weight_decay": optimizer_config.weight_decay, "lr": optimizer_config.lr,
                                "decoupled_lr": False, "muon": True}
            self._muon_steps = 0
            self._muon_tp = muon_tensor_parallel(getattr(optimizer_config, "muon_tp_mode", "duplicated"), state)
        # (a partition with Muon's pieces only has no AdamW; the hybrid host/device split has two, zero/hybrid_offload.py)
        self._step_optimizers = self.build_step_optimizers()
        self.optimizer = self._step_optimizers[0] if self._step_optimizers else None
        self.param_groups = self._adam_groups() + ([self._muon_group] if self._muon else [])
        # The moments exist from the start (the zeros AdamW would create at its first step), as views
        # of two flat tensors beside the master (in host memory when it is offloaded); AdEMAMix's slow
        # momentum is a third.
        # (bf16 ones with --exp-avg-dtype / --exp-avg-sq-dtype bf16: zero/precision_aware.py)
        dtypes = moment_dtypes(optimizer_config)
        self.exp_avg = self.new_partition_tensor(dtypes["exp_avg"])
        self.exp_avg_sq = self.new_partition_tensor(dtypes["exp_avg_sq"])
        self.exp_avg_slow = self.new_partition_tensor() if uses_ademamix(optimizer_config) else None
        for optimizer in self._step_optimizers:
            for group in optimizer.param_groups:
                step_on_device = group.get("fused") or group.get("capturable")  # then beside its parameter
                for param, piece in zip(group["params"], self._group_pieces(group)):
                    optimizer.state[param] = {
                        "step": torch.zeros((), dtype=torch.float32, device=param.device if step_on_device else "cpu"),
                        **{key: moment[piece.start:piece.end] for key, moment in self.moments().items()}}

    def build_step_optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers that step the partition's pieces: one here (none for Muon's pieces only)."""
        groups = self.step_groups(self._segment_params, self._pieces)
        return [build_step_optimizer(groups, self.optimizer_config, self.device)] if groups else []

    def step_groups(self, params: Sequence[nn.Parameter], pieces: Sequence[StepPiece]) -> list[dict]:
        """`params` (views of `pieces`) in parameter groups: one with weight decay, one without, and the same two
        at the decoupled learning rate, marked "decoupled_lr" for whoever sets the rates."""
        groups = []
        for decoupled in (False, True):  # the usual groups first, as without a decoupled rate
            for decay in (True, False):
                members = [p for p, s in zip(params, pieces) if s.weight_decay == decay and s.decoupled_lr == decoupled]
                if members:
                    groups.append({"params": members,
                                   "weight_decay": self.optimizer_config.weight_decay if decay else 0.0,
                                   "decoupled_lr": decoupled})
        return groups

    def _adam_groups(self) -> list[dict]:
        return [group for optimizer in self._step_optimizers for group in optimizer.param_groups]

    def moments(self) -> dict[str, torch.Tensor]:
        """The optimizer's flat state tensors beside the master, by name: Adam's two, AdEMAMix's three."""
        moments = {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}
        if self.exp_avg_slow is not None:
            moments["exp_avg_slow"] = self.exp_avg_slow
        return moments

    @property
    def optimizer_name(self) -> str:
        """--optimizer's value this optimizer steps (checkpoint metadata: moments load only into the same)."""
        if self._muon:
            return "muon"
        if isinstance(self.optimizer, SophiaG):
            return "sophiag"
        return "ademamix" if self.exp_avg_slow is not None else "adam"

    def step_pieces(self) -> list[StepPiece]:
        """The ranges of the partition AdamW updates as one tensor each: the layout's segments, cut where a
        decoupled-rate parameter starts or ends."""
        pieces = []
        for segment in self._segments:
            edges = sorted({segment.start, segment.end,
                            *(edge for span in self._decoupled_ranges + self._muon_ranges for edge in span
                              if segment.start < edge < segment.end)})
            for start, end in zip(edges, edges[1:]):
                if any(lo <= start < hi for lo, hi in self._muon_ranges):
                    continue  # Muon's (zero/muon.py)
                decoupled = any(lo <= start < hi for lo, hi in self._decoupled_ranges)
                pieces.append(StepPiece(start, end, segment.kind.weight_decay, decoupled))
        return pieces

    def new_partition_tensor(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A zeroed tensor (fp32 unless asked) the size of the partition, where the master lives."""
        return torch.zeros_like(self.master, dtype=dtype)

    def _group_pieces(self, group: dict):
        index = {id(p): s for p, s in zip(self._segment_params, self._pieces)}
        return [index[id(p)] for p in group["params"]]

    # ---- the step -----------------------------------------------------------------------------

    def global_grad_norm(self, grads: torch.Tensor) -> float:
        """L2 norm over the whole model of the partition gradients `grads` (see the module docstring)."""
        return self.grad_norm_squared(grads).sqrt().item()

    def grad_norm_squared(self, grads: torch.Tensor) -> torch.Tensor:
        """The squared global norm as a 1-element fp64 tensor, summed over TP, the partition group and the
        pipeline stages (its collectives are the step's only ones besides publishing: see step_collectives_only)."""
        total = self.stage_grad_norm_squared(grads)
        self.comm.all_reduce(total, self.pipeline_group, "pp")
        return total

    def stage_grad_norm_squared(self, grads: torch.Tensor) -> torch.Tensor:
        """This pipeline stage's share of the squared norm: summed over TP and the partition group only (a
        chain of optimizers, zero/experts.py, adds its parts' shares before summing over the stages once). fp64
        from each rank's partial sum on (zero/grad_norm.py), so the norm does not depend on how the partition is
        cut."""
        pieces = [grads[s.start:s.end] for s in self._norm_segments()]
        # On the training device whatever `grads`' (the host, with offload): NCCL reaches only it.
        total = sum_of_squares(pieces, grads.device).reshape(1).to(self.parameters.device)
        self.comm.all_reduce(total, self.parallel_state.tensor_parallel_group, "tp")
        self.comm.all_reduce(total, self.partition_group, "dp")
        return total

    def _norm_segments(self) -> list:
        """The segments this rank's squares count: not those the pipeline leaves out, and TP-replicated ones
        on TP rank 0 only (every TP rank holds the same values)."""
        counted = [s for s in self._segments
                   if not any(lo <= s.start and s.end <= hi for lo, hi in self.norm_excluded)]
        if self.parallel_state.tensor_parallel_rank != 0:
            counted = [s for s in counted if s.kind.tensor_parallel]
        return counted

    def step(self) -> StepResult:
        """Unscale, agree on overflow, clip by the global norm, update this rank's partition with AdamW
        and publish the new 16-bit parameters."""
        scale = self.loss_scaler.scale
        grads = self.gradients.partition_gradients()
        if scale != 1.0:
            grads.mul_(1.0 / scale)
        norm = self.global_grad_norm(grads)
        overflow = not math.isfinite(norm)  # every rank sees the same all-reduced norm
        if overflow and self.loss_scaler.skips_on_overflow:
            self.loss_scaler.update(overflow=True)
            return StepResult(norm, skipped=True, loss_scale=scale)

        max_norm = self.optimizer_config.clip_grad
        if max_norm > 0 and math.isfinite(norm) and norm > max_norm:
            grads.mul_(max_norm / (norm + 1e-6))
        self.parameters.wait_all()  # an overlapped gather may still read the master the update writes (param_storage)
        self.update(grads)
        del grads
        self.publish_parameters()
        self.loss_scaler.update(overflow=False)
        return StepResult(norm, skipped=False, loss_scale=scale)

    def step_collectives_only(self) -> None:
        """The collectives `step` makes when it updates, without its arithmetic (which needs values): the
        gradient partition's norm over TP, the partition group and the stages, Muon's gathers (its arithmetic on
        meta tensors is shapes only), and publishing. The dry run (planner/dry_run.py) runs a train step on the
        meta device with this in place of `step`."""
        grads = self.gradients.partition_gradients()
        self.grad_norm_squared(grads)
        if self._muon:  # on the meta device its arithmetic costs nothing: its collectives are counted
            self._muon_update(grads)
        self.publish_parameters()

    def update(self, grads: torch.Tensor) -> None:
        """AdamW on the master partition from the unscaled, clipped gradient partition `grads`."""
        for param, piece in zip(self._segment_params, self._pieces):
            param.grad = grads[piece.start:piece.end]
        for optimizer in self._step_optimizers:
            optimizer.step()
        for param in self._segment_params:
            param.grad = None
        if self._muon:
            self._muon_update(grads)
            self._muon_steps += 1

    def _muon_update(self, grads: torch.Tensor) -> None:
        group = self._muon_group
        muon_step(self._muon, self.master, self.exp_avg, grads, group["lr"], group["weight_decay"],
                  self.optimizer_config.algorithms, lambda t: self.comm.all_reduce(t, self.partition_group, "dp"),
                  self._muon_tp)

    def step_working_bytes(self, gather_copy_bytes: int = 0, norm_in_blocks: bool = False) -> int:
        """What the step allocates on top of the model states at its peak: the fp32 gradient
        partition where the reducer cannot hand over its own (stages 0-1 without offload), and then publishing's
        copies (zero.param_storage) plus what the transport copies of its largest gather
        (`gather_copy_bytes`: gloo's, on CPU); nothing for AdamW, whose fused kernel updates in place
        (the foreach kernel would hold +1x the fp32 partition). Unscaling and clipping scale the
        gradient partition in place; the norm, before the update, converts a block at a time to fp64 where
        it runs on a CPU (`norm_in_blocks`; CUDA's kernel accumulates in fp64 without a copy: zero/grad_norm.py).
        The gradient partition is dropped before publishing, so the two are never alive together."""
        publishing = self.parameters.publish_working_bytes() + gather_copy_bytes
        norm = block_copy_bytes(max((s.end - s.start for s in self._norm_segments()), default=0)) \
            if norm_in_blocks else 0
        return max(self.gradients.partition_working_bytes() + max(norm, self.update_working_bytes()), publishing)

    def update_working_bytes(self) -> int:
        """What the update itself allocates: nothing for fused AdamW; Muon's temporaries over its largest matrix;
        AdEMAMix's three fp32 temporaries of one window (zero/ademamix.py), Sophia-G's two (zero/sophia.py), no larger
        than the largest piece it steps; with bf16 moments, two fp32 windows (zero/precision_aware.py)."""
        if self._muon:  # the gathered matrix, Newton-Schulz's X, A, B and the scaled result, about 5 fp32 matrices
            tp = self._muon_tp
            return 5 * max(m.newton_schulz_numel(tp.mode, tp.size) for m in self._muon) * self.master.element_size()
        if self.exp_avg_slow is not None:
            temporaries, window = ADEMAMIX_TEMPORARIES, ADEMAMIX_WINDOW
        elif isinstance(self.optimizer, SophiaG):
            temporaries, window = SOPHIA_TEMPORARIES, SOPHIA_WINDOW
        elif isinstance(self.optimizer, PrecisionAwareAdamW):
            temporaries, window = PRECISION_AWARE_TEMPORARIES, PRECISION_AWARE_WINDOW
        else:
            return 0
        largest = max((piece.end - piece.start for piece in self._pieces), default=0)
        return temporaries * min(window, largest) * self.master.element_size()

    def host_state_tensors(self) -> list[torch.Tensor]:
        """The model-state tensors this optimizer keeps in host memory whatever the device (zero/memory.py's
        host_resident_tensors): none here; offload's (zero/offload.py, zero/hybrid_offload.py)."""
        return []

    def host_working_bytes(self) -> int:
        """Host memory the step holds besides the model states: nothing, offloaded or not (the offloaded
        step reads the reducer's host gradient partition in place, zero/offload.py)."""
        return 0

    def publish_parameters(self) -> None:
        """Make the 16-bit parameters reflect the master weights (after a step, or after a checkpoint
        refilled the master). Every DP rank must call it: the storage may communicate."""
        self.parameters.publish(self.master)

    # ---- checkpoint state: what zero/optimizer_state.py's interface is built on ------------------

    @property
    def partitioned(self) -> bool:
        """Whether this rank's optimizer state is a 1/N shard (else every DP rank holds the same whole)."""
        return self.layout.parts > 1

    @property
    def adam_step(self) -> int:
        """Updates AdamW has applied (the same for every segment; skipped fp16 steps do not count)."""
        if self.optimizer is None:  # Muon's pieces only
            return self._muon_steps
        group = self.param_groups[0]
        if "step" in group:  # apex FusedAdam counts per group
            return int(group["step"])
        step = self.optimizer.state[group["params"][0]]["step"]
        return 0 if step.is_meta else int(step.item())  # the dry run's optimizer has taken no step

    @adam_step.setter
    def adam_step(self, step: int) -> None:
        if self._muon:
            self._muon_steps = step
        for optimizer in self._step_optimizers:
            for group in optimizer.param_groups:
                if "step" in group:
                    group["step"] = step
                for param in group["params"]:
                    optimizer.state[param]["step"].fill_(step)

    def gathered_parameters(self, unit: Unit):
        """A context in which `unit`'s parameters hold their full values (stage 3 gathers the chunk,
        a collective over the DP group, and frees it afterwards)."""
        return self.parameters.gathered(unit)

    def _partition_tensors(self) -> dict[str, torch.Tensor]:
        """The live partition states, by name (what a load fills)."""
        return {"master": self.master, **self.moments()}

    def _saved_partition_tensors(self) -> dict[str, torch.Tensor]:
        """What a checkpoint writes of them: the live tensors themselves here."""
        return self._partition_tensors()

    # ---- checkpointing (the interface of zero/optimizer_state.py) -------------------------------

    def model_state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        """Every parameter whole (this TP rank's piece), as CPU copies in the training dtype, by its
        name in `model` (a tied parameter under its first name). Stage 3 gathers each chunk in turn to
        copy it, a collective over the DP group, so every DP rank must call this; ranks that write no
        model file pass keep=False, take part in the gathers and hold no copies."""
        names = _parameter_names(model)
        weights: dict[str, torch.Tensor] = {}
        for unit in self.layout.units:
            with self.gathered_parameters(unit):
                if keep:
                    for slot in unit.slots:
                        weights[names[id(slot.param)]] = slot.param.detach().to("cpu", copy=True)
        return weights

    def sharded_state_dict(self, model: nn.Module) -> ShardedOptimizerState:
        """This rank's partition (the live tensors), its fragment table named by `model`'s parameter
        names, and the scalar state: what a checkpoint writes for this rank, and the layout a loaded
        partition must be given in."""
        names = _parameter_names(model)
        fragments = [NamedFragment(names[id(f.slot.param)], f.param_offset, f.partition_offset, f.numel)
                     for f in self.layout.fragments()]
        return ShardedOptimizerState(
            tensors=self._saved_partition_tensors(), fragments=fragments, replicated=not self.partitioned,
            zero_stage=self.stage, adam_step=self.adam_step, loss_scaler_type=type(self.loss_scaler).__name__,
            loss_scaler_state=self.loss_scaler.state_dict(), param_dtype=self.parameters.dtype,
            optimizer=self.optimizer_name)

    def load_sharded_state_dict(self, tensors: dict[str, torch.Tensor], adam_step: Optional[int] = None,
                                loss_scaler_state: Optional[dict] = None) -> None:
        """Restore this rank's partition from `tensors`, laid out by `sharded_state_dict`'s fragments:
        "master" alone (the weights; moments, step and scaler stay as they are) or master and every
        moment (Adam's two, AdEMAMix's three). Then publish the 16-bit parameters from the new master, which every DP rank must do
        (the storage may communicate), and set the step and the loss scaler's state when given.
        `tensors` is emptied as it is copied: the caller's staged copies are freed before publishing,
        whose working memory would otherwise come on top of them."""
        live = self._partition_tensors()
        check_partition_tensors(tensors, {key: tensor.shape for key, tensor in live.items()})
        for key in list(tensors):
            live[key].copy_(tensors.pop(key))
        self.publish_parameters()
        if adam_step is not None:
            self.adam_step = adam_step
        if loss_scaler_state is not None:
            self.loss_scaler.load_state_dict(loss_scaler_state)

    # ---- introspection ------------------------------------------------------------------------

    def model_state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The live tensors of the model states this rank holds, for zero/memory.py to measure (views
        of one flat buffer are de-duplicated there by storage)."""
        return {"parameters": self.parameters.tensors(), "gradients": self.gradients.gradient_tensors(),
                "master_weights": [self.master], "optimizer_states": list(self.moments().values()),
                "buffers": self.gradients.buffer_tensors()}

    @property
    def num_parameters(self) -> int:
        return self.layout.num_parameters

    @property
    def padding(self) -> int:
        """Alignment padding elements in the flat layout (what memory and bytes may exceed Psi by)."""
        return self.layout.padding


def decoupled_ranges(layout: FlatLayout, params: Sequence[nn.Parameter]) -> list[tuple[int, int]]:
    """Where `params`' elements lie in this rank's partition, as [start, end) ranges (taken before the
    parameter storage binds new parameters in their place: the partition's geometry stays)."""
    wanted = {id(param) for param in params}
    return [(f.partition_offset, f.partition_offset + f.numel) for f in layout.fragments() if id(f.slot.param) in wanted]


def _parameter_names(model: nn.Module) -> dict[int, str]:
    """id(param) -> its name in `model` (a tied parameter under its first name)."""
    return {id(param): name for name, param in model.named_parameters()}
