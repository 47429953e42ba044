"""Methods that must run eagerly inside a torch.compile'd block, marked without importing torch._dynamo.

`torch.compiler.disable` imports torch._dynamo (1.5 s on an idle machine, 6 s on a loaded one), so
decorating at class definition made every `pretrain_gpt.py --help` and `--print-config` pay for a
compiler they never use. `@eager_under_compile` only records the method; `keep_marked_methods_eager()`
wraps every recorded method in `torch.compiler.disable` once, and a run with --compile calls it before
it builds anything: hooks bind methods when they are registered (ZeRO stage 3's gather hooks are
`functools.partial`s of bound methods), so the wrapping must already be in place by then.
"""

from __future__ import annotations

from typing import Callable

_marked: list[tuple[type, str]] = []


class eager_under_compile:
    """Record a method to be wrapped in torch.compiler.disable when a run compiles."""

    def __init__(self, method: Callable) -> None:
        self.method = method

    def __set_name__(self, owner: type, name: str) -> None:
        _marked.append((owner, name))
        setattr(owner, name, self.method)  # until a run compiles, the plain method: no wrapper cost


def keep_marked_methods_eager() -> None:
    """Wrap every marked method in torch.compiler.disable (idempotent)."""
    import torch.compiler  # imports torch._dynamo: only a run that compiles pays for it

    for owner, name in _marked:
        method = owner.__dict__[name]
        if not getattr(method, "_torchdynamo_disable", False):
            setattr(owner, name, torch.compiler.disable(method))
