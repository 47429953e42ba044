"""Forward pre-hooks that may run in a captured module's place before a CUDA graph replays it, marked where they are
defined.

A CUDA graph replays the kernels a module's forward launched while it was captured; the Python around them, its
hooks included, ran once, at the capture (parallel/graph_capture.py). A forward pre-hook that must still act every
micro-batch, and only waits for or starts work outside the graph (ZeRO's wait for an overlapped parameter gather at
a region's entry, zero/gated_parameters.py), is marked `@runs_before_graph_replay`, and the region calls it before each replay, as
Megatron-Core's CudaGraphManager calls Megatron DDP's pre-forward hooks before a replay and refuses any other
(megatron/core/transformer/cuda_graphs.py, `call_ddp_preforward_hook`). An unmarked hook on a captured module is
refused: it would silently run once.
"""

from __future__ import annotations

import functools
from typing import Callable

MARK = "runs_before_graph_replay"


def runs_before_graph_replay(method: Callable) -> Callable:
    """Mark a forward pre-hook (a function or method, bound later or wrapped in functools.partial, or the class of a
    callable hook) as one to call before each replay of a CUDA graph that captured its module."""
    setattr(method, MARK, True)
    return method


def hook_runs_before_graph_replay(hook: Callable) -> bool:
    """Whether `hook` (as registered: a function, a bound method, a functools.partial of either) is marked."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    return bool(getattr(getattr(hook, "__func__", hook), MARK, False))
