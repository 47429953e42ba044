"""Initial parameter values as a pure function of (seed, parameter name, element index): a counter-based SplitMix64
stream per parameter, Box-Muller in float64, so a rank draws only the elements it owns and any TP x DP grid and ZeRO
stage holds bitwise the TP=1 model's slices, on CPU and CUDA alike."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from parallel.sharding import ShardingRecord, record_of

# SplitMix64's constants as signed int64 values with the same bits
_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
# elements per pass: bounds the temporaries (about 40 bytes an element)
CHUNK_ELEMENTS = 1 << 20


# what a uniform draw becomes: Mamba-2's A_log and its dt_bias (Megatron-Core's MambaMixer)
UNIFORM_TRANSFORMS = ("log", "exp_floor_inverse_softplus")


@dataclass(frozen=True)
class InitMethod:
    """How a parameter starts: normal(0, std) when std > 0, uniform on [low, high) (then transformed) when high > low,
    else the constant. With `rows` only the first rows are drawn, so vocabulary padding changes no drawn value."""
    std: float = 0.0
    constant: float = 0.0
    rows: Optional[int] = None
    low: float = 0.0
    high: float = 0.0
    transform: Optional[str] = None
    floor: float = 0.0

    @classmethod
    def uniform(cls, low: float, high: float, then: Optional[str] = None, floor: float = 0.0) -> "InitMethod":
        if not high > low or then not in (None, *UNIFORM_TRANSFORMS):
            raise ValueError(f"a uniform initialisation needs high > low and a transform of {UNIFORM_TRANSFORMS}, "
                             f"got [{low}, {high}), {then!r}")
        return cls(low=low, high=high, transform=then, floor=floor)

    def from_uniform(self, unit: torch.Tensor) -> torch.Tensor:
        """Values from float64 uniforms on [0, 1): scaled to [low, high), transformed, as float32."""
        values = unit.mul_(self.high - self.low).add_(self.low)
        if self.transform == "log":
            values = values.log_()
        elif self.transform == "exp_floor_inverse_softplus":
            dt = values.exp_().clamp_(min=self.floor)
            values = dt + torch.log(-torch.expm1(-dt))
        return values.to(torch.float32)

    @classmethod
    def normal(cls, std: float, rows: Optional[int] = None) -> "InitMethod":
        if not std > 0:
            raise ValueError(f"a normal initialisation needs std > 0, got {std}")
        return cls(std=std, rows=rows)

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
    """Unsigned z >> bits for int64 tensors."""
    return (z >> bits).bitwise_and_((1 << (64 - bits)) - 1)


def _splitmix(key: int, counters: torch.Tensor) -> torch.Tensor:
    """SplitMix64's outputs (as int64) at the int64 counters of the stream `key`."""
    z = (counters + 1).mul_(_GAMMA).add_(key)
    z.bitwise_xor_(_logical_shift_right(z, 30)).mul_(_MIX1)
    z.bitwise_xor_(_logical_shift_right(z, 27)).mul_(_MIX2)
    return z.bitwise_xor_(_logical_shift_right(z, 31))


def unit_uniforms(key: int, counters: torch.Tensor) -> torch.Tensor:
    """float64 uniforms on [0, 1) with 53 random bits, one per counter."""
    return _logical_shift_right(_splitmix(key, counters), 11).to(torch.float64).mul_(2.0 ** -53)


def standard_normals(key: int, counters: torch.Tensor) -> torch.Tensor:
    """float32 standard normals, one per counter."""
    z = _splitmix(key, counters)
    # u1 in (0, 1] so log stays finite; 24 bits each
    u1 = _logical_shift_right(z, 40).add_(1).to(torch.float64).mul_(2.0 ** -24)
    u2 = (z >> 8).bitwise_and_(0xFFFFFF).to(torch.float64).mul_(2.0 * math.pi * 2.0 ** -24)
    return u1.log_().mul_(-2.0).sqrt_().mul_(u2.cos_()).to(torch.float32)


def stream_key(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class ParameterInitializer:
    """Computes any range of any parameter's initial values for `seed`: the sharding record says which slice of the
    whole tensor a parameter is."""

    def __init__(self, seed: int) -> None:
        if seed < 0:
            raise ValueError(f"the seed must be >= 0, got {seed}")
        self.seed = seed

    def values(self, name: str, param: torch.Tensor, local_start: int, count: int,
               device: torch.device) -> torch.Tensor:
        """float32 initial values of `param`'s flattened local elements [local_start, local_start+count) on `device`;
        `param` may be a meta tensor."""
        method: Optional[InitMethod] = getattr(param, "init_method", None)
        if method is None:
            raise ValueError(f"parameter {name!r} has no init_method: it was not built by our layers "
                             "(materialize it yourself, or give it one with parallel.init.set_init_method)")
        if local_start < 0 or count < 0 or local_start + count > param.numel():
            raise ValueError(f"elements [{local_start}, {local_start + count}) are outside {name!r} "
                             f"({param.numel()} elements)")
        if method.std == 0.0 and not method.high > method.low:
            return torch.full((count,), method.constant, dtype=torch.float32, device=device)
        record = record_of(param)
        key = stream_key(self.seed, name)
        out = torch.empty(count, dtype=torch.float32, device=device)
        for begin in range(0, count, CHUNK_ELEMENTS):
            n = min(CHUNK_ELEMENTS, count - begin)
            indices = self._whole_indices(record, local_start + begin, n, device)
            chunk = standard_normals(key, indices).mul_(method.std) if method.std > 0 else \
                method.from_uniform(unit_uniforms(key, indices))
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
        # the local index split at the split dimension (outer, along, inner); this rank's positions start at its slice's
        # offset
        inner = math.prod(record.local_shape[dim + 1:])
        local_block = record.local_shape[dim] * inner
        outer, within = local.div(local_block, rounding_mode="floor"), local.remainder(local_block)
        whole_block = record.global_shape[dim] * inner
        return outer.mul_(whole_block).add_(within).add_(record.global_offset[dim] * inner)

    def fill(self, name: str, param: torch.Tensor, out: torch.Tensor, local_start: int = 0) -> torch.Tensor:
        """Write `param`'s local elements from `local_start` into the flat tensor `out`, chunk by chunk."""
        flat = out.view(-1)
        for begin in range(0, flat.numel(), CHUNK_ELEMENTS):
            n = min(CHUNK_ELEMENTS, flat.numel() - begin)
            flat[begin:begin + n] = self.values(name, param, local_start + begin, n, out.device)
        return out


def replace_parameters(module: nn.Module, replacements: dict[int, tuple[nn.Parameter, torch.Tensor]],
                       parameter_class: type = nn.Parameter) -> dict[int, nn.Parameter]:
    """For each `id(old): (old, data)`, put a new Parameter over `data` in every module that holds `old`, keeping its
    attributes; returns id(old) -> the new parameter. The data is *set*, not wrapped: a wrapped view would share its
    base's version counter, which ZeRO's gathers write while autograd holds the parameter."""
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
    """Give every meta parameter of `module` memory on `device` in `dtype`, filled with its initial values. The pairs in
    `adjacent_parameters()` share one allocation, as ZeRO's flat buffers lay them out."""
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
