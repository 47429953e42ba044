"""Meta kernels answered from a cache: the same op on inputs of the same metadata gives outputs of the same metadata, so
a dry run computes each once (torch's Python decompositions were 80% of a deep search). A TorchDispatchMode below
autograd, so what autograd saves is unchanged; it answers only where that cannot differ from running the kernel."""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

META = torch.device("meta")
# distinct (op, input metadata) pairs: a dry run needs a few thousand; the bound keeps a long-lived process bounded
MAX_ENTRIES = 100_000
_UNCACHEABLE = object()
_FIRST_ARGUMENT = object()  # the cached answer of an in-place op: its first argument, as it was

# process-wide: entries hold only metadata, valid for any dry run
_cache: dict[tuple, tuple] = {}


@functools.cache
def _writes_or_aliases(op: torch._ops.OpOverload) -> bool:
    schema = op._schema
    return any(argument.alias_info is not None for argument in (*schema.arguments, *schema.returns))


@functools.cache
def _in_place_on_first(op: torch._ops.OpOverload) -> bool:
    """Whether `op` writes its first argument, returns it and aliases nothing else: `Tensor(a!) self -> Tensor(a!)`."""
    schema = op._schema
    if not schema.arguments or len(schema.returns) != 1 or schema.name == "aten::set_":
        return False  # set_ takes another tensor's storage, which the schema does not mark and the key cannot see
    written, returned = schema.arguments[0].alias_info, schema.returns[0].alias_info
    return (written is not None and written.is_write and returned is not None
            and returned.before_set == written.before_set
            and all(argument.alias_info is None for argument in schema.arguments[1:]))


def _metadata(tensor: torch.Tensor) -> tuple:
    storage = tensor.untyped_storage()
    return tuple(tensor.shape), tensor.stride(), tensor.storage_offset(), tensor.dtype, storage._cdata, \
        storage.nbytes()


def _key_of(value: Any):
    if isinstance(value, torch.Tensor):
        if value.device != META:
            return _UNCACHEABLE
        return (type(value), tuple(value.shape), value.stride(), value.dtype, value.layout)
    if isinstance(value, (list, tuple)):
        parts = tuple(_key_of(item) for item in value)
        return _UNCACHEABLE if any(part is _UNCACHEABLE for part in parts) else (type(value), parts)
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                           torch.memory_format)):
        return (type(value), value)
    return _UNCACHEABLE


def _output_spec(output: Any) -> Optional[tuple]:
    """How to make `output` again, or None when it is not a fresh meta tensor (or a tuple of them)."""
    tensors = list(output) if isinstance(output, (tuple, list)) else [output]
    spec = []
    storages = set()
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or type(tensor) is not torch.Tensor or tensor.device != META:
            return None
        extent = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()) if size > 0) \
            if tensor.numel() > 0 else 0
        storage = tensor.untyped_storage()
        if tensor.storage_offset() != 0 or storage.nbytes() != extent * tensor.element_size() \
                or storage._cdata in storages:
            return None
        storages.add(storage._cdata)
        spec.append((tuple(tensor.shape), tensor.stride(), tensor.dtype))
    return type(output) if isinstance(output, (tuple, list)) else None, tuple(spec)


def _make(spec: tuple):
    container, tensors = spec
    made = [torch.empty_strided(shape, stride, dtype=dtype, device=META) for shape, stride, dtype in tensors]
    return made[0] if container is None else container(made)


class CachedMetaKernels(TorchDispatchMode):
    """Within it, a meta op already seen on the same input metadata makes its outputs from the cache."""

    def __init__(self) -> None:
        super().__init__()
        self.hits = self.misses = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # False keeps torch from wrapping __torch_dispatch__ in _disable_dynamo (~5% of a dry run); a dry run compiles
        # nothing.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = None
        in_place = False
        if isinstance(func, torch._ops.OpOverload):
            in_place = _in_place_on_first(func) and bool(args) and isinstance(args[0], torch.Tensor)
            if in_place or not _writes_or_aliases(func):
                # keeps the nesting of lists ([a, b], [c] differs from [a], [b, c]), faster than a pytree flatten.
                # Storage offsets are left out: no output follows them, and ZeRO's views differ only by offset
                positional, keywords = _key_of(args), _key_of(tuple(kwargs.values()))
                if positional is not _UNCACHEABLE and keywords is not _UNCACHEABLE:
                    key = (func, torch.get_default_dtype(), positional, tuple(kwargs), keywords)
        if key is not None and key in _cache:
            self.hits += 1
            spec = _cache[key]
            return args[0] if spec is _FIRST_ARGUMENT else _make(spec)
        before = _metadata(args[0]) if in_place else None
        output = func(*args, **kwargs)
        if key is not None:
            self.misses += 1
            if in_place:
                spec = _FIRST_ARGUMENT if output is args[0] and _metadata(output) == before else None
            else:
                spec = _output_spec(output)
            if spec is not None and len(_cache) < MAX_ENTRIES:
                _cache[key] = spec
        return output

