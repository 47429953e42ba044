"""Which rows each expert receives, computed on the device in shapes the host knows, for the dispatchers
(gpt/moe/dispatcher.py, gpt/moe/dispatchers.py) and the layer's token counts (gpt/moe/layer.py).

A CUDA graph replays a micro-batch only if nothing in it reads a device value back to the host, and every such read
stalls the host's queue of kernels even without graphs (issue 76 item 2; tests/host_syncs.py counts them). So no
boolean indexing (`nonzero`), no `torch.bincount` (it reads its input's maximum first) and no `.item()` here: the
choices an expert holds are counted by a scatter-add, and the rows are ordered by a stable sort that puts the rows
no local expert takes last.

Two routings reach a dispatcher:

- choices, `indices` [T, K] (an expert per choice, -1 an empty one): how many rows each expert gets depends on the
  routing, and the host must know it to size the exchanges. `read_counts` is that read, the one host sync of an MoE
  layer that does not pad, as Megatron-Core's alltoall dispatcher has one (token_dispatcher.py at d98e8a64,
  MoEAlltoAllTokenDispatcher: preprocess sets the sync point; _maybe_dtoh_and_synchronize copies the counts to the
  host and waits on `self.d2h_event.synchronize()`);
- `CapacityRouting`, drop-and-pad: every expert receives exactly `capacity` rows, known from the shapes
  (gpt/moe/router.py padded_capacity), so nothing is read; Megatron-Core's drop_and_pad path
  (`num_tokens_per_local_expert = torch.full(..., self.capacity * tp * ep)`, its sync point "no_sync";
  moe_utils.py permute with drop_and_pad: an argsort of the map per expert)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def choices_per_expert(indices: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int64 [num_experts]: how many of the choices in `indices` (any shape) name each expert; one outside
    [0, num_experts) (-1, an empty choice; another rank's expert) is counted nowhere. torch.bincount's counts, by a
    scatter-add on the device."""
    flat = indices.reshape(-1)
    kept = (flat >= 0) & (flat < num_experts)
    return torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(
        0, torch.where(kept, flat, 0), kept.to(torch.int64))


def grouped_order(groups: torch.Tensor, num_groups: int) -> torch.Tensor:
    """The positions of `groups` (1-D), sorted by group, stably (so in position order within a group), those outside
    [0, num_groups) last: what `groups.nonzero()` followed by a stable sort of the kept ones gives, at full length
    (the caller keeps the first as many as the groups hold)."""
    kept = (groups >= 0) & (groups < num_groups)
    return torch.argsort(torch.where(kept, groups, num_groups), stable=True)


def read_counts(counts: torch.Tensor) -> list[int]:
    """The one read an MoE layer without padding makes of the device (module docstring): its routing counts, every
    one it needs in one copy."""
    return counts.tolist()


@dataclass(frozen=True)
class CapacityRouting:
    """Drop-and-pad routing (--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity): expert e receives
    the tokens `tokens[e]` (int64 [E, capacity], in token order), each weighted by `probs[e]` (0 for a padding row).
    A token may be in any number of experts' rows (0 to E)."""
    tokens: torch.Tensor
    probs: torch.Tensor

    @property
    def capacity(self) -> int:
        return self.tokens.shape[1]


def capacity_routing(probs: torch.Tensor, routing_map: torch.Tensor, capacity: int) -> CapacityRouting:
    """The router's padded (probs, routing_map) [T, E], whose every column holds exactly `capacity` chosen tokens, as
    each expert's tokens in token order: moe_utils.permute with drop_and_pad (a stable descending argsort of each
    expert's column of the map, its first `capacity`), with the probabilities gathered at them (its unpermute's
    `probs_T_1D.index_select`)."""
    tokens = routing_map.t().to(torch.int8).argsort(dim=-1, descending=True, stable=True)[:, :capacity]
    return CapacityRouting(tokens=tokens, probs=torch.gather(probs.t(), 1, tokens))


def sum_rows_per_token(rows: torch.Tensor, tokens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """rows [E' x C, H], grouped by expert in the order of `tokens` [E', C] (each expert's tokens, distinct within an
    expert) -> [num_tokens, H]: each token's rows summed in expert order, zeros for a token with none. One index_add
    per expert: its tokens are distinct, so no two of its adds meet on a row and the sum is in expert order on any
    device (a single index_add over every row would race on a GPU)."""
    output = rows.new_zeros((num_tokens, rows.shape[-1]))
    by_expert = rows.view(*tokens.shape, rows.shape[-1])
    for expert in range(tokens.shape[0]):
        output.index_add_(0, tokens[expert], by_expert[expert])
    return output
