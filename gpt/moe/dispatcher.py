"""The token dispatcher: the seam between the MoE layer and expert parallelism.

The layer routes each token to k experts and hands the dispatcher the tokens, their k weights and their k
expert indices; the dispatcher returns this rank's experts' input rows grouped by local expert (in expert
order) with the count per local expert, and after the experts ran, puts their output rows back in token
order, each weighted by its probability and summed over the token's choices. It holds what it needs between
the two calls. `LocalDispatcher` is the one for expert-parallel size 1 (every expert on this rank);
Megatron-Core's MoEAllGatherTokenDispatcher and MoEAlltoAllTokenDispatcher (token_dispatcher.py) implement
the same two steps over an expert-parallel group.

Index -1 is an empty choice: a token's choice dropped by the expert capacity, or a row of `indices` padded
past the token's choices (--moe-pad-expert-input-to-capacity can route a token to more than k experts). Its
probability is 0; it is not dispatched.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch


class TokenDispatcher(Protocol):
    def dispatch(self, hidden: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [T, H], probs [T, K], indices [T, K] int64 -> (expert inputs [N, H] grouped by local expert,
        tokens per local expert: int64 [num_local_experts])."""

    def combine(self, expert_outputs: torch.Tensor) -> torch.Tensor:
        """expert outputs [N, H] in dispatch's order -> [T, H]: each row times its probability, summed over
        the token's choices."""


class LocalDispatcher:
    """Every expert on this rank. Rows are grouped by expert and, within an expert, in token order - the order
    of Megatron-Core's permute (moe_utils.permute: `routing_map.T` row by row) - and combine scatter-adds the
    weighted rows back as its unpermute does."""

    def __init__(self, num_experts: int) -> None:
        self.num_experts = num_experts
        self._tokens: Optional[torch.Tensor] = None
        self._weights: Optional[torch.Tensor] = None
        self._num_tokens = 0

    def dispatch(self, hidden: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        num_tokens, k = indices.shape
        token_of_choice = torch.arange(num_tokens, device=indices.device).unsqueeze(1).expand(num_tokens, k)
        chosen = indices >= 0
        experts, tokens, weights = indices[chosen], token_of_choice[chosen], probs[chosen]
        # expert-major, then token order: one stable sort on expert * T + token
        order = torch.argsort(experts * num_tokens + tokens)
        self._tokens, self._weights, self._num_tokens = tokens[order], weights[order], num_tokens
        tokens_per_expert = torch.bincount(experts, minlength=self.num_experts)
        return hidden.index_select(0, self._tokens), tokens_per_expert

    def combine(self, expert_outputs: torch.Tensor) -> torch.Tensor:
        weighted = expert_outputs * self._weights.unsqueeze(-1).to(expert_outputs.dtype)
        output = torch.zeros(self._num_tokens, expert_outputs.shape[-1], dtype=expert_outputs.dtype,
                             device=expert_outputs.device)
        output.index_add_(0, self._tokens, weighted)
        self._tokens = self._weights = None
        return output


def choices_of(probs: torch.Tensor, routing_map: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's sparse (probs, routing_map) [T, E] as the dispatcher's (probs, indices) [T, K'] with the
    chosen experts in increasing order; K' = k when no token has more choices (dropless, or dropping), else
    the most choices of any token (padding to capacity); empty slots are index -1, probability 0."""
    counts = routing_map.sum(dim=1)
    width = max(topk, int(counts.max())) if routing_map.numel() else topk
    experts = torch.arange(routing_map.shape[1], device=routing_map.device)
    # chosen experts first (in expert order), the rest after: sort keys expert for chosen, E + expert otherwise
    keys = torch.where(routing_map, experts, experts + routing_map.shape[1])
    slots = torch.argsort(keys, dim=1)[:, :width]
    chosen = torch.gather(routing_map, 1, slots)
    indices = torch.where(chosen, slots, torch.full_like(slots, -1))
    chosen_probs = torch.gather(probs, 1, slots) * chosen
    return chosen_probs, indices
