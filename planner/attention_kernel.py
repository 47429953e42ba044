"""What scaled_dot_product_attention keeps for backward on the planned device, from a call on the meta device. On meta
SDPA takes the math path and keeps the [b, heads, s, s] weights; where the planned device runs the flash or
memory-efficient kernel (q, k, v, output, logsumexp, any mask), the flash kernel's CPU meta op stands in."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode

from gpt.attention_backend import KERNELS

STAND_IN_KWARGS = {"dropout_p", "is_causal", "attn_mask", "enable_gqa", "scale"}


class AttentionKernelOf(TorchFunctionMode):
    """Make SDPA on meta tensors save what it saves on `device_type`."""

    def __init__(self, device_type: str, attention_backend: str = "auto") -> None:
        super().__init__()
        self.device_type = device_type
        self.math_only = KERNELS.get(attention_backend) == [SDPBackend.MATH]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and self._stands_in(args, kwargs):
            return _what_the_flash_kernel_keeps(*args, **kwargs)
        return func(*args, **kwargs)

    def _stands_in(self, args, kwargs) -> bool:
        """Whether the planned device runs a kernel that keeps what flash keeps: CUDA runs GQA, masked or fp32 calls on
        the math path; a CPU's flash kernel takes one head width, so narrower values run there on the math path too."""
        if self.math_only or len(args) != 3 or not set(kwargs) <= STAND_IN_KWARGS:
            return False
        query, key, value = args
        grouped = query.shape[-3] != key.shape[-3]
        if grouped and not kwargs.get("enable_gqa", False):
            return False
        if self.device_type == "cuda":
            return not grouped or (kwargs.get("attn_mask") is None and query.dtype in (torch.float16, torch.bfloat16))
        return value.shape[-1] == query.shape[-1] and kwargs.get("dropout_p", 0.0) == 0.0


def _what_the_flash_kernel_keeps(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                                 is_causal: bool = False, attn_mask=None, enable_gqa: bool = False,
                                 scale=None) -> torch.Tensor:
    """The flash kernel's CPU op on meta; narrower values (CUDA only) padded with zero columns and cut after."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=attn_mask.device).masked_fill(
            ~attn_mask, float("-inf"))
    width = value.shape[-1]
    if width != query.shape[-1]:
        value = F.pad(value, (0, query.shape[-1] - width))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0][..., :width]
