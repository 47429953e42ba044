"""What scaled_dot_product_attention keeps for backward on the planned device, from a call on the meta device.

On meta, SDPA takes the math path, which keeps the [b, heads, s, s] weights. A GPU runs the flash kernel (keeping q,
k, v, the output and a [b, heads, s] logsumexp), and so does a CPU without dropout (with dropout, the math path); the
flash kernel's CPU op has a meta implementation with the same saved tensors, so it stands in. With an explicit mask
(CP's all_gather, --reset-attention-mask) a CPU without dropout runs the same kernel with the mask, turned into the
query's dtype, which it keeps too (the math path planned tests/training/test_context_parallel_activation_memory.py's
all_gather CP 2 rank 18% high); a GPU runs the memory-efficient kernel, keeping the same. A `scale` (MLA's,
--softmax-scale) changes no kernel. Values narrower than the queries (multi-latent attention): on CUDA under a
fused-capable backend the run pads them to the query width (gpt/mla.py value_needs_padding reads the tensors' device,
meta here), so the stand-in pads them and keeps the padded values and output; a CPU's flash kernel takes one head
width, so there (under auto) the run and the plan take the math path.

With grouped-query attention (enable_gqa) a kernel that takes it keeps k and v a head per group; the math path
repeats them per query head and keeps the weights. torch's CPU flash kernel takes GQA, masked or not. On CUDA in
torch 2.13 only flash does among flash and memory-efficient (sdp_utils.cpp; memory-efficient took GQA only with
pytorch/pytorch#191085), and flash takes neither a mask nor fp32: there a GQA call runs the math path (cuDNN's
kernel runs first only where torch prefers it, sm90/sm100 with cuDNN above 9.15), and the plan keeps the math
path's tensors, the larger. --attention-backend unfused and local restrict SDPA to the math kernel on a real
run (gpt/attention_backend.py), so there the meta call's own math path is what the run keeps."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend
from torch.overrides import TorchFunctionMode

from gpt.attention_backend import KERNELS

STAND_IN_KWARGS = {"dropout_p", "is_causal", "attn_mask", "enable_gqa", "scale"}


class AttentionKernelOf(TorchFunctionMode):
    """Make scaled_dot_product_attention on meta tensors save what it saves on `device_type` (the module's
    docstring)."""

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
        """Whether the planned device runs a kernel that keeps what the flash kernel keeps (the module's docstring)."""
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
    """The flash kernel's CPU op on meta: its output, its saved q, k, v, output, log-sum-exp (and a mask, in the
    query's dtype). Narrower values (CUDA's only, `_stands_in`) padded with the run's zero columns and cut after."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=attn_mask.device).masked_fill(
            ~attn_mask, float("-inf"))
    width = value.shape[-1]
    if width != query.shape[-1]:
        value = F.pad(value, (0, query.shape[-1] - width))
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0][..., :width]
