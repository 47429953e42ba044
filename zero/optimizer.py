"""The sharded optimizer: this rank's fp32 master partition, its moments, and the step (unscale, fp64 global norm, skip
on fp16 overflow, clip, update in place, publish), the same at every stage. AdamW sees the master as segment views cut
at 64-element multiples, so the fused CPU kernel's bits do not change."""

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
    """A partition range AdamW sees as one parameter, of one decay kind and one learning rate."""
    start: int
    end: int
    weight_decay: bool
    decoupled_lr: bool = False


@dataclass(frozen=True)
class StepResult:
    grad_norm: float   # of the unscaled, averaged gradient, before clipping
    skipped: bool      # an overflow made every rank skip the update (fp16)
    loss_scale: float


def apex_fused_adam():
    """NVIDIA apex's FusedAdam when the real apex is installed, else None."""
    try:
        from apex.optimizers import FusedAdam
    except ImportError:
        return None
    return FusedAdam


def build_adamw(param_groups: list[dict], config, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with apex FusedAdam on CUDA when installed, else PyTorch's fused kernel."""
    betas = (config.adam_beta1, config.adam_beta2)
    fused_adam = apex_fused_adam() if device.type == "cuda" else None
    if fused_adam is not None:
        return fused_adam(param_groups, lr=config.lr, betas=betas, eps=config.adam_eps, adam_w_mode=True)
    # fused updates in one pass; foreach allocates partition-sized temporaries
    return torch.optim.AdamW(param_groups, lr=config.lr, betas=betas, eps=config.adam_eps, fused=True)


def uses_ademamix(config) -> bool:
    return getattr(config, "optimizer", "adam") == "ademamix"


def uses_sophiag(config) -> bool:
    return getattr(config, "optimizer", "adam") == "sophiag"


def muon_tensor_parallel(mode: str, state) -> MuonTensorParallel:
    group, comm = state.tensor_parallel_group, state.comm
    return MuonTensorParallel(mode, state.tensor_parallel_size, state.tensor_parallel_rank,
                              lambda output, shard: comm.all_gather(output, shard, group, "tp"),
                              lambda tensor: comm.all_reduce(tensor, group, "tp"))


def uses_muon(config) -> bool:
    return getattr(config, "optimizer", "adam") == "muon"


def moment_dtypes(config) -> dict[str, torch.dtype]:
    """The stored dtype of each Adam moment (--exp-avg-dtype, --exp-avg-sq-dtype)."""
    algorithms = getattr(config, "algorithms", None)
    return {key: PRECISION_DTYPES[getattr(algorithms, f"{key}_dtype", "fp32")] for key in ("exp_avg", "exp_avg_sq")}


def uses_precision_aware_moments(config) -> bool:
    return any(dtype != torch.float32 for dtype in moment_dtypes(config).values())


def build_step_optimizer(param_groups: list[dict], config, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer --optimizer names over the partition's views."""
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
    """AdamW over this rank's fp32 master partition (the module docstring's step)."""

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
        # with pipeline stages: the norm's extra group and the ranges it leaves out
        self.pipeline_group = None
        self.norm_excluded: list[tuple[int, int]] = []
        self.device = master.device

        # AdamW's views: the segments cut at decoupled parameters' edges
        self._segments = layout.segments()
        self._decoupled_ranges = list(decoupled_lr_ranges)
        self._muon = list(muon)  # --optimizer muon: every Muon matrix, with this rank's piece
        self._muon_ranges = muon_ranges(self._muon)
        self._pieces = self.step_pieces()
        self._segment_params = [nn.Parameter(master[p.start:p.end]) for p in self._pieces]
        if self._muon:
            if type(self) is not ShardedAdamW:
                raise ValueError("--optimizer muon steps on the training device, not in the offloaded host step")
            # Muon's own group; its decay is --weight-decay, as Megatron-LM's Muon.
            self._muon_group = {"params": [], "weight_decay": optimizer_config.weight_decay, "lr": optimizer_config.lr,
                                "decoupled_lr": False, "muon": True}
            self._muon_steps = 0
            self._muon_tp = muon_tensor_parallel(optimizer_config.algorithms.muon_tp_mode, state)
        self._step_optimizers = self.build_step_optimizers()
        self.optimizer = self._step_optimizers[0] if self._step_optimizers else None
        self.param_groups = self._adam_groups() + ([self._muon_group] if self._muon else [])
        # The moments exist from the start, views of flat tensors beside the master.
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
        """The optimizers that step the partition's pieces."""
        groups = self.step_groups(self._segment_params, self._pieces)
        return [build_step_optimizer(groups, self.optimizer_config, self.device)] if groups else []

    def step_groups(self, params: Sequence[nn.Parameter], pieces: Sequence[StepPiece]) -> list[dict]:
        """`params` in groups by weight decay and decoupled learning rate."""
        groups = []
        for decoupled in (False, True):  # the usual groups first
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
        """The flat state tensors beside the master, by name."""
        moments = {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}
        if self.exp_avg_slow is not None:
            moments["exp_avg_slow"] = self.exp_avg_slow
        return moments

    @property
    def optimizer_name(self) -> str:
        """--optimizer's value (checkpoint metadata: moments load only into the same optimizer)."""
        if self._muon:
            return "muon"
        if isinstance(self.optimizer, SophiaG):
            return "sophiag"
        return "ademamix" if self.exp_avg_slow is not None else "adam"

    def step_pieces(self) -> list[StepPiece]:
        """The ranges AdamW updates: the segments, cut at decoupled-rate and Muon parameters' edges."""
        pieces = []
        for segment in self._segments:
            edges = sorted({segment.start, segment.end,
                            *(edge for span in self._decoupled_ranges + self._muon_ranges for edge in span
                              if segment.start < edge < segment.end)})
            for start, end in zip(edges, edges[1:]):
                if any(lo <= start < hi for lo, hi in self._muon_ranges):
                    continue
                decoupled = any(lo <= start < hi for lo, hi in self._decoupled_ranges)
                pieces.append(StepPiece(start, end, segment.kind.weight_decay, decoupled))
        return pieces

    def new_partition_tensor(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A zeroed partition-sized tensor where the master lives."""
        return torch.zeros_like(self.master, dtype=dtype)

    def _group_pieces(self, group: dict):
        index = {id(p): s for p, s in zip(self._segment_params, self._pieces)}
        return [index[id(p)] for p in group["params"]]


    def global_grad_norm(self, grads: torch.Tensor) -> float:
        return self.grad_norm_squared(grads).sqrt().item()

    def grad_norm_squared(self, grads: torch.Tensor) -> torch.Tensor:
        """The squared global norm (fp64) over TP, the partition group and the stages."""
        total = self.stage_grad_norm_squared(grads)
        self.comm.all_reduce(total, self.pipeline_group, "pp")
        return total

    def stage_grad_norm_squared(self, grads: torch.Tensor) -> torch.Tensor:
        """This stage's share of the squared norm (over TP and the partition group)."""
        pieces = [grads[s.start:s.end] for s in self._norm_segments()]
        # on the training device, which NCCL reaches
        total = sum_of_squares(pieces, grads.device).reshape(1).to(self.parameters.device)
        self.comm.all_reduce(total, self.parallel_state.tensor_parallel_group, "tp")
        self.comm.all_reduce(total, self.partition_group, "dp")
        return total

    def _norm_segments(self) -> list:
        """The segments whose squares this rank counts (TP-replicated ones on TP rank 0 only)."""
        counted = [s for s in self._segments
                   if not any(lo <= s.start and s.end <= hi for lo, hi in self.norm_excluded)]
        if self.parallel_state.tensor_parallel_rank != 0:
            counted = [s for s in counted if s.kind.tensor_parallel]
        return counted

    def step(self) -> StepResult:
        """Unscale, agree on overflow, clip, update and publish."""
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
        self.parameters.wait_all()  # an overlapped gather may still read the master
        self.update(grads)
        del grads
        self.publish_parameters()
        self.loss_scaler.update(overflow=False)
        return StepResult(norm, skipped=False, loss_scale=scale)

    def step_collectives_only(self) -> None:
        """`step`'s collectives without its arithmetic: the dry run's step."""
        grads = self.gradients.partition_gradients()
        self.grad_norm_squared(grads)
        if self._muon:
            self._muon_update(grads)
        self.publish_parameters()

    def update(self, grads: torch.Tensor) -> None:
        """Update the master partition from the unscaled, clipped gradient partition `grads`."""
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
        """What the step allocates on top of the model states at its peak: the fp32 gradient partition where the
        reducer cannot hand its own over, plus the norm's or update's temporaries; or publishing's copies, never
        alive with it."""
        publishing = self.parameters.publish_working_bytes() + gather_copy_bytes
        norm = block_copy_bytes(max((s.end - s.start for s in self._norm_segments()), default=0)) \
            if norm_in_blocks else 0
        return max(self.gradients.partition_working_bytes() + max(norm, self.update_working_bytes()), publishing)

    def update_working_bytes(self) -> int:
        """What the update itself allocates (fused AdamW: nothing)."""
        if self._muon:  # the gathered matrix, NS's X, A, B and the scaled result
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
        """Model-state tensors kept in host memory: none here."""
        return []

    def host_working_bytes(self) -> int:
        """Host memory the step holds besides the model states: none."""
        return 0

    def publish_parameters(self) -> None:
        """Make the 16-bit parameters reflect the master (every DP rank: the storage may communicate)."""
        self.parameters.publish(self.master)


    @property
    def partitioned(self) -> bool:
        """Whether this rank's optimizer state is a 1/N shard."""
        return self.layout.parts > 1

    @property
    def adam_step(self) -> int:
        """Updates applied (skipped fp16 steps do not count)."""
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
        """A context in which `unit`'s parameters hold their full values."""
        return self.parameters.gathered(unit)

    def _partition_tensors(self) -> dict[str, torch.Tensor]:
        """The live partition states, by name (what a load fills)."""
        return {"master": self.master, **self.moments()}

    def _saved_partition_tensors(self) -> dict[str, torch.Tensor]:
        """What a checkpoint writes of them: the live tensors themselves here."""
        return self._partition_tensors()


    def model_state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        """Every parameter whole (this TP rank's piece) as CPU copies, by name; every DP rank calls it (keep=False: no
        copies)."""
        names = _parameter_names(model)
        weights: dict[str, torch.Tensor] = {}
        for unit in self.layout.units:
            with self.gathered_parameters(unit):
                if keep:
                    for slot in unit.slots:
                        weights[names[id(slot.param)]] = slot.param.detach().to("cpu", copy=True)
        return weights

    def sharded_state_dict(self, model: nn.Module) -> ShardedOptimizerState:
        """This rank's live partition, its named fragment table, and the scalar state."""
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
        """Restore the partition from `tensors` ("master" alone, or with every moment), publish, and set the step and
        scaler state when given. `tensors` is emptied as it is copied, freeing the staged copies before publishing."""
        live = self._partition_tensors()
        check_partition_tensors(tensors, {key: tensor.shape for key, tensor in live.items()})
        for key in list(tensors):
            live[key].copy_(tensors.pop(key))
        self.publish_parameters()
        if adam_step is not None:
            self.adam_step = adam_step
        if loss_scaler_state is not None:
            self.loss_scaler.load_state_dict(loss_scaler_state)


    def model_state_tensors(self) -> dict[str, list[torch.Tensor]]:
        """The live model-state tensors, for zero/memory.py to measure."""
        return {"parameters": self.parameters.tensors(), "gradients": self.gradients.gradient_tensors(),
                "master_weights": [self.master], "optimizer_states": list(self.moments().values()),
                "buffers": self.gradients.buffer_tensors()}

    @property
    def num_parameters(self) -> int:
        return self.layout.num_parameters

    @property
    def padding(self) -> int:
        """Alignment padding elements in the flat layout."""
        return self.layout.padding


def decoupled_ranges(layout: FlatLayout, params: Sequence[nn.Parameter]) -> list[tuple[int, int]]:
    """Where `params`' elements lie in this rank's partition."""
    wanted = {id(param) for param in params}
    return [(f.partition_offset, f.partition_offset + f.numel) for f in layout.fragments() if id(f.slot.param) in wanted]


def _parameter_names(model: nn.Module) -> dict[int, str]:
    return {id(param): name for name, param in model.named_parameters()}
