"""The bytes autograd saves for backward, counted on the CPU, where the count is exact: `SavedTensorCounter` names each
storage by the op and module that made it and sums the storages saved tensors keep alive, each once and whole,
parameters left out. It imports torch alone, for Megatron-LM's process."""

from __future__ import annotations

import contextlib
import re
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

BEFORE = "(made before the count)"
NO_MODULE = "(no module)"
# allocations that an op writing into them names better (an all-gather's output, a copy_'s destination)
_ALLOCATIONS = {"aten.empty", "aten.empty_strided", "aten.empty_like", "aten.new_empty", "aten.new_empty_strided",
                "aten.zeros", "aten.zeros_like", "aten.new_zeros"}
_LAYER_INDEX = re.compile(r"(^|\.)(layers|blocks)\.\d+(?=\.|$)")


def layer_free(path: str) -> str:
    """A module path with its wrappers' `module.` prefixes dropped and its layer index a star (`decoder.layers.3.mlp`
    -> `decoder.layers.*.mlp`): the same tensor of every layer has one name; the root is `model`."""
    while path == "module" or path.startswith("module."):
        path = path[len("module."):]
    return _LAYER_INDEX.sub(r"\1\2.*", path) or "model"


def _storages(tensor: torch.Tensor) -> list[torch.UntypedStorage]:
    """The storages a tensor holds: its own, or a wrapper subclass's inner tensors'."""
    if hasattr(tensor, "__tensor_flatten__") and type(tensor) is not torch.Tensor and \
            not isinstance(tensor, nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        return [storage for name in names for storage in _storages(getattr(tensor, name))]
    return [tensor.untyped_storage()]


class _Saved:
    """What the pack hook hands autograd: only the graph refers to it, so it dies when the tensor stops being
    saved."""
    __slots__ = ("tensor", "saver", "__weakref__")

    def __init__(self, tensor: torch.Tensor, saver: str) -> None:
        self.tensor, self.saver = tensor, saver


@dataclass
class SavedBytes:
    """The live saved storages at one moment: their bytes in all, and by name ("<module path> <op>", the layer index
    a star) with the modules that saved them."""
    total: int = 0
    by_name: dict = field(default_factory=dict)  # name -> bytes
    saved_by: dict = field(default_factory=dict)  # name -> sorted module paths that saved it

    def as_json(self) -> dict:
        return {"total": self.total, "by_name": dict(sorted(self.by_name.items())),
                "saved_by": dict(sorted(self.saved_by.items()))}


class SavedTensorCounter(TorchDispatchMode):
    """Names storages by the op and module that made them while entered; records saved tensors inside `saving()`
    (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._module_names: dict[int, str] = {}
        self._parameter_storages: set[int] = set()
        self._modules: list[str] = []
        self._producers: dict[int, tuple[str, str]] = {}  # storage data pointer -> (module path, op)
        self._holders: list[weakref.ref] = []

    def name_modules(self, root: nn.Module, prefix: str = "") -> None:
        """`root`'s modules named by their paths under it, its parameters' storages left out of every count."""
        for name, module in root.named_modules(prefix=prefix):
            self._module_names[id(module)] = name
        for parameter in root.parameters():
            self._parameter_storages.add(parameter.untyped_storage().data_ptr())

    def _module(self) -> str:
        return self._modules[-1] if self._modules else NO_MODULE

    def _pre_hook(self, module, args) -> None:
        # a module made on the fly (no path of its own): its class inside the module running it
        name = self._module_names.get(id(module))
        self._modules.append(layer_free(name) if name is not None else f"{self._module()}.{type(module).__name__}")

    def _post_hook(self, module, args, output) -> None:
        if self._modules:
            self._modules.pop()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view or func.namespace == "profiler":
            return out
        op = f"{func.namespace}.{func._opname}"
        inputs = {storage.data_ptr() for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)
                  for storage in _storages(leaf)}
        for leaf in tree_leaves(out):
            if not isinstance(leaf, torch.Tensor):
                continue
            for storage in _storages(leaf):
                pointer = storage.data_ptr()
                if storage.nbytes() == 0:
                    continue
                if pointer not in inputs:  # a new allocation: this op made it
                    self._producers[pointer] = (self._module(), op)
                elif self._producers.get(pointer, ("", ""))[1] in _ALLOCATIONS:  # written into after its allocation
                    self._producers[pointer] = (self._module(), op)
        return out

    @contextlib.contextmanager
    def naming(self) -> Iterator["SavedTensorCounter"]:
        """Name storages (this mode and the global module hooks) while inside."""
        pre = nn.modules.module.register_module_forward_pre_hook(self._pre_hook)
        post = nn.modules.module.register_module_forward_hook(self._post_hook, always_call=True)
        try:
            with self:
                yield self
        finally:
            pre.remove()
            post.remove()

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Record what autograd saves while inside (the holders of earlier records are dropped)."""
        self._holders = []
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def _pack(self, tensor: torch.Tensor):
        if isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter):
            return tensor
        holder = _Saved(tensor, self._module())
        self._holders.append(weakref.ref(holder))
        return holder

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def saved(self) -> SavedBytes:
        """The storages of the tensors recorded by the last `saving()` that are still saved now."""
        result, seen = SavedBytes(), set()
        savers: dict[str, set] = {}
        for ref in self._holders:
            holder = ref()
            if holder is None:
                continue
            for storage in _storages(holder.tensor):
                pointer = storage.data_ptr()
                if pointer in seen or pointer in self._parameter_storages or storage.nbytes() == 0:
                    continue
                seen.add(pointer)
                module, op = self._producers.get(pointer, (BEFORE, ""))
                name = f"{module} {op}".strip()
                result.total += storage.nbytes()
                result.by_name[name] = result.by_name.get(name, 0) + storage.nbytes()
                savers.setdefault(name, set()).add(holder.saver)
        result.saved_by = {name: sorted(paths) for name, paths in savers.items()}
        return result


def per_layer(deep: SavedBytes | dict, shallow: SavedBytes | dict, layers: int) -> dict:
    """Bytes per layer, in all and by name: the difference between two depths over the `layers` between them (a
    name whose bytes do not change with depth drops out)."""
    deep = deep.as_json() if isinstance(deep, SavedBytes) else deep
    shallow = shallow.as_json() if isinstance(shallow, SavedBytes) else shallow
    names = sorted(set(deep["by_name"]) | set(shallow["by_name"]))
    by_name = {name: (deep["by_name"].get(name, 0) - shallow["by_name"].get(name, 0)) / layers for name in names}
    return {"total": (deep["total"] - shallow["total"]) / layers,
            "by_name": {name: value for name, value in by_name.items() if value != 0},
            "saved_by": {name: deep["saved_by"].get(name, shallow["saved_by"].get(name, []))
                         for name, value in by_name.items() if value != 0}}

