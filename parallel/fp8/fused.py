"""Fused cast regions: each FP8 cast is one Python function of tensors, run as it is or compiled whole into the few
kernels TransformerEngine runs, the same bits either way. A region runs plain with fusion off, on meta, under a dispatch
mode or inside an outer trace."""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

FUSED_CAST_MODES = ("auto", "on", "off")
RECOMPILE_LIMIT = 64


def _tensors(args) -> list:
    found = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            found.append(arg)
        elif isinstance(arg, (list, tuple)):
            found.extend(item for item in arg if isinstance(item, torch.Tensor))
    return found


def _runs_plain(args) -> bool:
    """Whether a region must run plain; under dynamo the rest is not traced."""
    if torch.compiler.is_compiling():
        return True
    if any(tensor.device.type == "meta" for tensor in _tensors(args)):
        return True
    return any(not mode.is_infra_mode() for mode in _get_current_dispatch_mode_stack())


class FusedRegion:
    """`fn` compiled whole where `fused` and the conditions allow, else run as it is."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self._compiled: Optional[Callable] = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args, fused: bool, **kwargs):
        if not fused or _runs_plain((*args, *kwargs.values())):
            return self.fn(*args, **kwargs)
        if self._compiled is None:
            self._compiled = torch.compile(self.fn, fullgraph=True, dynamic=False, **_recompile_limit())
        return self._compiled(*args, **kwargs)


def _recompile_limit() -> dict:
    """torch.compile's per-function recompile_limit, or dynamo's process-wide one before torch 2.13."""
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return {"recompile_limit": RECOMPILE_LIMIT}
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, RECOMPILE_LIMIT)
    return {}


def fused_region(fn: Callable) -> FusedRegion:
    """Decorator: `fn` as a FusedRegion, called `fn(*args, fused=..., **kwargs)`."""
    return FusedRegion(fn)


@functools.lru_cache(maxsize=None)
def compile_unavailable(device_type: str) -> Optional[str]:
    """Why inductor cannot compile a region for this device type, or None; checked once per process."""
    try:
        import torch._inductor.config  # noqa: F401
    except Exception as error:
        return f"torch's inductor does not import ({type(error).__name__}: {error})"
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "no Triton for inductor's CUDA kernels"
    if device_type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as error:
            return f"no C++ compiler for inductor's CPU kernels ({type(error).__name__})"
        return None
    return f"inductor compiles for cpu and cuda, not {device_type}"


def resolve_fused_casts(mode: str, device: torch.device) -> tuple[bool, str]:
    """--fp8-fused-casts for this run and the start-up clause. auto: fused on CUDA, unfused on a CPU (compiling costs
    seconds); unfused where inductor cannot compile."""
    if mode not in FUSED_CAST_MODES:
        raise ValueError(f"--fp8-fused-casts {mode}: one of {', '.join(FUSED_CAST_MODES)}")
    if mode == "off":
        return False, "casts unfused (--fp8-fused-casts off): one kernel per operation of each cast"
    if mode == "auto" and device.type != "cuda":
        return False, (f"casts unfused (--fp8-fused-casts auto on {device.type}: a CPU run checks numerics, and "
                       f"compiling each cast region costs seconds; --fp8-fused-casts on fuses here too)")
    if device.type == "meta":
        return False, "casts unfused on the meta device (shapes only)"
    reason = compile_unavailable(device.type)
    if reason is not None:
        return False, f"casts unfused: {reason} (--fp8-fused-casts {mode})"
    return True, ("casts fused: each cast (amax, scale, quantize, its transposed copy, the guard's counts) and each "
                  "GEMM's epilogue one compiled region (torch.compile, --fp8-fused-casts " + mode + ")")
