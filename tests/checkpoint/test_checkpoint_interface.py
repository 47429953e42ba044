"""Issue 24, point 4: checkpoint/ reads and restores the optimizer only through the interface of
zero/optimizer_state.py (`model_state_dict`, `sharded_state_dict`, `load_sharded_state_dict`).

An optimizer that implements that interface and nothing else, over a layout unlike ShardedAdamW's
(parameters end to end in reverse order, with padding between them), saves and loads through
`save_checkpoint` / `load_checkpoint`; and no checkpoint module names any other optimizer attribute.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from arguments.config import PretrainConfig
from checkpoint.file_names import model_file
from checkpoint.format import (
    open_tensors,
    read_metadata,
)
from checkpoint.ours.sharded import load_checkpoint, save_checkpoint
from checkpoint.ours.source import consolidate
from parallel.state import ParallelState
from zero.optimizer_state import PARTITION_TENSORS, CheckpointableOptimizer, NamedFragment, ShardedOptimizerState

ROOT = Path(__file__).resolve().parents[2]
# zero/optimizer_state.py: three calls, and expert_model_state_dict where the ranks hold different experts
INTERFACE = {"model_state_dict", "sharded_state_dict", "load_sharded_state_dict", "expert_model_state_dict"}
PADDING = 3


def tiny_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))


class InterfaceOnlyOptimizer(CheckpointableOptimizer):
    """The checkpoint interface and nothing else: every other attribute is private, so a checkpoint
    module reaching for ShardedAdamW's internals (layout, master, adam_step, ...) fails here."""

    def __init__(self, model: nn.Module, seed: int, scaler_type: str = "LossScaler") -> None:
        self._fragments, offset = [], 0
        for name, param in reversed(list(model.named_parameters())):
            self._fragments.append(NamedFragment(name, 0, offset, param.numel()))
            offset += param.numel() + PADDING
        generator = torch.Generator().manual_seed(seed)
        self._tensors = {key: torch.zeros(offset) for key in PARTITION_TENSORS}
        for key, tensor in self._tensors.items():  # random values, zero padding (as a load leaves it)
            for fragment in self._fragments:
                at = slice(fragment.partition_offset, fragment.partition_offset + fragment.numel)
                tensor[at] = torch.randn(fragment.numel, generator=generator).abs()
        # The scaler's state passes through opaquely; its scale stays 1, as an fp32 checkpoint's must (schema.py).
        self._step, self._scaler_type, self._scaler_state = seed, scaler_type, {"scale": 1.0, "seed": seed}
        self._params = dict(model.named_parameters())
        self.loads: list[tuple[list[str], object, object]] = []  # what load_sharded_state_dict was given
        self._publish()

    def _publish(self) -> None:
        """The model's parameters from the master (what ShardedAdamW's storage does)."""
        with torch.no_grad():
            for name, _, at, numel in self._fragments:
                self._params[name].view(-1).copy_(self._tensors["master"][at:at + numel])

    def model_state_dict(self, model: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
        return {name: param.detach().clone() for name, param in model.named_parameters()} if keep else {}

    def sharded_state_dict(self, model: nn.Module) -> ShardedOptimizerState:
        return ShardedOptimizerState(tensors=dict(self._tensors), fragments=list(self._fragments), replicated=True,
                                     zero_stage=1, adam_step=self._step, loss_scaler_type=self._scaler_type,
                                     loss_scaler_state=dict(self._scaler_state), param_dtype=torch.float32)

    def load_sharded_state_dict(self, tensors, adam_step=None, loss_scaler_state=None) -> None:
        self.loads.append((sorted(tensors), adam_step, loss_scaler_state))
        for key in list(tensors):
            self._tensors[key].copy_(tensors.pop(key))
        self._publish()
        if adam_step is not None:
            self._step = adam_step
        if loss_scaler_state is not None:
            self._scaler_state = dict(loss_scaler_state)


def save(tmp_path: Path, seed: int = 1):
    model = tiny_model(seed)
    optimizer = InterfaceOnlyOptimizer(model, seed)
    path = save_checkpoint(tmp_path / "ckpt", 3, 12, model, optimizer, None, PretrainConfig(),
                           ParallelState(device=torch.device("cpu")))
    return model, optimizer, path


def test_a_checkpoint_round_trip_needs_only_the_optimizer_interface(tmp_path):
    model, optimizer, path = save(tmp_path, seed=1)
    metadata = read_metadata(path)
    assert (metadata["zero_stage"], metadata["adam_step"]) == (1, 1)
    assert metadata["loss_scaler"] == {"type": "LossScaler", "state": {"scale": 1.0, "seed": 1}}
    assert [tuple(entry) for entry in metadata["optimizer_shards"]] == [(0, 0, "optim_tp00_dp000.safetensors")]
    with open_tensors(path, model_file(0), metadata) as reader:
        assert {key: reader.tensor(key) for key in reader.keys()}.keys() == dict(model.named_parameters()).keys()
        for name, param in model.named_parameters():
            assert torch.equal(reader.tensor(name), param.detach()), name
    # the fragment table the optimizer gave is the format's: consolidation puts each parameter together
    whole = consolidate(path, ("master",))["master"]
    for name, param in model.named_parameters():
        assert torch.equal(whole[name], param.detach()), name

    fresh_model = tiny_model(2)
    fresh = InterfaceOnlyOptimizer(fresh_model, seed=2)
    state = ParallelState(device=torch.device("cpu"))
    assert load_checkpoint(tmp_path / "ckpt", fresh_model, fresh, None, state, load_rng=False).iteration == 3
    assert fresh.loads == [(sorted(PARTITION_TENSORS), 1, {"scale": 1.0, "seed": 1})]
    for key in PARTITION_TENSORS:
        assert torch.equal(fresh.sharded_state_dict(fresh_model).tensors[key], optimizer._tensors[key]), key
    for (name, param), (_, saved) in zip(fresh_model.named_parameters(), model.named_parameters()):
        assert torch.equal(param, saved), name  # published from the loaded master


def test_weights_only_loads_hand_over_the_master_alone(tmp_path):
    save(tmp_path, seed=1)
    fresh_model = tiny_model(2)
    fresh = InterfaceOnlyOptimizer(fresh_model, seed=2)
    state = ParallelState(device=torch.device("cpu"))
    assert load_checkpoint(tmp_path / "ckpt", fresh_model, fresh, None, state, finetune=True).iteration == 0
    assert fresh.loads == [(["master"], None, None)]


def test_another_loss_scaler_type_keeps_the_configured_scale(tmp_path, capsys):
    save(tmp_path, seed=1)
    fresh_model = tiny_model(2)
    fresh = InterfaceOnlyOptimizer(fresh_model, seed=2, scaler_type="DynamicLossScaler")
    state = ParallelState(device=torch.device("cpu"))
    load_checkpoint(tmp_path / "ckpt", fresh_model, fresh, None, state, load_rng=False)
    assert fresh.loads == [(sorted(PARTITION_TENSORS), 1, None)]
    assert "loss scaler (LossScaler) does not apply" in capsys.readouterr().out


def test_a_sharded_adamw_loads_master_alone_or_with_both_moments():
    from tests.checkpoint.test_checkpoint_safety import build, cpu_state, make_config

    model, optimizer, _ = build(make_config(), cpu_state(), seed=1)
    shapes = optimizer.sharded_state_dict(model).tensors["master"].shape
    with pytest.raises(ValueError, match="alone or as all of"):
        optimizer.load_sharded_state_dict({"master": torch.zeros(shapes), "exp_avg": torch.zeros(shapes)})
    with pytest.raises(ValueError, match="shape"):
        optimizer.load_sharded_state_dict({"master": torch.zeros(shapes[0] + 1)})


# The ZeRO runtime behind the interface: what checkpoint/ must not import.
IMPLEMENTATION = {"zero.optimizer", "zero.flat_buffer", "zero.param_storage", "zero.grad_reducer", "zero.stage3",
                  "zero.apply"}


@pytest.mark.parametrize("path", sorted((ROOT / "checkpoint").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT / "checkpoint")))
def test_checkpoint_modules_use_only_the_optimizer_interface(path):
    """Every `optimizer.X` in checkpoint/ is one of the interface's calls, and nothing there imports
    the ZeRO runtime rather than its interface (zero.optimizer_state)."""
    tree = ast.parse(path.read_text(), str(path))
    used = {node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "optimizer"}
    assert used <= INTERFACE, f"{path.name} reads optimizer.{', optimizer.'.join(sorted(used - INTERFACE))}"
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not imported & IMPLEMENTATION, f"{path.name} imports {sorted(imported & IMPLEMENTATION)}"


def test_every_source_and_optimizer_declares_the_optional_parts_it_carries():
    """Issue 91 item 4: the loader and the save plan ask every checkpoint source for its expert biases, FP8
    histories, random states and why its optimizer states are not read, and every optimizer for its experts kept
    apart; the protocols answer for a format or optimizer that carries none. No module of checkpoint/ probes for
    them with getattr."""
    from checkpoint.deepspeed.source import DeepSpeedSource
    from checkpoint.global_state import GlobalStateSource
    from checkpoint.hf.source import HFSource, WholeFolderSource
    from checkpoint.ours.source import ZeroGptSource
    from checkpoint.torch_dist.source import MegatronSource
    from zero.experts import CheckpointableChain
    from zero.optimizer import ShardedAdamW
    from zero.optimizer_state import CheckpointableOptimizer

    parts = ("expert_biases", "fp8_histories", "restore_random_states", "optimizer_not_read")
    carried = {source.__name__: [part for part in parts if getattr(source, part) is not getattr(GlobalStateSource,
                                                                                                 part)]
               for source in (ZeroGptSource, MegatronSource, DeepSpeedSource, HFSource, WholeFolderSource)
               if GlobalStateSource in source.__mro__}
    assert carried == {"ZeroGptSource": list(parts[:3]), "MegatronSource": [parts[0], *parts[2:]], "DeepSpeedSource": [],
                       "HFSource": ["expert_biases"], "WholeFolderSource": ["expert_biases"]}
    assert CheckpointableOptimizer in ShardedAdamW.__mro__ and CheckpointableOptimizer in CheckpointableChain.__mro__
    assert CheckpointableChain.expert_model_state_dict is not CheckpointableOptimizer.expert_model_state_dict
    assert ShardedAdamW.expert_model_state_dict is CheckpointableOptimizer.expert_model_state_dict
    probes = [f"{path.name}:{number}" for path in (ROOT / "checkpoint").rglob("*.py")
              for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
              if "getattr(source," in line or "getattr(optimizer," in line]
    assert probes == []
