"""MoE upcycling (--moe-use-upcycling): a dense checkpoint read as this MoE model's weights, as Megatron-Core's
upcycling_utils makes them. Expert e is slice e mod G of the dense MLP's FFN, scaled (`expert_scale`); router row e
is the run's own initial row e // G, so each group of G slices ties and a top-k of whole groups gives the dense MLP."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import nn

from base.errors import CheckpointError
from base.options import replace_settings
from checkpoint.formats import MEGATRON, ZERO_GPT, format_named
from checkpoint.global_load import ResumePoint, load_from_source
from checkpoint.global_state import GlobalStateSource, GlobalTensorInfo
from checkpoint.save_directory import holds_checkpoints
from parallel.init import ParameterInitializer
from parallel.sharding import record_of
from parallel.state import ParallelState

DENSE_MLP = re.compile(r"^(?P<mlp>.*\.mlp)\.(?P<tail>(?P<linear>dense_h_to_4h(?:_gate|_up)?|dense_4h_to_h)\."
                       r"(?:weight|bias))$")
UPCYCLED_ITERATION = 1  # what Megatron-LM's setup_model_and_optimizer saves the upcycled model as


def dense_model_config(model, granularity: int):
    """The dense model a --moe-use-upcycling run reads: this one without experts, its FFN G experts wide."""
    return replace_settings(model, num_experts=None, moe_ffn_hidden_size=None,
                            ffn_hidden_size=model.ffn_size * granularity)


def check_upcycling_start(save: str, load: str, dense: Optional[Path], format_name: Optional[str]) -> None:
    """A dense checkpoint in a format read here, and (Megatron-LM's setup_model_and_optimizer asserts it) no
    checkpoint in --save yet."""
    if dense is None:
        raise CheckpointError(f"--load {load} holds no checkpoint: --moe-use-upcycling needs the dense model's")
    if format_named(format_name) not in (MEGATRON, ZERO_GPT):
        raise CheckpointError(f"--moe-use-upcycling reads this project's or Megatron-LM's torch_dist checkpoints, "
                              f"{dense} is {format_name} checkpoint: resume it here with --save first, and upcycle "
                              f"that save")
    if holds_checkpoints(Path(save)):
        raise CheckpointError(f"--save {save} already holds a checkpoint: --moe-use-upcycling converts a dense model "
                              f"once into a new directory, as Megatron-LM asserts; later runs drop the flag")


def upcycled_start(metadata: dict, finetune: bool) -> tuple[int, int]:
    """Megatron-LM's (iteration, consumed samples) once the upcycled model is saved: setup_model_and_optimizer's
    --load branch is skipped, so the iteration is 0 again, and load_checkpoint kept the dense checkpoint's
    consumed_train_samples (none under --finetune)."""
    return 0, 0 if finetune else metadata.get("consumed_samples") or 0


def expert_scale(model, granularity: int) -> float:
    """upcycling_utils' _get_weight_scale: each expert projection's factor from the activation scale, G, or E·G/topk
    with --moe-router-pre-softmax."""
    moe = model.moe
    activation = (moe.num_experts * granularity / moe.router_topk if moe.router_pre_softmax else granularity)
    cubic = model.mlp.swiglu or model.mlp.activation == "squared_relu"
    return activation ** (1 / 3) if cubic else activation ** (1 / 2)


class UpcycledSource(GlobalStateSource):
    """The dense `source`'s weights as the MoE model's global tensors; `initial_routers` gives a router's initial value.
    """

    def __init__(self, dense: GlobalStateSource, num_experts: int, granularity: int, scale: float,
                 initial_routers, router_bias: bool) -> None:
        self.dense, self.num_experts, self.granularity, self.scale = dense, num_experts, granularity, scale
        self.initial_routers, self.router_bias = initial_routers, router_bias
        self.path, self.format_name = dense.path, f"{dense.format_name}, upcycled"
        self.key = "master" if "master" in dense.keys() else dense.keys()[0]
        self._tensors: Optional[dict[str, GlobalTensorInfo]] = None
        self._origin: dict[str, tuple[str, int]] = {}  # expert tensor -> (dense tensor, its slice)
        self._sliced: dict[str, tuple[torch.Tensor, ...]] = {}

    @property
    def bytes_read(self) -> int:
        return self.dense.bytes_read

    def keys(self) -> tuple[str, ...]:
        return (self.key,)

    def tensors(self, key: str) -> dict[str, GlobalTensorInfo]:
        if self._tensors is None:
            self._tensors = self._expert_tensors()
        return self._tensors

    def _expert_tensors(self) -> dict[str, GlobalTensorInfo]:
        tensors, g = {}, self.granularity
        for name, info in self.dense.tensors(self.key).items():
            match = DENSE_MLP.match(name)
            if match is None:
                tensors[name] = info
                continue
            mlp, tail = match["mlp"], match["tail"]
            split_dim = None if tail == "dense_4h_to_h.bias" else (1 if tail == "dense_4h_to_h.weight" else 0)
            shape = list(info.shape)
            if split_dim is not None:
                if shape[split_dim] % g:
                    raise CheckpointError(f"{self.path}: {name} has {shape[split_dim]} FFN features, not divisible by "
                                          f"--moe-upcycling-granularity {g}")
                shape[split_dim] //= g
            for expert in range(self.num_experts):
                tensors[f"{mlp}.experts.{expert}.{tail}"] = GlobalTensorInfo(tuple(shape), info.dtype)
                self._origin[f"{mlp}.experts.{expert}.{tail}"] = (name, expert % g)
            hidden = info.shape[0] if match["linear"] == "dense_4h_to_h" else info.shape[-1]
            if tail.endswith("weight"):
                tensors[f"{mlp}.router.weight"] = GlobalTensorInfo((self.num_experts, hidden), info.dtype)
                if self.router_bias:
                    tensors[f"{mlp}.router.bias"] = GlobalTensorInfo((self.num_experts,), info.dtype)
        return tensors

    def read(self, key: str, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        self.tensors(key)
        if name in self._origin:
            dense_name, part = self._origin[name]
            return self._slices(dense_name)[part][region]
        if name.endswith(".router.weight"):  # _process_router_param: the first E/G rows, each repeated G times
            initial = self.initial_routers(name)
            return initial[: self.num_experts // self.granularity].repeat_interleave(self.granularity, 0)[region]
        if name.endswith(".router.bias"):  # left as built, as Megatron-Core leaves it
            return self.initial_routers(name)[region]
        return self.dense.read(key, name, region)

    def _slices(self, dense_name: str) -> tuple[torch.Tensor, ...]:
        """The dense tensor read whole, scaled (not an output bias) and split into the G experts' slices."""
        if dense_name not in self._sliced:
            info = self.dense.tensors(self.key)[dense_name]
            whole = self.dense.read(self.key, dense_name, tuple(slice(0, size) for size in info.shape))
            if dense_name.endswith("dense_4h_to_h.bias"):
                self._sliced[dense_name] = (whole,) * self.granularity
            else:
                dim = 1 if dense_name.endswith("dense_4h_to_h.weight") else 0
                self._sliced[dense_name] = torch.tensor_split(whole * self.scale, self.granularity, dim=dim)
        return self._sliced[dense_name]

    def progress(self):
        return self.dense.progress()

    def not_carried(self) -> list[str]:
        return self.dense.not_carried()


def _initial_routers(model: nn.Module, seed: int):
    """A router parameter's whole initial value as the run drew it (parallel/init.py: a function of seed and name)."""
    params = {name: param for name, param in model.named_parameters() if ".router." in name}
    initializer = ParameterInitializer(seed)

    def initial(name: str) -> torch.Tensor:
        param = params[name]
        shape = record_of(param).global_shape
        return initializer.values(name, param, 0, param.numel(), torch.device("cpu")).view(shape)
    return initial


@contextlib.contextmanager
def _dense_source(format_name: str, path: Path) -> Iterator[GlobalStateSource]:
    """The dense checkpoint as global tensors (its format checked at the start: `check_upcycling_start`)."""
    if format_named(format_name) is MEGATRON:
        from checkpoint.torch_dist.source import MegatronSource

        yield MegatronSource(path)
    else:
        from checkpoint.ours.source import ZeroGptSource

        with ZeroGptSource(path) as source:
            yield source


def load_upcycled(format_name: str, path: Path, model: nn.Module, optimizer, rng, state: ParallelState, model_config,
                  checkpoint, seed: int, start: tuple[int, int], log=print) -> ResumePoint:
    """This rank's MoE weights from the dense checkpoint at `path`, at Megatron-LM's `start` (`upcycled_start`) with the
    dense run's random states, a fresh optimizer and a schedule at step 0 (its load_checkpoint gets neither)."""
    granularity = checkpoint.moe_upcycling_granularity
    scale = expert_scale(model_config, granularity)
    router_bias = any(name.endswith(".router.bias") for name, _ in model.named_parameters())
    with _dense_source(format_name, path) as dense:
        source = UpcycledSource(dense, model_config.moe.num_experts, granularity, scale,
                                _initial_routers(model, seed), router_bias)
        weights = load_from_source(source, model, optimizer, None, state, finetune=True)
        if not checkpoint.finetune and checkpoint.load_rng:
            dense.restore_random_states(rng, state)  # its notes flush, as a resume says them
        log(f"> upcycled the dense checkpoint {path} ({dense.format_name}): each MLP into "
            f"{model_config.moe.num_experts} experts at granularity {granularity} (weights x {scale:.6g}), saved as "
            f"iteration {UPCYCLED_ITERATION}; training runs from iteration {start[0] + 1} at sample {start[1]} with a "
            f"fresh optimizer and schedule")
    return ResumePoint(*start, path, 0, weights.bytes_read, weights.shard_bytes)
