"""Parameters whose every read first waits for their unit's all-gather (--overlap-param-gather).

With the overlap, publishing after a step only starts each unit's all-gather into the flat parameter buffer; the
next forward runs while the gathers do, and no read of a parameter may come before its unit's gather is waited for.
Megatron-Core waits in a forward pre-hook of every module for the parameters it owns (distributed_data_parallel.py
`_make_forward_pre_hook`), and other readers must call `ensure_params_ready` (megatron/core/utils.py): both tied to a
read path, so a parameter read outside its owner's forward (our output layer's weight in F.linear or the fused
cross entropy, a tied output layer, MTP's shared head) or by a new path that forgets the call reads un-waited.

Here the wait is on the read itself: each parameter of a gathered unit is a `GatedParameter` holding its unit's
`UnitGate`, and its `__torch_function__` (called for every operation that takes it: F.linear, a lookup, `.t()`,
`.data`, a view, ...) waits for the gates among the arguments, then runs the operation as a plain Parameter would.
Whoever reads a parameter reads it after its gather; backward reuses what forward read. What does not go through a
parameter is ZeRO's own: the flat buffer (publishing waits for every gate before writing it again;
`ParameterStorage.gathered` waits for the unit) and tensors derived before the step (nothing here caches one).

Cost: a Python call per operation on a gated parameter (about 4 us on this CPU; on a GPU it shows only where the
host is the bottleneck); only the overlap makes gated parameters. Under torch.compile dynamo inlines
`__torch_function__`; `UnitGate.wait` runs eagerly (a graph break only while a gather is in flight)."""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn

from base.eager_under_compile import eager_under_compile
from base.graph_replay_hooks import runs_before_graph_replay


class UnitGate:
    """One unit's all-gather while it is in flight: the work handle, and the input it reads (kept alive
    until the gather completes). Open (nothing to wait for) once waited."""

    __slots__ = ("work", "source")

    def __init__(self) -> None:
        self.work: Optional[object] = None
        self.source: Optional[torch.Tensor] = None

    def close(self, work, source: torch.Tensor) -> None:
        """A gather into the unit has started: reads wait for `work`."""
        self.work, self.source = work, source

    @property
    def is_open(self) -> bool:
        return self.work is None

    @eager_under_compile  # waits on a Python-held work handle: stays out of compiled blocks
    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = self.source = None


class GatedParameter(nn.Parameter):
    """A parameter that waits for its unit's gather (`gate`) before any operation reads it."""

    gate: Optional[UnitGate] = None  # set by the storage that binds it; None while it is being built

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _wait_for_gates(args)
        _wait_for_gates(kwargs.values())
        with torch._C.DisableTorchFunctionSubclass():  # as nn.Parameter: run it, results are plain tensors
            return func(*args, **kwargs)


def _wait_for_gates(values: Iterable) -> None:
    """Wait for the gate of every gated parameter among an operation's arguments (and inside a list or tuple
    argument: torch.cat, the foreach kernels)."""
    for value in values:
        if isinstance(value, (list, tuple)):
            _wait_for_gates(value)
        elif isinstance(value, GatedParameter) and value.gate is not None and not value.gate.is_open:
            value.gate.wait()


@runs_before_graph_replay  # a CUDA graph's replay runs no Python: its region calls this before each replay
class _RegionEntry:
    """A forward pre-hook that waits for the gates of every gated parameter a module holds."""

    def __init__(self, module: nn.Module) -> None:
        self.gates = list({id(param.gate): param.gate for param in module.parameters()
                           if isinstance(param, GatedParameter) and param.gate is not None}.values())

    @eager_under_compile  # the waits run eagerly, before the compiled forward reads anything
    def __call__(self, module, args) -> None:
        for gate in self.gates:
            gate.wait()


def wait_at_region_entry(module: nn.Module) -> None:
    """Before `module` is torch.compile'd or captured in a CUDA graph: wait for its parameters' gathers when its
    forward is entered. Inside a compiled region dynamo inlines `GatedParameter.__torch_function__` and guards on
    each gate's state; a gate closed at one entry and open at the next would recompile the region every iteration
    (until dynamo's recompile limit sends it back to eager). A replayed CUDA graph runs no Python at all, so no
    `__torch_function__` waits inside it: its region calls this hook before each replay
    (parallel/graph_capture.py). Opened at the entry, the gates the region reads are always open."""
    if any(isinstance(param, GatedParameter) for param in module.parameters()):
        module.register_forward_pre_hook(_RegionEntry(module))
