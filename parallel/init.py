"""Initial parameter values as a pure function of (seed, parameter name, element index).

A parameter's initial values are defined on its *whole* tensor (the TP=1 tensor, row-major), element
by element: element e of parameter `name` is a standard normal computed from a counter-based
generator keyed by (seed, name) at counter e, times the parameter's std. Nothing depends on what was
drawn before, so a rank computes exactly the elements it owns (its TP slice; at ZeRO stage 3 only the
DP shard of that slice) at a cost proportional to them, never to the model, and a model materialized
at any TP x DP grid and ZeRO stage holds bitwise the slices of the TP=1 model.

The generator is SplitMix64 (Steele, Lea and Flood, 2014): the i-th output of a stream is a bijective
mix of key + (i+1) * golden gamma. It runs as int64 tensor ops on the target device (multiplication
wraps, as unsigned 64-bit arithmetic needs), so a GPU computes its own shard at memory speed. Two
24-bit uniforms from each 64-bit output go through the Box-Muller transform in float64 before the
result is rounded to float32, so CPU and CUDA agree on the values.

Modules built on the meta device carry an `InitMethod` on each parameter (`param.init_method`);
`materialize` gives such a module real memory and fills it. ZeRO (`zero.apply`) instead fills its
flat buffers directly from `ParameterInitializer.values`, so no rank ever holds a full-size copy.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from parallel.sharding import ShardingRecord, record_of

# SplitMix64's constants, as the signed int64 values with the same bits.
_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
# Elements computed per pass: bounds the temporaries (about 40 bytes an element) whatever the size.
CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class InitMethod:
    """How a parameter starts: normal(0, std) when std > 0, uniform(low, high) with `uniform` (its log with
    `log`: Gated DeltaNet's A_log), else the constant. With `rows`, only the first `rows` rows (dimension 0 of the
    whole tensor: the real vocabulary of a padded embedding) are drawn and later rows are zero, so padding does not
    change any drawn value."""
    std: float = 0.0
    constant: float = 0.0
    rows: Optional[int] = None
    uniform: Optional[tuple[float, float]] = None
    log: bool = False

    @classmethod
    def normal(cls, std: float, rows: Optional[int] = None) -> "InitMethod":
        if not std > 0:
            raise ValueError(f"a normal initialisation needs std > 0, got {std}")
        return cls(std=std, rows=rows)

    @classmethod
    def uniform_between(cls, low: float, high: float, log: bool = False) -> "InitMethod":
        """uniform(low, high), or its log (log-uniform values need 0 < low)."""
        if not low < high or (log and not low > 0):
            raise ValueError(f"a uniform initialisation needs low < high (and 0 < low for its log), got {low}, {high}")
        return cls(uniform=(low, high), log=log)

    @classmethod
    def zeros(cls) -> "InitMethod":
        return cls()

    @classmethod
    def ones(cls) -> "InitMethod":
        return cls(constant=1.0)


def set_init_method(param: nn.Parameter, method: InitMethod) -> nn.Parameter:
    param.init_method = method
    return param


def _logical_shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned z >> bits for int64 tensors (torch's >> is arithmetic)."""
    return (z >> bits).bitwise_and_((1 << (64 - bits)) - 1)


def _splitmix64(key: int, counters: torch.Tensor) -> torch.Tensor:
    """The stream `key`'s outputs at `counters`, as int64 with the bits of SplitMix64's unsigned ones."""
    z = (counters + 1).mul_(_GAMMA).add_(key)
    z.bitwise_xor_(_logical_shift_right(z, 30)).mul_(_MIX1)
    z.bitwise_xor_(_logical_shift_right(z, 27)).mul_(_MIX2)
    return z.bitwise_xor_(_logical_shift_right(z, 31))


def standard_normals(key: int, counters: torch.Tensor) -> torch.Tensor:
    """float32 standard normals, one per int64 counter, for the stream `key` (a signed 64-bit int)."""
    z = _splitmix64(key, counters)
    # u1 in (0, 1] (log stays finite), u2 in [0, 1): 24 bits each.
    u1 = _logical_shift_right(z, 40).add_(1).to(torch.float64).mul_(2.0 ** -24)
    u2 = (z >> 8).bitwise_and_(0xFFFFFF).to(torch.float64).mul_(2.0 * math.pi * 2.0 ** -24)
    return u1.log_().mul_(-2.0).sqrt_().mul_(u2.cos_()).to(torch.float32)


def uniform_values(key: int, counters: torch.Tensor, low: float, high: float, log: bool) -> torch.Tensor:
    """float32 uniforms in [low, high) (or their logs), one per int64 counter: 48 bits of the stream's output in
    float64 before the rounding, so CPU and CUDA agree."""
    unit = _logical_shift_right(_splitmix64(key, counters), 16).to(torch.float64).mul_(2.0 ** -48)
    values = unit.mul_(high - low).add_(low)
    return (values.log_() if log else values).to(torch.float32)


def stream_key(seed: int, name: str) -> int:
    """The generator key of parameter `name` under `seed`, as a signed 64-bit int."""
    digest = hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class ParameterInitializer:
    """Computes any range of any parameter's initial values for a run seeded `seed`: a parameter's sharding
    record (parallel/sharding.py) says which slice of its whole tensor it is, so a rank draws its own elements."""

    def __init__(self, seed: int) -> None:
        if seed < 0:
            raise ValueError(f"the seed must be >= 0, got {seed}")
        self.seed = seed

    def values(self, name: str, param: torch.Tensor, local_start: int, count: int,
               device: torch.device) -> torch.Tensor:
        """float32 initial values of `param`'s flattened local elements [local_start, local_start+count)
        on `device`. `param` may be a meta tensor: only its shape and attributes are read."""
        method: Optional[InitMethod] = getattr(param, "init_method", None)
        if method is None:
            raise ValueError(f"parameter {name!r} has no init_method: it was not built by our layers "
                             "(materialize it yourself, or give it one with parallel.init.set_init_method)")
        if local_start < 0 or count < 0 or local_start + count > param.numel():
            raise ValueError(f"elements [{local_start}, {local_start + count}) are outside {name!r} "
                             f"({param.numel()} elements)")
        if method.std == 0.0 and method.uniform is None:
            return torch.full((count,), method.constant, dtype=torch.float32, device=device)
        record = record_of(param)
        key = stream_key(self.seed, name)
        out = torch.empty(count, dtype=torch.float32, device=device)
        for begin in range(0, count, CHUNK_ELEMENTS):
            n = min(CHUNK_ELEMENTS, count - begin)
            indices = self._whole_indices(record, local_start + begin, n, device)
            chunk = standard_normals(key, indices).mul_(method.std) if method.uniform is None else \
                uniform_values(key, indices, *method.uniform, method.log)
            if method.rows is not None:
                row_numel = math.prod(record.global_shape[1:])
                chunk.masked_fill_(indices >= method.rows * row_numel, 0.0)
            out[begin:begin + n] = chunk
        return out

    @staticmethod
    def _whole_indices(record: ShardingRecord, local_start: int, count: int, device: torch.device) -> torch.Tensor:
        local = torch.arange(local_start, local_start + count, dtype=torch.int64, device=device)
        dim = record.split_dim
        if dim is None:
            return local
        # Split the local index at the split dimension: (outer, position along it, inner). The whole
        # tensor has the same outer and inner extents and a longer extent along the dimension; this
        # rank's positions start at its slice's offset along it.
        inner = math.prod(record.local_shape[dim + 1:])
        local_block = record.local_shape[dim] * inner
        outer, within = local.div(local_block, rounding_mode="floor"), local.remainder(local_block)
        whole_block = record.global_shape[dim] * inner
        return outer.mul_(whole_block).add_(within).add_(record.global_offset[dim] * inner)

    def fill(self, name: str, param: torch.Tensor, out: torch.Tensor, local_start: int = 0) -> torch.Tensor:
        """Write `param`'s local elements [local_start, local_start + out.numel()) into the flat
        tensor `out` (any dtype and device), chunk by chunk."""
        flat = out.view(-1)
        for begin in range(0, flat.numel(), CHUNK_ELEMENTS):
            n = min(CHUNK_ELEMENTS, flat.numel() - begin)
            flat[begin:begin + n] = self.values(name, param, local_start + begin, n, out.device)
        return out


def replace_parameters(module: nn.Module, replacements: dict[int, tuple[nn.Parameter, torch.Tensor]],
                       parameter_class: type = nn.Parameter) -> dict[int, nn.Parameter]:
    """For each `id(old): (old, data)`, put a new Parameter over `data` in every module that holds
    `old` (a tied parameter has several owners), keeping its attributes (its sharding record,
    init_method). Returns id(old) -> the new parameter. Needed to leave the meta device: a meta
    tensor's `.data` cannot be set to a real one. One walk over the modules, whatever the count.
    `parameter_class`: nn.Parameter or a subclass of it (ZeRO's overlapped gather makes gated ones).

    The new parameter's data is *set* to `data`, not wrapped: a view wrapped as a Parameter would share
    its base's version counter, and ZeRO writes into the base (gathering a stage-3 chunk again for
    backward) while autograd still holds the parameter for that backward."""
    new_params = {}
    for key, (old, data) in replacements.items():
        new = parameter_class(torch.empty(0, dtype=data.dtype, device=data.device), requires_grad=old.requires_grad)
        new.data = data
        new.__dict__.update(old.__dict__)
        new_params[key] = new
    for owner in module.modules():
        for name, value in owner._parameters.items():
            if value is not None and id(value) in new_params:
                owner._parameters[name] = new_params[id(value)]
    return new_params


def materialize(module: nn.Module, seed: int, device: torch.device | str = "cpu",
                dtype: torch.dtype = torch.float32) -> nn.Module:
    """Give every meta parameter of `module` memory on `device` in `dtype`, filled with its initial
    values (the slice its sharding record names). Parameters already materialized are left as they are.
    The pairs a submodule names in `adjacent_parameters()` get one allocation, the second's elements right after
    the first's (gpt/mlp.py: SwiGLU's gate and up, then one GEMM), as ZeRO's flat buffers lay them out."""
    initializer = ParameterInitializer(seed)
    device = torch.device(device)
    names = {id(param): name for name, param in module.named_parameters()}
    together = {id(first): second for owner in module.modules() if hasattr(owner, "adjacent_parameters")
                for first, second in owner.adjacent_parameters()}
    replacements = {}
    for name, param in module.named_parameters():
        if param.device.type != "meta" or id(param) in replacements:
            continue
        second = together.get(id(param))
        if second is None or second.device.type != "meta" or id(second) in replacements:
            data = torch.empty(param.shape, dtype=dtype, device=device)
            replacements[id(param)] = (param, initializer.fill(name, param, data))
            continue
        flat = torch.empty(param.numel() + second.numel(), dtype=dtype, device=device)
        for tensor, data in ((param, flat[:param.numel()]), (second, flat[param.numel():])):
            replacements[id(tensor)] = (tensor, initializer.fill(names[id(tensor)], tensor, data.view(tensor.shape)))
    replace_parameters(module, replacements)
    return module
