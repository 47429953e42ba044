"""Megatron's --attention-backend (and --use-flash-attn) as a choice among PyTorch SDPA's kernels: flash, fused (cuDNN,
else memory-efficient), unfused/local (math) or auto."""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpt.model_config import ModelConfig

KERNELS = {
    "auto": None,
    "flash": [SDPBackend.FLASH_ATTENTION],
    "fused": [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
    "unfused": [SDPBackend.MATH],
    "local": [SDPBackend.MATH],
}


def attention_kernels(backend: str):
    """A context in which SDPA uses only `backend`'s kernels."""
    kernels = KERNELS[backend]
    return contextlib.nullcontext() if kernels is None else sdpa_kernel(kernels)


def backend_for_device(config: ModelConfig, precision: str, device: torch.device,
                       flag: str = "", attention_mask: bool = False) -> tuple[str, Optional[str]]:
    """The backend to run on `device`: the one asked for, or `auto` with a line saying why (CUDA's flash kernel takes no
    explicit mask)."""
    asked = flag if flag not in ("", "--attention-backend") else f"--attention-backend {config.attention.attention_backend}"
    why = None
    if device.type == "cuda":
        if config.attention.attention_backend == "flash" and precision == "fp32":
            why = "the flash kernel on CUDA takes 16-bit inputs (add --bf16 or --fp16 to use it)"
        elif config.attention.attention_backend == "flash" and attention_mask:
            why = ("the flash kernel on CUDA takes no attention mask and --reset-attention-mask needs one "
                   "(each document's block of causal attention)")
        elif config.attention.attention_backend == "flash" and config.has_windows():
            # SDPA has no window argument: the sliding window is a mask
            why = "the flash kernel on CUDA takes no attention mask and --window-size's sliding window is one here"
    elif config.attention.attention_backend == "fused":
        why = "the fused kernels need CUDA"
    elif config.attention.attention_backend == "flash" and config.attention.attention_dropout > 0:
        why = (f"the flash kernel on a CPU has no dropout and --attention-dropout is {config.attention.attention_dropout} "
               f"(set it to 0 to use it)")
    if why is None:
        return config.attention.attention_backend, None
    return "auto", (f"> {asked}: {why}; attention runs PyTorch's own choice of kernel here (auto), the same "
                    f"math")
