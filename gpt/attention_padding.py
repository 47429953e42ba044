"""Head dims the fused CUDA attention kernels do not take (GPT-2 1.5B's 100) zero-padded to a multiple of 8: with the
scale passed as 1/sqrt(original dim) the padding changes nothing in the result."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

# 16-bit fused CUDA kernels need head dims that are multiples of this
HEAD_DIM_MULTIPLE = 8
MAX_FUSED_HEAD_DIM = 256
# unfused/local restrict SDPA to the math kernel
FUSED_CAPABLE_BACKENDS = ("auto", "flash", "fused")


def padded_head_dim(head_dim: int, device_type: str, backend: str, enabled: bool) -> int:
    """`head_dim`, or the next multiple of 8 where padding lets a fused CUDA kernel run."""
    if not enabled or device_type != "cuda" or backend not in FUSED_CAPABLE_BACKENDS:
        return head_dim
    padded = -(-head_dim // HEAD_DIM_MULTIPLE) * HEAD_DIM_MULTIPLE
    return padded if padded <= MAX_FUSED_HEAD_DIM else head_dim


def attention_at_head_dim(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_dim: int,
                          dropout_p: float, enable_gqa: bool = False,
                          attention_mask: Optional[torch.Tensor] = None,
                          scale: Optional[float] = None) -> torch.Tensor:
    """Causal (or masked) SDPA computed at `head_dim` >= d, the result at d; exactly the unpadded call when equal."""
    original = query.shape[-1]
    grouped = {"enable_gqa": True} if enable_gqa else {}
    masking = {"is_causal": True} if attention_mask is None else {"attn_mask": attention_mask}
    if head_dim == original:
        scaled = {} if scale is None else {"scale": scale}
        return F.scaled_dot_product_attention(query, key, value, dropout_p=dropout_p, **masking, **grouped, **scaled)
    pad = (0, head_dim - original)
    context = F.scaled_dot_product_attention(F.pad(query, pad), F.pad(key, pad), F.pad(value, pad),
                                             dropout_p=dropout_p, scale=1.0 / math.sqrt(original) if scale is None
                                             else scale, **masking, **grouped)
    return context[..., :original]
