"""Mamba-2's selective state-space scan in plain torch, chunked as the SSD algorithm: attention-like within a chunk, a
carried state across chunks, so memory grows with the chunk. It is the reference the CUDA kernels compute."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ssd_scan(x: torch.Tensor, dt: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
             d: torch.Tensor, chunk: int) -> torch.Tensor:
    """y_t = C_t . h_t + D x_t, h_t = exp(dt_t a) h_{t-1} + dt_t B_t x_t^T per head, in fp32. x [batch, seq, heads,
    head_dim]; dt [batch, seq, heads] (positive); a [heads] (negative); b, c [batch, seq, groups, state]; d [heads]."""
    batch, seq, heads, _ = x.shape
    per_group = heads // b.shape[2]
    x, dt = x.float(), dt.float()
    b = b.float().repeat_interleave(per_group, dim=2)
    c = c.float().repeat_interleave(per_group, dim=2)
    pad = -seq % chunk  # zero padding: dt 0 adds nothing and decays nothing
    chunks = (seq + pad) // chunk

    def chunked(t: torch.Tensor) -> torch.Tensor:
        t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
        return t.reshape(batch, chunks, chunk, *t.shape[2:])

    xdt, log_decay = chunked(x * dt[..., None]), chunked(dt * a.float())   # [B, c, L, H, P], [B, c, L, H]
    b, c = chunked(b), chunked(c)                                          # [B, c, L, H, N]
    cumulative = log_decay.cumsum(dim=2)
    # within a chunk, position l reads m <= l decayed by exp(cum[l] - cum[m])
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    gaps = cumulative[:, :, :, None, :] - cumulative[:, :, None, :, :]     # [B, c, l, m, H]
    decay = torch.exp(gaps.masked_fill(~causal[None, None, :, :, None], float("-inf")))
    scores = torch.einsum("bclhn,bcmhn->bclmh", c, b) * decay
    y = torch.einsum("bclmh,bcmhp->bclhp", scores, xdt)
    # each chunk's contribution to the state at its end, then the states carried chunk to chunk
    to_end = torch.exp(cumulative[:, :, -1:, :] - cumulative)              # [B, c, L, H]
    contributions = torch.einsum("bclhn,bclh,bclhp->bchpn", b, to_end, xdt)
    chunk_decay = torch.exp(cumulative[:, :, -1, :])                       # [B, c, H]
    state = x.new_zeros(batch, heads, x.shape[-1], b.shape[-1])
    entering = []
    for k in range(chunks):
        entering.append(state)
        state = state * chunk_decay[:, k, :, None, None] + contributions[:, k]
    entering = torch.stack(entering, dim=1)                                # [B, c, H, P, N]
    # the state entering the chunk, decayed through positions 0..l
    y = y + torch.einsum("bclhn,bchpn->bclhp", c, entering) * torch.exp(cumulative)[..., None]
    y = y.reshape(batch, chunks * chunk, heads, -1)[:, :seq]
    return y + d.float()[:, None] * x
