"""Head dims the fused CUDA attention kernels do not take, padded to ones they do (issue 40, lever 1).

The paper's GPT-2 1.5B has 16 heads of 100. On CUDA, PyTorch's SDPA admits a 16-bit head dim to the
memory-efficient and cuDNN kernels only as a multiple of 8 (sdp_utils.cpp, see the test), so head dim
100 falls back to slower paths. Zero-padding q, k and v to the next multiple of 8 changes nothing in the
attention when the softmax scale is passed as 1/sqrt(original head dim): the padded columns add 0 to
every q.k, and the padded columns of the output (weighted sums of zero columns of v) are sliced off.

Whether to pad is a pure function of (head dim, device, backend, setting), so the selection is
checked on a CPU; the padded computation is the same code on every device. On a CPU nothing is
padded: the default math there stays bit-identical.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

# The head dim the 16-bit fused CUDA kernels require to be a multiple of (memory-efficient: the
# GEMM alignment, 128 bits / 16; cuDNN: d % 8), and the largest any of them takes.
HEAD_DIM_MULTIPLE = 8
MAX_FUSED_HEAD_DIM = 256
# Backends that may reach a fused CUDA kernel; unfused/local restrict SDPA to the math kernel.
FUSED_CAPABLE_BACKENDS = ("auto", "flash", "fused")


def padded_head_dim(head_dim: int, device_type: str, backend: str, enabled: bool) -> int:
    """The head dim attention runs at: `head_dim`, or the next multiple of 8 where padding lets a fused
    CUDA kernel run (CUDA, a backend that may use one, padding enabled, and the result within the
    kernels' largest head dim)."""
    if not enabled or device_type != "cuda" or backend not in FUSED_CAPABLE_BACKENDS:
        return head_dim
    padded = -(-head_dim // HEAD_DIM_MULTIPLE) * HEAD_DIM_MULTIPLE
    return padded if padded <= MAX_FUSED_HEAD_DIM else head_dim


def attention_at_head_dim(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, head_dim: int,
                          dropout_p: float, enable_gqa: bool = False,
                          attention_mask: Optional[torch.Tensor] = None,
                          scale: Optional[float] = None) -> torch.Tensor:
    """Causal SDPA of [batch, heads, seq, d] tensors computed at head dim `head_dim` >= d, the result at d;
    with `enable_gqa`, key and value hold one head per group of query heads (gpt/model.py). `attention_mask`
    [batch, 1, seq, seq] (bool, True where allowed, causal included: data/documents.py's, under
    --reset-attention-mask) replaces the causal flag where given.

    At head_dim == d this is exactly the unpadded call (the default scale is 1/sqrt(d)). `scale`: the scores'
    scale where it is not 1/sqrt(d) (--softmax-scale)."""
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
