"""Meta kernels answered from a cache: the same op on inputs of the same shapes, strides and dtypes gives
outputs of the same shapes, strides and dtypes, so a dry run computes each once.

A meta kernel computes no values, only the outputs' metadata, yet many are slow: the ops without a
C++ meta kernel (layer_norm and its backward, gelu and its backward, addmm, softmax's backward, ...)
run torch's Python decompositions, a few milliseconds each. A dry run repeats the same ops on the
same shapes once per layer, and `max-size` repeats whole dry runs at other depths: profiled on the
paper's 100B search (26 dry runs of up to 226 layers), 80% of the time was in those decompositions.

`CachedMetaKernels` is a TorchDispatchMode: it sits below autograd, so what autograd saves for
backward (and the saved-tensor meters count) is unchanged; only the kernel that makes the outputs is
skipped on a repeat. It answers from the cache only where that cannot differ from running the kernel:
- every tensor argument and output is on the meta device;
- the op aliases and mutates nothing and each output owns a fresh storage of exactly its extent at offset 0
  (what `empty_strided` makes); or it is in place on its first argument alone (`add_`, `addmm_`) and left that
  tensor's metadata and storage as they were: the answer is the argument itself. Views and out= ops always run;
- the key is the op, every tensor argument's (type, shape, stride, dtype, layout) and every other argument's
  value, with torch's default dtype. Not storage offsets: no output's metadata follows them, and ZeRO's
  parameters are views of flat buffers at one offset a layer, which would make every layer miss.
Anything else (an argument that cannot be hashed, an output that is not a tensor) runs the kernel.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

META = torch.device("meta")
# Distinct (op, input metadata) pairs kept: a dry run of any depth needs a few thousand; the bound keeps
# a long-lived process (a test session, a search over many shapes) from growing without end.
MAX_ENTRIES = 100_000
_UNCACHEABLE = object()
_FIRST_ARGUMENT = object()  # the cached answer of an in-place op: its first argument, as it was

# One process-wide cache: the entries hold only metadata (no tensors), and are valid for any dry run.
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
    """What an in-place op may change besides values: shape, strides, offset, dtype, the storage and its size."""
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
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in torch._disable_dynamo unless this
        # says False: a wrapper called once per op, ~5% of a dry run. A dry run compiles nothing
        # (planner/dry_run.py builds with `torch_compile=False`), so there is no compilation to keep out.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        key = None
        in_place = False
        if isinstance(func, torch._ops.OpOverload):
            in_place = _in_place_on_first(func) and bool(args) and isinstance(args[0], torch.Tensor)
            if in_place or not _writes_or_aliases(func):
                # _key_of keeps the nesting of lists and tuples (([a, b], [c]) and ([a], [b, c]) differ),
                # and walks them faster than a general pytree flatten (which was ~20% of a dry run).
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
            if in_place:  # t_, resize_ and the like change their argument's metadata: they run every time
                spec = _FIRST_ARGUMENT if output is args[0] and _metadata(output) == before else None
            else:
                spec = _output_spec(output)
            if spec is not None and len(_cache) < MAX_ENTRIES:
                _cache[key] = spec
        return output

