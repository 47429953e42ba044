"""Megatron's --attention-backend (and --use-flash-attn) as PyTorch's SDPA kernel choice.

Megatron picks among Transformer Engine's kernels; here every kernel is one of
`torch.nn.functional.scaled_dot_product_attention`'s, chosen with `torch.nn.attention.sdpa_kernel`:

    flash          the flash-attention kernel
    fused          a fused kernel: cuDNN's (what Transformer Engine's fused attention runs), else the
                   memory-efficient one; CUDA only
    unfused, local the math kernel (scores materialized), the reference
    auto           PyTorch's choice (the default)

All compute the same attention; they differ in speed, memory and rounding. A choice the device cannot
run is refused before any work rather than failing in the first forward.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpt.model_config import ModelConfig
from base.errors import ConfigError

KERNELS = {
    "auto": None,
    "flash": [SDPBackend.FLASH_ATTENTION],
    "fused": [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
    "unfused": [SDPBackend.MATH],
    "local": [SDPBackend.MATH],
}


def attention_kernels(backend: str):
    """A context in which SDPA uses only the kernels of `backend` (no restriction for auto)."""
    kernels = KERNELS[backend]
    return contextlib.nullcontext() if kernels is None else sdpa_kernel(kernels)


def check_attention_backend(config: ModelConfig, precision: str, device: torch.device) -> None:
    """Refuse, before any work, a kernel the device cannot run for this model and precision."""
    if device.type == "cuda":
        if config.attention_backend == "flash" and precision == "fp32":
            raise ConfigError("--attention-backend flash on CUDA takes 16-bit inputs: add --bf16 or --fp16, or use "
                              "fused or auto")
        return
    if config.attention_backend == "fused":
        raise ConfigError("--attention-backend fused needs CUDA (cuDNN or the memory-efficient kernel); on a CPU use "
                          "flash, unfused (local) or auto")
    if config.attention_backend == "flash" and config.attention_dropout > 0:
        raise ConfigError(f"--attention-backend flash on a CPU has no dropout: set --attention-dropout 0 (it is "
                          f"{config.attention_dropout}) or use auto")
