"""The token dispatcher: the seam between the MoE layer and expert parallelism.

The layer routes each token to k experts and hands the dispatcher the tokens, their k weights and their k
expert indices; the dispatcher returns this rank's experts' input rows grouped by local expert (in expert
order) with the count per local expert, and after the experts ran, puts their output rows back in token
order, each weighted by its probability and summed over the token's choices. It holds what it needs between
the two calls. `LocalDispatcher` is the one for expert-parallel size 1 (every expert on this rank);
Megatron-Core's MoEAllGatherTokenDispatcher and MoEAlltoAllTokenDispatcher (token_dispatcher.py) implement
the same two steps over an expert-parallel group.

Index -1 is an empty choice: a token's choice dropped by the expert capacity. Its probability is 0; it is not
dispatched. With --moe-pad-expert-input-to-capacity (every expert takes exactly its capacity of rows, a token any
number of them) the layer hands `dispatch_to_capacity` each expert's tokens instead (gpt/moe/expert_rows.py
CapacityRouting): the same rows in the same order, with no count read back to the host.
"""

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
        """hidden [T, H], probs [T, K], indices [T, K] int64 -> (expert inputs [N, H] grouped by local expert,
        rows per local expert, read back once to the host: gpt/moe/expert_rows.py read_counts)."""

    def dispatch_to_capacity(self, hidden: torch.Tensor, routing: CapacityRouting) -> tuple[torch.Tensor, list[int]]:
        """`dispatch` for drop-and-pad routing: every local expert's rows, as many as the shapes say (nothing read
        back)."""

    def combine(self, expert_outputs: torch.Tensor) -> torch.Tensor:
        """expert outputs [N, H] in dispatch's order -> [T, H]: each row times its probability, summed over
        the token's choices."""


class LocalDispatcher:
    """Every expert on this rank. Rows are grouped by expert and, within an expert, in token order - the order
    of Megatron-Core's permute (moe_utils.permute: `routing_map.T` row by row) - and combine adds the weighted
    rows back in that order, as its unpermute does."""

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
        # (token, choice) positions expert-major, then token order; the empty choices (-1) sort last and are cut
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
            # scatter_add_ keeps only the index for backward, where index_add_ keeps `weighted` too (Megatron-Core's
            # unpermute scatter_adds); the same sums on a CPU (tests/gpt/test_moe_combine_saved.py)
            output.scatter_add_(0, self._tokens.unsqueeze(-1).expand_as(weighted), weighted)
        self._tokens = self._weights = self._capacity_tokens = None
        return output


def choices_of(probs: torch.Tensor, routing_map: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's sparse (probs, routing_map) [T, E] as the dispatcher's (probs, indices) [T, width] with the
    chosen experts in increasing order; empty slots are index -1, probability 0. `width`: at least the most choices
    of any token - k without padding (dropless or dropping); a padded map (any number of choices a token) goes to
    the experts as gpt/moe/expert_rows.py's CapacityRouting instead, whose shapes need no count read back."""
    experts = torch.arange(routing_map.shape[1], device=routing_map.device)
    # chosen experts first (in expert order), the rest after: sort keys expert for chosen, E + expert otherwise
    keys = torch.where(routing_map, experts, experts + routing_map.shape[1])
    slots = torch.argsort(keys, dim=1)[:, :width]
    chosen = torch.gather(routing_map, 1, slots)
    indices = torch.where(chosen, slots, torch.full_like(slots, -1))
    chosen_probs = torch.gather(probs, 1, slots) * chosen
    return chosen_probs, indices
