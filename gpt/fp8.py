"""--fp8-format (Megatron-LM's spelling; dest `fp8`, values e4m3 or hybrid): FP8 training as an opt-in
(issue 40, lever 3), through torchao's float8 linears with the output layer kept in 16-bit.

torchao is CUDA-only and lives in requirements-gpu.txt: nothing here imports it, and whether it is
installed is asked with importlib.util.find_spec, so a CPU run or CI never loads it. The check runs
before any work and refuses, in one line, every case that cannot train in FP8:
- a device that is not CUDA (float8 GEMMs need an H100-class GPU);
- torchao not installed;
- and today also CUDA with torchao: the float8 swap of our tensor-parallel linears is to be built and
  checked on a GPU (issue 40 point 3), so the flag is refused rather than silently training in bf16.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

import torch

from base.errors import ConfigError


def torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def check_fp8(fp8_format: Optional[str], device: torch.device, torchao_available: bool) -> None:
    """Refuse --fp8-format where it cannot run (see the module docstring); nothing when it is unset."""
    if fp8_format is None:
        return
    if device.type != "cuda":
        raise ConfigError(f"--fp8-format {fp8_format} needs a CUDA GPU with float8 GEMMs (H100 or newer); on "
                          f"{device.type} drop it and train with --bf16")
    if not torchao_available:
        raise ConfigError(f"--fp8-format {fp8_format} needs torchao, a CUDA-only package: pip install -r "
                          f"requirements-gpu.txt, or drop --fp8-format")
    raise ConfigError(f"--fp8-format {fp8_format} is not wired into the layers yet (issue 40: to be built and "
                      f"measured on a GPU); drop it and train with --bf16")
