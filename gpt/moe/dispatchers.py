"""Token dispatchers across expert-parallel ranks (--moe-token-dispatcher-type alltoall or allgather), as
Megatron-Core's: dispatch brings tokens to their experts' ranks, combine brings the weighted outputs back. One host read
of counts per layer; drop-and-pad reads none."""

from __future__ import annotations

from typing import Callable, Optional

import torch

from gpt.moe.expert_rows import CapacityRouting, choices_per_expert, grouped_order, read_counts, sum_rows_per_token
from parallel.comm import Communicator
from parallel.mappings import all_to_all, gather_along_first_dim, reduce_scatter_along_first_dim
from parallel.state import ExpertParallel


def _local_experts(experts: ExpertParallel, num_experts: int) -> tuple[int, int]:
    """(num_local, first local expert) for this rank; ValueError naming the flags when EP does not divide them."""
    if num_experts < 1 or num_experts % experts.model_size:
        raise ValueError(f"--num-experts {num_experts} is not a multiple of --expert-model-parallel-size "
                         f"{experts.model_size}: each expert-parallel rank holds the same number of experts")
    num_local = num_experts // experts.model_size
    return num_local, experts.model_rank * num_local


def _check_routing(hidden: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor) -> None:
    """Shapes and dtype only: checking the indices' values would read them back to the host every layer."""
    if hidden.dim() != 2 or probs.shape != indices.shape or probs.dim() != 2 or probs.shape[0] != hidden.shape[0]:
        raise ValueError(f"dispatch takes hidden [T, H], probs [T, K] and indices [T, K]; got {tuple(hidden.shape)}, "
                         f"{tuple(probs.shape)} and {tuple(indices.shape)}")
    if indices.dtype != torch.int64:
        raise ValueError(f"dispatch: indices must be int64, got {indices.dtype}")


def equal_shares(rows: int, parts: int) -> list[int]:
    return [rows // parts + (part < rows % parts) for part in range(parts)]


def _any_rows(count: int, device: torch.device) -> torch.Tensor:
    return torch.zeros(count, dtype=torch.int64, device=device)


def _regroup(rows: torch.Tensor, counts: list[list[int]]) -> torch.Tensor:
    """Chunks of counts [A][B] (A-major) -> B-major."""
    a, b = len(counts), len(counts[0])
    if a == 1 or b == 1:
        return rows
    chunks = rows.split([count for row in counts for count in row])
    return torch.cat([chunks[i * b + j] for j in range(b) for i in range(a)])


def _transposed(counts: list[list[int]]) -> list[list[int]]:
    return [list(column) for column in zip(*counts)]


def _weighted_sum_over_choices(rows: torch.Tensor, order: torch.Tensor, probs: torch.Tensor,
                               num_rows: int) -> torch.Tensor:
    """Each row weighted by its prob and placed at its (token, choice), summed over K in k order."""
    tokens, k = probs.shape
    weighted = rows * probs.reshape(-1)[order].unsqueeze(-1)  # promotes to the probs' dtype, as Megatron's unpermute
    # scatter keeps only the index for backward; each row is written once
    placed = weighted.new_zeros((num_rows, rows.shape[-1])).scatter(0, order.unsqueeze(-1).expand_as(weighted),
                                                                    weighted)
    return placed.view(tokens, k, rows.shape[-1]).sum(dim=1)


def _weighted_sum_over_experts(rows: torch.Tensor, routing: CapacityRouting, num_tokens: int) -> torch.Tensor:
    """Capacity rows weighted and summed per token in expert order."""
    return sum_rows_per_token(rows * routing.probs.reshape(-1).unsqueeze(-1), routing.tokens, num_tokens)


def _gather_rows_of_peers(rows: torch.Tensor, comm: Communicator, experts: ExpertParallel,
                          peer_rows: list[int]) -> torch.Tensor:
    """Every ETP peer's `rows` concatenated in peer order (an all-to-all); its backward sums the peers' gradients."""
    if experts.tensor_size == 1:
        return rows
    copies = torch.cat([rows] * experts.tensor_size)
    return all_to_all(copies, comm, experts.tensor_group, "etp", peer_rows, [rows.shape[0]] * experts.tensor_size)


def _sum_rows_of_peers(rows: torch.Tensor, comm: Communicator, experts: ExpertParallel,
                       peer_rows: list[int]) -> torch.Tensor:
    """Each peer's partial outputs of our rows summed in peer order."""
    if experts.tensor_size == 1:
        return rows
    mine = peer_rows[experts.tensor_rank]
    partials = all_to_all(rows, comm, experts.tensor_group, "etp", [mine] * experts.tensor_size, peer_rows)
    return partials.view(experts.tensor_size, mine, *rows.shape[1:]).sum(dim=0)


class AllToAllDispatcher:
    """Tokens to their experts' EP ranks by all-to-all, as Megatron-Core's MoEAlltoAllTokenDispatcher."""

    def __init__(self, experts: ExpertParallel, num_experts: int, comm: Communicator) -> None:
        self.experts, self.num_experts, self.comm = experts, num_experts, comm
        self.num_local, self.first_local = _local_experts(experts, num_experts)
        self._routing: Optional[dict] = None

    def dispatch(self, hidden: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor):
        _check_routing(hidden, probs, indices)
        experts, num_experts = self.experts, self.num_experts
        ep, etp = experts.model_size, experts.tensor_size
        k = indices.shape[1]
        flat = indices.reshape(-1)
        sent_per_expert = choices_per_expert(flat, num_experts)
        # every rank's rows per expert over ETP x EP, read back with ours in one copy
        every_rank = sent_per_expert.new_empty((etp * ep * num_experts,))
        self.comm.all_gather(every_rank, sent_per_expert, experts.tensor_and_model_group, "etp_ep" if etp > 1 else "ep")
        counts = read_counts(torch.cat([sent_per_expert, every_rank]))
        sent, every = counts[:num_experts], counts[num_experts:]
        # expert-major, token order within; an empty choice (-1) sorts last and sends no row
        order = grouped_order(flat, num_experts)[:sum(sent)]
        received = [every[(source * etp + peer) * num_experts + self.first_local:][:self.num_local]
                    for peer in range(etp) for source in range(ep)]
        input_splits = [sum(sent[rank * self.num_local:(rank + 1) * self.num_local]) for rank in range(ep)]
        return self._exchange(hidden.index_select(0, order // k), input_splits, received, hidden.dtype,
                              lambda back: _weighted_sum_over_choices(back, order, probs, flat.numel()))

    def dispatch_to_capacity(self, hidden: torch.Tensor, routing: CapacityRouting):
        """Drop-and-pad: every expert takes `capacity` rows from every rank; nothing is read back."""
        ep, etp, capacity = self.experts.model_size, self.experts.tensor_size, routing.capacity
        received = [[capacity] * self.num_local for _ in range(etp * ep)]
        return self._exchange(hidden.index_select(0, routing.tokens.reshape(-1)), [capacity * self.num_local] * ep,
                              received, hidden.dtype,
                              lambda back: _weighted_sum_over_experts(back, routing, hidden.shape[0]))

    def _exchange(self, permuted: torch.Tensor, input_splits: list[int], received: list[list[int]],
                  dtype: torch.dtype, weighted_sum: Callable[[torch.Tensor], torch.Tensor]):
        """Send `permuted` to the EP ranks by `input_splits`; return the local experts' rows and counts."""
        experts = self.experts
        ep = experts.model_size
        output_splits = [sum(row) for row in received[experts.tensor_rank * ep:(experts.tensor_rank + 1) * ep]]
        arrived = all_to_all(permuted, self.comm, experts.model_group, "ep", output_splits, input_splits)
        # Expert tensor parallelism: every ETP peer runs its slice of the same experts on the gathered rows.
        peer_rows = [sum(map(sum, received[peer * ep:(peer + 1) * ep])) for peer in range(experts.tensor_size)]
        arrived = _gather_rows_of_peers(arrived, self.comm, experts, peer_rows)
        expert_inputs = _regroup(arrived, received)
        self._routing = dict(received=received, peer_rows=peer_rows, input_splits=input_splits,
                             output_splits=output_splits, dtype=dtype, weighted_sum=weighted_sum)
        return expert_inputs, [sum(column) for column in zip(*received)]

    def dispatch_balanced(self, hidden: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        experts = self.experts
        ep, etp = experts.model_size, experts.tensor_size
        tokens, k = probs.shape
        permuted = hidden.index_select(0, _any_rows(tokens * k, hidden.device))
        every_rank = torch.empty(etp * ep * self.num_experts, dtype=torch.int64, device=hidden.device)
        self.comm.all_gather(every_rank, every_rank.new_empty(self.num_experts), experts.tensor_and_model_group,
                             "etp_ep" if etp > 1 else "ep")
        input_splits = equal_shares(tokens * k, ep)
        output_splits = [input_splits[experts.model_rank]] * ep
        arrived = all_to_all(permuted, self.comm, experts.model_group, "ep", output_splits, input_splits)
        peer_rows = [sum(output_splits)] * etp
        arrived = _gather_rows_of_peers(arrived, self.comm, experts, peer_rows)
        order = _any_rows(tokens * k, hidden.device)
        self._routing = dict(received=None, peer_rows=peer_rows, input_splits=input_splits,
                             output_splits=output_splits, dtype=hidden.dtype,
                             weighted_sum=lambda back: _weighted_sum_over_choices(back, order, probs, tokens * k))
        return arrived, equal_shares(arrived.shape[0], self.num_local)

    def combine(self, expert_outputs: torch.Tensor) -> torch.Tensor:
        if self._routing is None:
            raise RuntimeError("combine() without a dispatch() before it")
        routing, self._routing = self._routing, None
        by_source = expert_outputs if routing["received"] is None else \
            _regroup(expert_outputs, _transposed(routing["received"]))
        by_source = _sum_rows_of_peers(by_source, self.comm, self.experts, routing["peer_rows"])
        back = all_to_all(by_source, self.comm, self.experts.model_group, "ep", routing["input_splits"],
                          routing["output_splits"])
        return routing["weighted_sum"](back).to(routing["dtype"])


class AllGatherDispatcher:
    """Every token to every rank of ETP x EP by all-gather, each keeping its experts' rows (Megatron-Core's
    MoEAllGatherTokenDispatcher)."""

    def __init__(self, experts: ExpertParallel, num_experts: int, comm: Communicator) -> None:
        self.experts, self.num_experts, self.comm = experts, num_experts, comm
        self.num_local, self.first_local = _local_experts(experts, num_experts)
        self.group = experts.tensor_and_model_group
        # the EP group itself while experts are not tensor-parallel
        self.group_name = "etp_ep" if experts.tensor_size > 1 else "ep"
        self._routing: Optional[dict] = None

    def _gathered(self, tensor: torch.Tensor) -> torch.Tensor:
        return gather_along_first_dim(tensor, self.comm, self.group, self.group_name)

    def dispatch(self, hidden: torch.Tensor, probs: torch.Tensor, indices: torch.Tensor):
        _check_routing(hidden, probs, indices)
        k = indices.shape[1]
        every_hidden, every_probs = self._gathered(hidden), self._gathered(probs)
        with torch.no_grad():
            every_indices = self._gathered(indices)
        flat = every_indices.reshape(-1)
        local = flat - self.first_local
        tokens_per_expert = read_counts(choices_per_expert(local, self.num_local))
        order = grouped_order(local, self.num_local)[:sum(tokens_per_expert)]
        self._routing = dict(dtype=hidden.dtype, weighted_sum=lambda outputs: _weighted_sum_over_choices(
            outputs, order, every_probs, flat.numel()))
        return every_hidden.index_select(0, order // k), tokens_per_expert

    def dispatch_to_capacity(self, hidden: torch.Tensor, routing: CapacityRouting):
        tokens, group_size = hidden.shape[0], self.experts.tensor_size * self.experts.model_size
        capacity = routing.capacity
        every_hidden, every_probs = self._gathered(hidden), self._gathered(routing.probs)
        with torch.no_grad():
            every_tokens = self._gathered(routing.tokens)
        mine = slice(self.first_local, self.first_local + self.num_local)
        offsets = torch.arange(group_size, device=hidden.device).view(group_size, 1, 1) * tokens
        local = CapacityRouting(
            tokens=(every_tokens.view(group_size, self.num_experts, capacity)[:, mine] + offsets).transpose(0, 1)
            .reshape(self.num_local, -1),
            probs=every_probs.view(group_size, self.num_experts, capacity)[:, mine].transpose(0, 1)
            .reshape(self.num_local, -1))
        self._routing = dict(dtype=hidden.dtype, weighted_sum=lambda outputs: _weighted_sum_over_experts(
            outputs, local, tokens * group_size))
        return every_hidden.index_select(0, local.tokens.reshape(-1)), [local.capacity] * self.num_local

    def dispatch_balanced(self, hidden: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        tokens, k = probs.shape
        indices = torch.empty((tokens, k), dtype=torch.int64, device=hidden.device)
        every_hidden, every_probs = self._gathered(hidden), self._gathered(probs)
        with torch.no_grad():
            every_indices = self._gathered(indices)
        rows = every_indices.numel() * self.num_local // self.num_experts
        order = _any_rows(rows, hidden.device)
        expert_inputs = every_hidden.index_select(0, order)
        self._routing = dict(dtype=hidden.dtype, weighted_sum=lambda outputs: _weighted_sum_over_choices(
            outputs, order, every_probs, every_indices.numel()))
        return expert_inputs, equal_shares(rows, self.num_local)

    def combine(self, expert_outputs: torch.Tensor) -> torch.Tensor:
        if self._routing is None:
            raise RuntimeError("combine() without a dispatch() before it")
        routing, self._routing = self._routing, None
        summed = routing["weighted_sum"](expert_outputs)
        return reduce_scatter_along_first_dim(summed, self.comm, self.group, self.group_name).to(routing["dtype"])
