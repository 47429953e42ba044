"""Byte counting for the ZeRO benchmark. `CollectiveShim` wraps torch.distributed's collectives so that DeepSpeed, FSDP2
and DDP are charged the same ring volumes as ours (outermost call only); install it before DeepSpeed or parallel.comm
bind them. `DispatchAudit` also sees the functional collectives that bypass them, on one untimed step."""

from __future__ import annotations

import inspect
import threading
from collections import defaultdict

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode


def ring_bytes_sent(kind: str, full_bytes: int, group_size: int, is_source: bool = True) -> int:
    """parallel.comm's ring volumes. Imported on first use, not at module import: parallel.comm binds
    torch.distributed's reduce_scatter_single when it is imported, so it must load after the shim."""
    from parallel.comm import ring_bytes_sent as ring

    return ring(kind, full_bytes, group_size, is_source)


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


def _sum_nbytes(tensors) -> int:
    return sum(_nbytes(t) for t in tensors or ())


def _group_size(group) -> int:
    return dist.get_world_size(group)


def _group_rank(group) -> int:
    return dist.get_rank(group)


def _is_global_or_group_rank(a: dict, global_key: str, group_key: str) -> bool:
    """True when this rank is the collective's root (a broadcast's source, a gather's destination)."""
    group = a.get("group")
    if a.get(global_key) is not None:
        return dist.get_rank() == a[global_key]
    if a.get(group_key) is not None:
        return _group_rank(group) == a[group_key]
    return False


def _ring(kind: str, full_bytes: int, a: dict, source: bool = True) -> tuple[str, int]:
    return kind, ring_bytes_sent(kind, full_bytes, _group_size(a.get("group")), source)


def _n(a: dict) -> int:
    return _group_size(a.get("group"))


def _root(a: dict, global_key: str) -> bool:
    return _is_global_or_group_rank(a, global_key, "group_" + global_key)


# name -> function of the bound arguments returning (kind, bytes this rank sends). A ring reduce sends
# what a ring reduce-scatter does (the root gathers nothing back); all-to-all sends all but its own part.
_CHARGES = {
    "all_reduce": lambda a: _ring("all_reduce", _nbytes(a["tensor"]), a),
    "all_reduce_coalesced": lambda a: _ring("all_reduce", _sum_nbytes(a["tensors"]), a),
    "reduce": lambda a: ("reduce", ring_bytes_sent("reduce_scatter", _nbytes(a["tensor"]), _n(a))),
    "broadcast": lambda a: _ring("broadcast", _nbytes(a["tensor"]), a, _root(a, "src")),
    "all_gather": lambda a: _ring("all_gather", _sum_nbytes(a["tensor_list"]), a),
    "all_gather_single": lambda a: _ring("all_gather", _nbytes(a["output_tensor"]), a),
    "all_gather_into_tensor": lambda a: _ring("all_gather", _nbytes(a["output_tensor"]), a),
    "_all_gather_base": lambda a: _ring("all_gather", _nbytes(a["output_tensor"]), a),
    "all_gather_coalesced": lambda a: _ring("all_gather", _n(a) * _sum_nbytes(a["input_tensor_list"]), a),
    "reduce_scatter": lambda a: _ring("reduce_scatter", _sum_nbytes(a["input_list"]), a),
    "reduce_scatter_single": lambda a: _ring("reduce_scatter", _nbytes(a["input"]), a),
    "reduce_scatter_tensor": lambda a: _ring("reduce_scatter", _nbytes(a["input"]), a),
    "_reduce_scatter_base": lambda a: _ring("reduce_scatter", _nbytes(a["input"]), a),
    "all_to_all_single": lambda a: ("all_to_all", ring_bytes_sent("all_gather", _nbytes(a["input"]), _n(a))),
    "all_to_all": lambda a: ("all_to_all", ring_bytes_sent("all_gather", _sum_nbytes(a["input_tensor_list"]), _n(a))),
    "gather": lambda a: ("gather", 0 if _root(a, "dst") else _nbytes(a["tensor"])),
    "scatter": lambda a: ("scatter", _sum_nbytes(a.get("scatter_list")) if _root(a, "src") else 0),
    "send": lambda a: ("send", _nbytes(a["tensor"])),
    "isend": lambda a: ("send", _nbytes(a["tensor"])),
    "batch_isend_irecv": lambda a: ("send", sum(_nbytes(op.tensor) for op in a["p2p_op_list"]
                                                if op.op in (dist.isend, dist.send))),
    "barrier": lambda a: ("barrier", 0),
}
_MODULES = (dist, dist.distributed_c10d)


class CollectiveShim:
    """Counts bytes sent by this rank through torch.distributed's collective functions, per function
    name and collective kind. `install()` once per process, before importing the system under test."""

    def __init__(self) -> None:
        self._local = threading.local()
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes_by_function: dict[str, int] = defaultdict(int)
        self.bytes_by_kind: dict[str, int] = defaultdict(int)
        self.installed: list[str] = []

    def install(self) -> "CollectiveShim":
        import sys

        if "parallel.comm" in sys.modules or "deepspeed" in sys.modules:
            raise RuntimeError("install the collective shim before importing parallel.comm or deepspeed: both "
                               "keep references to torch.distributed functions taken at import")
        for name, charge in _CHARGES.items():
            original = getattr(dist.distributed_c10d, name, None) or getattr(dist, name, None)
            if original is None:
                continue
            wrapper = self._wrap(name, original, charge)
            for module in _MODULES:
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapper)
            self.installed.append(name)
        return self

    def _wrap(self, name, original, charge):
        signature = inspect.signature(original)
        local = self._local

        def counted(*args, **kwargs):
            depth = getattr(local, "depth", 0)
            if depth == 0:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                kind, sent = charge(bound.arguments)
                self.calls[name] += 1
                self.bytes_by_function[name] += sent
                self.bytes_by_kind[kind] += sent
            local.depth = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                local.depth = depth

        counted.__wrapped__ = original
        counted.__name__ = name
        return counted

    def reset(self) -> None:
        self.calls.clear()
        self.bytes_by_function.clear()
        self.bytes_by_kind.clear()

    def total(self) -> int:
        return sum(self.bytes_by_kind.values())

    def snapshot(self) -> dict:
        return {"total": self.total(), "by_kind": dict(self.bytes_by_kind),
                "by_function": dict(self.bytes_by_function), "calls": dict(self.calls)}


def _flat(items):
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from _flat(item)
        else:
            yield item


def _tensors_nbytes(arg) -> int:
    if isinstance(arg, torch.Tensor):
        return _nbytes(arg)
    if isinstance(arg, (list, tuple)):
        return sum(_nbytes(t) for t in _flat(arg))
    return 0


class DispatchAudit(TorchDispatchMode):
    """Charges every collective op that reaches the dispatcher, whatever Python path issued it.

    `world_size` is the size of every group used here (TP=1: the one data-parallel group is the world).
    """

    def __init__(self, world_size: int, rank: int) -> None:
        super().__init__()
        self.world_size = world_size
        self.rank = rank
        self.calls: dict[str, int] = defaultdict(int)
        self.bytes_by_op: dict[str, int] = defaultdict(int)
        self.unknown: set[str] = set()

    def _charge(self, op: str, args) -> int:
        n, ring = self.world_size, lambda kind, m: ring_bytes_sent(kind, m, self.world_size)
        if op in ("c10d.allreduce_", "c10d.allreduce_coalesced_"):
            return ring("all_reduce", _tensors_nbytes(args[0]))
        if op in ("_c10d_functional.all_reduce", "_c10d_functional.all_reduce_",
                  "_c10d_functional.all_reduce_coalesced", "_c10d_functional.all_reduce_coalesced_"):
            return ring("all_reduce", _tensors_nbytes(args[0]))
        if op in ("c10d.allgather_", "c10d.allgather_coalesced_"):
            return ring("all_gather", n * _tensors_nbytes(args[1]))
        if op in ("c10d._allgather_base_", "c10d.allgather_into_tensor_coalesced_"):
            return ring("all_gather", _tensors_nbytes(args[0]))
        if op.startswith("_c10d_functional.all_gather_into_tensor"):
            return ring("all_gather", n * _tensors_nbytes(args[0]))
        if op in ("c10d.reduce_scatter_", "c10d._reduce_scatter_base_", "c10d.reduce_scatter_tensor_coalesced_"):
            return ring("reduce_scatter", _tensors_nbytes(args[1]))
        if op.startswith("_c10d_functional.reduce_scatter_tensor"):
            return ring("reduce_scatter", _tensors_nbytes(args[0]))
        if op == "c10d.broadcast_":  # (tensors, process_group, root_rank, root_tensor, ...)
            return _tensors_nbytes(args[0]) if args[2] == self.rank else 0
        if op == "c10d.reduce_":
            return ring("reduce_scatter", _tensors_nbytes(args[0]))
        if op in ("c10d.barrier", "_c10d_functional.wait_tensor", "_c10d_functional._wrap_tensor_autograd"):
            return 0
        self.unknown.add(op)
        return 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # A mode runs before tensor subclasses, and whatever the subclass then issues would escape it.
        # Stepping aside lets DTensor (FSDP2's parameters) lower the op into plain ops and functional
        # collectives first -- its gradient-norm all-reduce, say -- which then come back through here.
        if any(t is not torch.Tensor and t is not torch.nn.Parameter for t in types):
            return NotImplemented
        name = str(func.overloadpacket._qualified_op_name).replace("::", ".")
        if name.startswith(("c10d.", "_c10d_functional.")):
            self.calls[name] += 1
            self.bytes_by_op[name] += self._charge(name, args)
        return func(*args, **(kwargs or {}))

    def total(self) -> int:
        return sum(self.bytes_by_op.values())

    def snapshot(self) -> dict:
        return {"total": self.total(), "by_op": dict(self.bytes_by_op), "calls": dict(self.calls),
                "unknown_ops": sorted(self.unknown)}
