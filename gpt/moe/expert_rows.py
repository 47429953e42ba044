"""Which rows each expert receives, computed on the device in host-known shapes: no nonzero, bincount or .item(), since
every read back stalls the host and breaks CUDA graph capture. A layer without padding makes one read, of its counts."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def choices_per_expert(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int64 [num_experts]: how many of `indices` name each expert (those outside [0, num_experts) count nowhere), by
    scatter-add."""
    flat = indices.reshape(-1)
    kept = (flat >= 0) & (flat < num_experts)
    return torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(
        0, torch.where(kept, flat, 0), kept.to(torch.int64))


def grouped_order(groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """The positions of `groups` sorted stably by group, those outside [0, num_groups) last: `nonzero` plus a stable
    sort, at full length."""
    kept = (groups >= 0) & (groups < num_groups)
    return torch.argsort(torch.where(kept, groups, num_groups), stable=True)


def read_counts(counts: torch.Tensor) -> list[int]:
    """The layer's one read: every count it needs, in one copy."""
    return counts.tolist()


@dataclass(frozen=True)
class CapacityRouting:
    """Drop-and-pad routing: expert e receives `tokens[e]` (int64 [E, capacity], token order), each weighted by
    `probs[e]` (0 for padding)."""
    tokens: torch.Tensor
    probs: torch.Tensor

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]


def capacity_routing(probs: torch.Tensor, routing_map: torch.Tensor, capacity: int) -> CapacityRouting:
    """The padded (probs, routing_map) as each expert's tokens in token order, as moe_utils.permute with
    drop_and_pad."""
    tokens = routing_map.t().to(torch.int8).argsort(dim=-1, descending=True, stable=True)[:, :capacity]
    return CapacityRouting(tokens=tokens, probs=torch.gather(probs.t(), 1, tokens))


def sum_rows_per_token(rows: torch.Tensor, tokens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """rows [E' x C, H] grouped by expert -> [num_tokens, H]: each token's rows summed in expert order, one index_add
    per expert so no two adds race on a GPU."""
    output = rows.new_zeros((num_tokens, rows.shape[-1]))
    by_expert = rows.view(*tokens.shape, rows.shape[-1])
    for expert in range(tokens.shape[0]):
        output.index_add_(0, tokens[expert], by_expert[expert])
    return output
