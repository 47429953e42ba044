"""Marks the forward pre-hooks a CUDA graph region calls before each replay (ZeRO's gather wait); an unmarked hook on a
captured module is refused, since it would run only once, at capture."""

from __future__ import annotations

import functools
from typing import Callable

MARK = "runs_before_graph_replay"


def runs_before_graph_replay(method: Callable) -> Callable:
    """Mark a forward pre-hook (function, method, partial, or callable class) to run before each replay."""
    setattr(method, MARK, True)
    return method


def hook_runs_before_graph_replay(hook: Callable) -> bool:
    while isinstance(hook, functools.partial):
        hook = hook.func
    return bool(getattr(getattr(hook, "__func__", hook), MARK, False))
