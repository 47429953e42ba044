"""The token dispatcher, the seam between the MoE layer and expert parallelism: dispatch gives this rank's experts their
rows grouped by local expert, combine puts the outputs back weighted and summed per token. `LocalDispatcher` serves
expert-parallel size 1."""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from gpt.moe.expert_rows import (
    CapacityRouting,
    choices_per_expert,
    grouped_order,
    read_counts,
    sum_rows_per_token,
)


class TokenDispatcher(Protocol):
    def dispatch(self, hidden: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor
                 ) -> tuple[torch.Tensor, list[int]]:
        """hidden [T, H], probs [T, K], indices [T, K] -> (expert inputs [N, H] grouped by local expert, rows per local
        expert, read back once)."""

    def dispatch_to_capacity(self, hidden: torch.Tensor, routing: CapacityRouting) -> tuple[torch.Tensor, list[int]]:
        """`dispatch` for drop-and-pad routing: shapes known, nothing read back."""

    def combine(self, expert_outputs: torch.Tensor) -> torch.Tensor:
        """[N, H] in dispatch's order -> [T, H]: each row times its probability, summed over the token's choices."""


class LocalDispatcher:
    """Every expert on this rank, rows in the order of Megatron-Core's permute (by expert, then token), combined back in
    that order."""

    def __init__(self, num_experts: int) -> None:
        self.num_experts = num_experts
        self._tokens: Optional[torch.Tensor] = None
        self._weights: Optional[torch.Tensor] = None
        self._capacity_tokens: Optional[torch.Tensor] = None
        self._num_tokens = 0

    def dispatch(self, hidden: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor
                 ) -> tuple[torch.Tensor, list[int]]:
        num_tokens, k = indices.shape
        tokens_per_expert = read_counts(choices_per_expert(indices, self.num_experts))
        # expert-major, then token order; empty choices (-1) sort last and are cut
        order = grouped_order(indices.reshape(-1), self.num_experts)[:sum(tokens_per_expert)]
        self._tokens, self._weights, self._num_tokens = order // k, probs.reshape(-1)[order], num_tokens
        self._capacity_tokens = None
        return hidden.index_select(0, self._tokens), tokens_per_expert

    def dispatch_to_capacity(self, hidden: torch.Tensor, routing: CapacityRouting) -> tuple[torch.Tensor, list[int]]:
        self._tokens, self._weights = routing.tokens.reshape(-1), routing.probs.reshape(-1)
        self._capacity_tokens, self._num_tokens = routing.tokens, hidden.shape[0]
        return hidden.index_select(0, self._tokens), [routing.capacity] * self.num_experts

    def combine(self, expert_outputs: torch.Tensor) -> torch.Tensor:
        weighted = expert_outputs * self._weights.unsqueeze(-1).to(expert_outputs.dtype)
        if self._capacity_tokens is not None:
            output = sum_rows_per_token(weighted, self._capacity_tokens, self._num_tokens)
        else:
            output = torch.zeros(self._num_tokens, expert_outputs.shape[-1], dtype=expert_outputs.dtype,
                                 device=expert_outputs.device)
            # scatter_add_ keeps only the index for backward (index_add_ would keep `weighted` too), as Megatron-Core's
            # unpermute
            output.scatter_add_(0, self._tokens.unsqueeze(-1).expand_as(weighted), weighted)
        self._tokens = self._weights = self._capacity_tokens = None
        return output


def choices_of(probs: torch.Tensor, routing_map: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's sparse (probs, routing_map) [T, E] as (probs, indices) [T, width], chosen experts in increasing
    order, empty slots -1 with probability 0."""
    experts = torch.arange(routing_map.shape[1], device=routing_map.device)
    # chosen experts first in expert order: sort keys expert, or E + expert
    keys = torch.where(routing_map, experts, experts + routing_map.shape[1])
    slots = torch.argsort(keys, dim=1)[:, :width]
    chosen = torch.gather(routing_map, 1, slots)
    indices = torch.where(chosen, slots, torch.full_like(slots, -1))
    chosen_probs = torch.gather(probs, 1, slots) * chosen
    return chosen_probs, indices
