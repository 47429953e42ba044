"""Methods that must run eagerly inside a torch.compile'd block, marked without importing torch._dynamo (seconds of
start-up): a run with --compile wraps them in torch.compiler.disable before it registers any hook."""

from __future__ import annotations

from typing import Callable

_marked: list[tuple[type, str]] = []


class eager_under_compile:
    """Record a method to be wrapped in torch.compiler.disable when a run compiles."""

    def __init__(self, method: Callable) -> None:
        self.method = method

    def __set_name__(self, owner: type, name: str) -> None:
        _marked.append((owner, name))
        setattr(owner, name, self.method)


def keep_marked_methods_eager() -> None:
    """Wrap every marked method in torch.compiler.disable (idempotent)."""
    import torch.compiler  # imports torch._dynamo: only a run that compiles pays for it

    for owner, name in _marked:
        method = owner.__dict__[name]
        if not getattr(method, "_torchdynamo_disable", False):
            setattr(owner, name, torch.compiler.disable(method))
