"""Parameters whose every read first waits for their unit's all-gather (--overlap-param-gather). The wait is on the read
itself (`__torch_function__`), not in a module's forward pre-hook as Megatron-Core's, so a parameter read outside its
owner's forward (a tied output layer, MTP's head) cannot read an unfinished gather."""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from base.eager_under_compile import eager_under_compile
from base.graph_replay_hooks import runs_before_graph_replay


class UnitGate:
    """One unit's all-gather in flight (work handle and input); open once waited."""

    __slots__ = ("work", "source")

    def __init__(self) -> None:
        self.work: Optional[object] = None
        self.source: Optional[torch.Tensor] = None

    def close(self, work, source: torch.Tensor) -> None:
        self.work, self.source = work, source

    @property
    def is_open(self) -> bool:
        return self.work is None

    @eager_under_compile  # waits on a Python-held work handle
    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = self.source = None


class GatedParameter(nn.Parameter):
    """A parameter that waits for its unit's gather before any operation reads it."""

    gate: Optional[UnitGate] = None  # set by the storage that binds it

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _wait_for_gates(args)
        _wait_for_gates(kwargs.values())
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _wait_for_gates(values: Iterable) -> None:
    """Wait for the gates of the gated parameters among an operation's arguments."""
    for value in values:
        if isinstance(value, (list, tuple)):
            _wait_for_gates(value)
        elif isinstance(value, GatedParameter) and value.gate is not None and not value.gate.is_open:
            value.gate.wait()


@runs_before_graph_replay  # a replayed CUDA graph runs no Python
class _RegionEntry:
    """A forward pre-hook that waits for a module's gates."""

    def __init__(self, module: nn.Module) -> None:
        self.gates = list({id(param.gate): param.gate for param in module.parameters()
                           if isinstance(param, GatedParameter) and param.gate is not None}.values())

    @eager_under_compile
    def __call__(self, module, args) -> None:
        for gate in self.gates:
            gate.wait()


def wait_at_region_entry(module: nn.Module) -> None:
    """Wait for `module`'s gathers when its forward is entered, so compiled or CUDA-graphed regions always see open
    gates."""
    if any(isinstance(param, GatedParameter) for param in module.parameters()):
        module.register_forward_pre_hook(_RegionEntry(module))
