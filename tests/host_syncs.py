"""Count, on the CPU, every call that would make the host wait for the device on a GPU (issue 76 item 2).

A CUDA graph replays a micro-batch only if nothing inside it reads a device value back to Python, and every such read
stalls the host's kernel queue even without graphs. On a GPU `torch.cuda.set_sync_debug_mode` reports them; on the
CPU nothing waits, so this module counts the operations that would:

- the aten operators whose CUDA kernels copy a value to the host: `_local_scalar_dense` (`.item()`, `bool()`,
  `int()`, `if tensor:`), `nonzero` (and boolean indexing, `masked_select`, `argwhere`), `bincount`, the `unique`
  family, `equal`, `is_nonzero`, and `repeat_interleave` without `output_size`;
- the Tensor methods that copy to host memory with no aten operator on a CPU tensor: `tolist`, `numpy`, `cpu`, and
  `to` a CPU device unless `non_blocking=True` (ordered by the stream: the train step moves each batch so).
Not seen: a pageable host-to-device copy (`torch.tensor(values, device="cuda")`), no copy at all on a CPU run; the
step's path builds device tensors by fills or from pinned memory instead (gpt/moe/experts.py counts_on).

The operators are seen through a TorchDispatchMode (carried into backward), the methods by replacing them on
`torch.Tensor` for the duration; each call is counted with the innermost repository line that made it.
`SyncCountingObserver` (a train step's observer) names the window: `micro_batch <i>`, `slot <i> <F|B>
<micro-batch>` for a pipeline slot, `outside` for what a step does once per iteration."""

from __future__ import annotations

import collections
import contextlib
import os
import sys
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parallel.pipeline_schedules import Slot
from training.step_observer import NoObserver

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SYNCING_OPERATORS = {
    "aten._local_scalar_dense.default", "aten.nonzero.default", "aten.masked_select.default",
    "aten.argwhere.default", "aten.bincount.default", "aten.unique_consecutive.default", "aten._unique2.default",
    "aten.unique_dim.default", "aten.equal.default", "aten.is_nonzero.default",
}
_SYNCING_METHODS = ("tolist", "numpy", "cpu")


def _site() -> str:
    """The innermost frame of this repository's own code (not this file, not an installed package)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(REPOSITORY) and path != __file__ and f"{os.sep}.venv{os.sep}" not in path:
            return f"{os.path.relpath(path, REPOSITORY)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<no frame of this repository>"


def _boolean_indices(indices) -> bool:
    return any(isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) for index in indices
               if index is not None)


def syncs_on_gpu(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the aten operator `name` called with these arguments copies a device value to the host on CUDA."""
    if name in _SYNCING_OPERATORS:
        return True
    if name.startswith("aten.index.Tensor") or name.startswith("aten.index_put"):
        return _boolean_indices(args[1])
    if name.startswith("aten.repeat_interleave.Tensor") or name.startswith("aten.repeat_interleave.self_Tensor"):
        return kwargs.get("output_size") is None
    return False


class HostSyncCounter:
    """Counts by (window, what, site) while `active` is set; `window` names where the step is."""

    def __init__(self) -> None:
        self.counts: collections.Counter = collections.Counter()
        self.active = False
        self.window = "outside"
        self.opened: list[str] = []  # every window but `outside`, as it opened: what the counts were watched over

    def open(self, window: str) -> None:
        self.window = window
        if self.active:
            self.opened.append(window)

    def close(self) -> None:
        self.window = "outside"

    def count(self, what: str) -> None:
        if self.active:
            self.counts[(self.window, what, _site())] += 1

    def in_windows(self, prefix) -> dict:
        """{(what, site): count} over the windows whose name starts with `prefix` (a string, or a tuple of them)."""
        merged: collections.Counter = collections.Counter()
        for (window, what, site), count in self.counts.items():
            if window.startswith(prefix):
                merged[(what, site)] += count
        return dict(merged)

    @contextlib.contextmanager
    def watching(self) -> Iterator["HostSyncCounter"]:
        """Count while inside (only while `active`)."""
        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if counter.active and syncs_on_gpu(str(func), args, kwargs):
                    counter.count(str(func))
                return func(*args, **kwargs)

        originals = {name: getattr(torch.Tensor, name) for name in (*_SYNCING_METHODS, "to")}

        def counting(name):
            original = originals[name]

            def method(tensor, *args, **kwargs):
                counter.count(f"Tensor.{name}")
                return original(tensor, *args, **kwargs)
            return method

        def to(tensor, *args, **kwargs):
            target = kwargs.get("device", args[0] if args else None)
            waits = not kwargs.get("non_blocking", False)  # given by name (positionally it is rare and ambiguous)
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu" and waits:
                counter.count("Tensor.to(cpu)")
            return originals["to"](tensor, *args, **kwargs)

        try:
            for name in _SYNCING_METHODS:
                setattr(torch.Tensor, name, counting(name))
            torch.Tensor.to = to
            with _Mode():
                yield self
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)


IN_A_MICRO_BATCH = ("micro_batch ", "slot ")  # the windows' prefixes of the step's per-micro-batch work


class SyncCountingObserver(NoObserver):
    """A live step's observer that turns the counter's windows (module docstring): a micro-batch's, a pipeline
    slot's, and `outside` between them."""

    def __init__(self, counter: HostSyncCounter) -> None:
        self.counter = counter

    def micro_batch_start(self, micro_batch: int) -> None:
        self.counter.open(f"micro_batch {micro_batch}")

    def micro_batch_end(self, micro_batch: int) -> None:
        self.counter.close()

    def slot_start(self, index: int, slot: Slot) -> None:
        self.counter.open(f"slot {index} {slot.kind} {slot.micro_batch}")

    def slot_end(self, index: int, slot: Slot) -> None:
        self.counter.close()
