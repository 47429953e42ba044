"""Kernel launches counted on the CPU, where the count is exact: `LaunchCounter`, a TorchDispatchMode, counts every op
below autograd that launches a kernel (not views or allocations), by window (`micro_batch <i>`, `outside`); compiled
code's kernels come from torch.profiler, a floor. It imports torch alone, for Megatron-LM's process."""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

OUTSIDE = "outside"
_NO_LAUNCH = {"aten.detach", "aten._unsafe_view", "aten.empty", "aten.empty_strided", "aten.empty_like",
              "aten.new_empty", "aten.new_empty_strided", "aten.lift_fresh", "aten.alias", "aten.set_"}
_KERNEL_EVENT = "cpp_fused"  # inductor's C++ kernels' profiler events
_WINDOW_EVENT = "launch-window|"


def launches_a_kernel(func) -> bool:
    """Whether an ATen op launches a kernel (module docstring: not a view, alias, detach or allocation)."""
    if func.is_view or func.namespace == "profiler":  # the counter's own window markers are profiler ops
        return False
    return f"{func.namespace}.{func._opname}" not in _NO_LAUNCH


def inductor_kernel_events():
    """A context inside which inductor names every C++ kernel it compiles in the profiler's events (the kernels
    compiled there keep their events after it)."""
    import torch._inductor.config as inductor_config

    return inductor_config.patch({"cpp.enable_kernel_profile": True})


@dataclass
class LaunchCounts:
    """What was counted: {(window, phase): launches} and {(window, phase, op): launches}; phase "-" outside a
    forward or backward."""
    by_window: collections.Counter = field(default_factory=collections.Counter)
    by_op: collections.Counter = field(default_factory=collections.Counter)

    def total(self, window_prefix: str = "", phase: Optional[str] = None) -> int:
        return sum(count for (window, in_phase), count in self.by_window.items()
                   if window.startswith(window_prefix) and (phase is None or in_phase == phase))

    def ops(self, window_prefix: str = "", phase: Optional[str] = None) -> collections.Counter:
        """{op: launches} over the windows starting with `window_prefix` (and `phase`, where given)."""
        merged: collections.Counter = collections.Counter()
        for (window, in_phase, op), count in self.by_op.items():
            if window.startswith(window_prefix) and (phase is None or in_phase == phase):
                merged[op] += count
        return merged


class LaunchCounter(TorchDispatchMode):
    """Counts launches while `active`, into the current window and phase (module docstring)."""

    @classmethod
    def is_infra_mode(cls) -> bool:
        return True  # so that compiled code runs under it (module docstring)

    def __init__(self) -> None:
        super().__init__()
        self.counts = LaunchCounts()
        self.active = False
        self.window, self.phase = OUTSIDE, "-"
        self._profiler: Optional[torch.profiler.profile] = None
        self._marker = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.active and launches_a_kernel(func):
            self._count(f"{func.namespace}.{func._opname}")
        return func(*args, **(kwargs or {}))

    def _count(self, op: str, window: Optional[str] = None, phase: Optional[str] = None, count: int = 1) -> None:
        key = (self.window if window is None else window, self.phase if phase is None else phase)
        self.counts.by_window[key] += count
        self.counts.by_op[(*key, op)] += count

    def enter_window(self, window: str, phase: str = "-") -> None:
        """The ops from here on fall in `window` and `phase`; while counting, a profiler marker encloses the kernels
        that run there (only while `active`: a warm-up's compiled kernels count nowhere)."""
        self.window, self.phase = window, phase
        self._close_marker()
        if self._profiler is not None and self.active:
            self._marker = torch.autograd.profiler.record_function(f"{_WINDOW_EVENT}{window}|{phase}")
            self._marker.__enter__()

    def _close_marker(self) -> None:
        if self._marker is not None:
            self._marker.__exit__(None, None, None)
            self._marker = None

    @contextlib.contextmanager
    def counting(self) -> Iterator["LaunchCounter"]:
        """Count (the ops, and inductor's kernels through the profiler) while inside and `active`."""
        self._profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self._profiler.__enter__()
        try:
            with self:
                yield self
        finally:
            self._close_marker()
            self._profiler.__exit__(None, None, None)
            self._add_kernel_events(self._profiler.events())
            self._profiler = None

    def _add_kernel_events(self, events) -> None:
        """Each inductor kernel event, counted in the window whose marker encloses it (markers open only while
        `active`, so a kernel outside every marker was not counted)."""
        for event in events:
            if _KERNEL_EVENT not in event.name:
                continue
            parent, window, phase = event.cpu_parent, None, None
            while parent is not None:
                if parent.name.startswith(_WINDOW_EVENT):
                    _, window, phase = parent.name.split("|")
                    break
                parent = parent.cpu_parent
            if window is not None:
                self._count(f"inductor.{event.name}", window, phase)


def count_calls(calls: list[Callable[[], object]], warm_up: int = 1) -> list[LaunchCounts]:
    """Each of `calls` run in order (the first `warm_up` uncounted: compilation happens there), the rest counted
    one window each ("call <i>")."""
    counter = LaunchCounter()
    results = []
    with counter.counting():
        for index, call in enumerate(calls):
            counter.active = index >= warm_up
            counter.enter_window(f"call {index}" if counter.active else OUTSIDE)
            call()
        counter.active = False
        counter.enter_window(OUTSIDE)
    for index in range(warm_up, len(calls)):
        window = f"call {index}"
        counts = LaunchCounts()
        for (name, phase), count in counter.counts.by_window.items():
            if name == window:
                counts.by_window[(name, phase)] = count
        for (name, phase, op), count in counter.counts.by_op.items():
            if name == window:
                counts.by_op[(name, phase, op)] = count
        results.append(counts)
    return results
