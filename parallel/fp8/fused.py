"""Fused cast regions (issue 87 item 1): each FP8 cast (amax, scale, saturating quantize, the transposed copy a
backward GEMM takes, the guard's counts) is one Python function of tensors, run either as it is (eager: one kernel
per op) or compiled whole by torch.compile into the kernels inductor fuses it to, as TransformerEngine runs a cast,
its transpose and its amax in one kernel (transformer_engine/common/cast/, cast_transpose). The same function runs
either way, so both give the same tensors, bit for bit (tests/parallel/test_fp8_fused.py).

A region runs its plain function instead of compiling where compiling is wrong or impossible:
- fusion is off for the run (--fp8-fused-casts, gpt/fp8.py: `fused=False`);
- a tensor argument is on the meta device (the planner's dry run, planner/dry_run.py: shapes only);
- a TorchDispatchMode that is not an infra mode is active (dynamo refuses to run under one; the planner and
  tests/host_syncs.py count ops under such modes, and see the unfused ops);
- dynamo is already tracing (whole-block --compile): the function is inlined into the block's graph.

`dynamic=False`: a region is compiled for each shape it meets (a dense model's linears have a handful). Compiled
for symbolic shapes instead, inductor miscompiled the 128x128 weight cast of a weight of 128 rows and more columns
(the CPU's code: 40% of the values saturated, tests/parallel/test_fp8_fused.py), and on an H200 a guarded cast's
reductions ran in ~1.5 ms where an unguarded amax took 0.04 (docs/performance.md). The recompile limit is raised for
these functions (experts' padded row counts vary; past the limit a new shape runs the plain function, the same
math)."""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

FUSED_CAST_MODES = ("auto", "on", "off")
# Per region: the dtypes (bf16, fp16, fp32 inputs; e4m3, e5m2 casts), the guard on or off, the recipes' variants:
# a few dozen in one test process, a handful in a run.
RECOMPILE_LIMIT = 64


def _tensors(args) -> list:
    """The tensors among `args`, one level into lists and tuples (the delayed update takes lists)."""
    found = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            found.append(arg)
        elif isinstance(arg, (list, tuple)):
            found.extend(item for item in arg if isinstance(item, torch.Tensor))
    return found


def _runs_plain(args) -> bool:
    """Whether a region must run its plain function (module docstring); `torch.compiler.is_compiling()` first:
    under dynamo the rest is not traced."""
    if torch.compiler.is_compiling():
        return True
    if any(tensor.device.type == "meta" for tensor in _tensors(args)):
        return True
    return any(not mode.is_infra_mode() for mode in _get_current_dispatch_mode_stack())


class FusedRegion:
    """`fn` run compiled whole (fullgraph) where `fused` and the module docstring's conditions allow, else as it
    is. `fn` takes tensors and Python constants and returns tensors (or mutates its tensor arguments in place)."""

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
    """torch.compile's per-function recompile_limit (torch 2.13+); before it, dynamo's one process-wide limit is
    raised to it instead (torch 2.11 on a GPU machine: a region past the default 8 would otherwise run uncompiled)."""
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
    """Why inductor cannot compile a region for this device type, or None; checked once per process: inductor
    must import, and find a C++ compiler (CPU) or Triton (CUDA)."""
    try:
        import torch._inductor.config  # noqa: F401
    except Exception as error:  # any import failure means no inductor here
        return f"torch's inductor does not import ({type(error).__name__}: {error})"
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "no Triton for inductor's CUDA kernels"
    if device_type == "cpu":
        from torch._inductor.cpp_builder import get_cpp_compiler

        try:
            get_cpp_compiler()
        except Exception as error:  # inductor's own search: InvalidCxxCompiler and the like
            return f"no C++ compiler for inductor's CPU kernels ({type(error).__name__})"
        return None
    return f"inductor compiles for cpu and cuda, not {device_type}"


def resolve_fused_casts(mode: str, device: torch.device) -> tuple[bool, str]:
    """--fp8-fused-casts for this run: whether the casts run as fused regions, and the start-up line's clause.
    auto: fused on CUDA, unfused on a CPU (a CPU run is for correctness, and compiling each region costs seconds);
    on: fused wherever inductor compiles; off: unfused. Where inductor cannot compile, unfused, with the reason."""
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
