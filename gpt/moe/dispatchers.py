"""Token dispatchers across expert-parallel ranks: alltoall and allgather (--moe-token-dispatcher-type).

With expert parallelism EP, rank r holds experts r x num_local ... (r + 1) x num_local - 1 (num_local = num_experts /
EP). A dispatcher brings each of this rank's tokens to the ranks holding its chosen experts and, after the experts
ran, brings the outputs back, with the interface of the EP-1 dispatcher (a structural match with the Protocol in
gpt/moe/dispatcher.py); one dispatch, then one combine, which reuses the dispatch's routing:

    dispatch(hidden [T, H], probs [T, K], indices [T, K]) -> expert_inputs [N, H] grouped by local expert, and
        tokens_per_expert [num_local], read back once with every count the exchanges need (expert_rows.read_counts)
    dispatch_to_capacity(hidden, CapacityRouting)  (--moe-pad-expert-input-to-capacity): every count a shape
    combine(expert_outputs [N, H]) -> [T, H]: each row weighted by its prob (in the probs' dtype, as Megatron-Core's
        unpermute promotes) and summed over the token's K choices, in k order

Zero tokens (Megatron-LM #1877; DeepSpeed #4808, a ZeRO-3 hang): every rank joins every collective whatever its
counts, with zero-row splits and tensors, so an expert or rank with no tokens neither crashes nor leaves a peer
waiting; the layer passes combine outputs computed from `expert_inputs` (an empty expert keeps its weights in the
graph with a zero gradient), so the backward exchanges run on every rank. On the meta device (the planner's dry
run) `dispatch_balanced` runs the same collectives for a routing that gives every expert an equal share, so the
plan counts each exchange's bytes as the live communicator does. Equal to EP 1 in fp32 (tests/gpt/test_moe_dispatchers.py)
but where a matmul rounds differently for another row count: same rows, same order, the sum over K in k order."""

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
    """The shapes and dtype; not the indices' values, which the router made in [0, E) or -1 (an empty choice, its
    prob 0, not dispatched): checking them would read them back to the host every layer (gpt/moe/expert_rows.py)."""
    if hidden.dim() != 2 or probs.shape != indices.shape or probs.dim() != 2 or probs.shape[0] != hidden.shape[0]:
        raise ValueError(f"dispatch takes hidden [T, H], probs [T, K] and indices [T, K]; got {tuple(hidden.shape)}, "
                         f"{tuple(probs.shape)} and {tuple(indices.shape)}")
    if indices.dtype != torch.int64:
        raise ValueError(f"dispatch: indices must be int64, got {indices.dtype}")


def equal_shares(rows: int, parts: int) -> list[int]:
    """`rows` split into `parts` shares differing by at most one, the larger first: the balanced routing's."""
    return [rows // parts + (part < rows % parts) for part in range(parts)]


def _any_rows(count: int, device: torch.device) -> torch.Tensor:
    """An int64 index of `count` rows (its values unknown: on the meta device it is only a shape)."""
    return torch.zeros(count, dtype=torch.int64, device=device)


def _regroup(rows: torch.Tensor, counts: list[list[int]]) -> torch.Tensor:
    """`rows` in chunks of counts [A][B] (A-major; host values) -> the same chunks B-major (sort_chunks_by_idxs)."""
    a, b = len(counts), len(counts[0])
    if a == 1 or b == 1:
        return rows
    chunks = rows.split([count for row in counts for count in row])
    return torch.cat([chunks[i * b + j] for j in range(b) for i in range(a)])


def _transposed(counts: list[list[int]]) -> list[list[int]]:
    return [list(column) for column in zip(*counts)]


def _weighted_sum_over_choices(rows: torch.Tensor, order: torch.Tensor, probs: torch.Tensor,
                               num_rows: int) -> torch.Tensor:
    """rows[i] is (token, choice) `order[i]` of the flattened [tokens, K]: place each row, weighted by its prob,
    at its (token, choice) (zeros where no row is), and sum over the K choices, in k order."""
    tokens, k = probs.shape
    weighted = rows * probs.reshape(-1)[order].unsqueeze(-1)  # promotes to the probs' dtype, as Megatron's unpermute
    # scatter keeps only the index for backward (index_copy keeps `weighted` too); each row is written once
    placed = weighted.new_zeros((num_rows, rows.shape[-1])).scatter(0, order.unsqueeze(-1).expand_as(weighted),
                                                                    weighted)
    return placed.view(tokens, k, rows.shape[-1]).sum(dim=1)


def _weighted_sum_over_experts(rows: torch.Tensor, routing: CapacityRouting, num_tokens: int) -> torch.Tensor:
    """rows [E' x C, H] in the order of `routing`'s tokens: each weighted by its prob (promoted to the probs' dtype, as
    _weighted_sum_over_choices) and summed per token in expert order - the order in which a padded token's choices
    sit in [T, K'], so the same sums."""
    return sum_rows_per_token(rows * routing.probs.reshape(-1).unsqueeze(-1), routing.tokens, num_tokens)


def _gather_rows_of_peers(rows: torch.Tensor, comm: Communicator, experts: ExpertParallel,
                          peer_rows: list[int]) -> torch.Tensor:
    """Every ETP peer's `rows` (peer p has peer_rows[p]), concatenated in peer order: Megatron's all-gather with
    output split sizes, here an all-to-all that sends this rank's rows to every peer. Its backward (the autograd
    of the copies) sums each peer's gradient of our rows: the reduce-scatter with split sizes."""
    if experts.tensor_size == 1:
        return rows
    copies = torch.cat([rows] * experts.tensor_size)
    return all_to_all(copies, comm, experts.tensor_group, "etp", peer_rows, [rows.shape[0]] * experts.tensor_size)


def _sum_rows_of_peers(rows: torch.Tensor, comm: Communicator, experts: ExpertParallel,
                       peer_rows: list[int]) -> torch.Tensor:
    """The reverse of _gather_rows_of_peers: each peer's partial outputs of our rows summed (in peer order), our
    rows only: Megatron's reduce-scatter with input split sizes, here an all-to-all and a sum."""
    if experts.tensor_size == 1:
        return rows
    mine = peer_rows[experts.tensor_rank]
    partials = all_to_all(rows, comm, experts.tensor_group, "etp", [mine] * experts.tensor_size, peer_rows)
    return partials.view(experts.tensor_size, mine, *rows.shape[1:]).sum(dim=0)


class AllToAllDispatcher:
    """Tokens to their experts' EP ranks by all-to-all over the expert-parallel group: Megatron-Core's
    MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/token_dispatcher.py).

    1. permute: this rank's T x K (token, choice) rows sorted by expert, stably (tokens stay in order within an
       expert: Megatron's permute with a routing map, moe_utils.py);
    2. counts: every EP rank's tokens per expert, all-gathered over EP (int64, counted on "ep") and read back with
       ours in one copy, the layer's one host sync (Megatron's `cuda_sync_point`); padded to capacity every count
       is known and neither happens (Megatron's drop_and_pad preprocess);
    3. all-to-all of the rows over EP, split by destination rank (a split may be 0);
    4. with ETP > 1, the rows each ETP peer received gathered over ETP (Megatron's all-gather with output split
       sizes; here an all-to-all, the peers' counts differing), so every peer runs its slice of the same experts;
    5. rows grouped by (peer,) source rank then local expert are regrouped by local expert, then (peer,) source
       (Megatron's sort_chunks_by_idxs).
    combine runs the reverse: ungroup, sum the ETP peers' partial outputs, all-to-all back, unpermute, weight, sum
    over K."""

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
        sent_per_expert = choices_per_expert(flat, num_experts)  # [E], this rank's rows per expert
        # Every rank's rows per expert over the ETP x EP group (ETP fastest): what this rank and its ETP peers receive
        # for each local expert from each EP rank. Read back with this rank's own, in one copy: the splits below.
        every_rank = sent_per_expert.new_empty((etp * ep * num_experts,))
        self.comm.all_gather(every_rank, sent_per_expert, experts.tensor_and_model_group, "etp_ep" if etp > 1 else "ep")
        counts = read_counts(torch.cat([sent_per_expert, every_rank]))
        sent, every = counts[:num_experts], counts[num_experts:]
        # (token, choice) rows, expert-major, token order within; an empty choice (-1) sorts last and sends no row
        order = grouped_order(flat, num_experts)[:sum(sent)]
        received = [every[(source * etp + peer) * num_experts + self.first_local:][:self.num_local]
                    for peer in range(etp) for source in range(ep)]  # [(ETP peer, EP source)][local expert]
        input_splits = [sum(sent[rank * self.num_local:(rank + 1) * self.num_local]) for rank in range(ep)]
        return self._exchange(hidden.index_select(0, order // k), input_splits, received, hidden.dtype,
                              lambda back: _weighted_sum_over_choices(back, order, probs, flat.numel()))

    def dispatch_to_capacity(self, hidden: torch.Tensor, routing: CapacityRouting):
        """Drop-and-pad: every expert takes `capacity` rows from every rank, so every split is known from the shapes
        and nothing is counted or read back (Megatron-Core's drop_and_pad preprocess: no all-gather of the counts)."""
        ep, etp, capacity = self.experts.model_size, self.experts.tensor_size, routing.capacity
        received = [[capacity] * self.num_local for _ in range(etp * ep)]
        return self._exchange(hidden.index_select(0, routing.tokens.reshape(-1)), [capacity * self.num_local] * ep,
                              received, hidden.dtype,
                              lambda back: _weighted_sum_over_experts(back, routing, hidden.shape[0]))

    def _exchange(self, permuted: torch.Tensor, input_splits: list[int], received: list[list[int]],
                  dtype: torch.dtype, weighted_sum: Callable[[torch.Tensor], torch.Tensor]):
        """Steps 3-5 of the module docstring: `permuted` (this rank's rows, expert-major) sent `input_splits` to each
        EP rank; `received` [(ETP peer, EP source)][local expert] the rows each local expert gets from each (host
        values). Returns the local experts' rows grouped by local expert and their counts; combine calls
        `weighted_sum` on the rows that came back (in `permuted`'s order)."""
        experts = self.experts
        ep = experts.model_size
        output_splits = [sum(row) for row in received[experts.tensor_rank * ep:(experts.tensor_rank + 1) * ep]]
        arrived = all_to_all(permuted, self.comm, experts.model_group, "ep", output_splits, input_splits)
        # Expert tensor parallelism: the ETP peers' arrivals gathered (their counts differ), every peer then runs
        # its slice of the same experts on the same rows.
        peer_rows = [sum(map(sum, received[peer * ep:(peer + 1) * ep])) for peer in range(experts.tensor_size)]
        arrived = _gather_rows_of_peers(arrived, self.comm, experts, peer_rows)
        expert_inputs = _regroup(arrived, received)  # (peer, source)-major -> local-expert-major
        self._routing = dict(received=received, peer_rows=peer_rows, input_splits=input_splits,
                             output_splits=output_splits, dtype=dtype, weighted_sum=weighted_sum)
        return expert_inputs, [sum(column) for column in zip(*received)]

    def dispatch_balanced(self, hidden: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """`dispatch` for the stated balanced routing (module docstring): probs [T, K] are each row's weights. This
        rank's T x K rows go to the EP ranks in equal shares, and each EP rank sends this one its share of its
        own; the ETP peers receive as many. Returns the local experts' rows and their equal shares (a list)."""
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
            _regroup(expert_outputs, _transposed(routing["received"]))  # local-expert-major -> source-major
        by_source = _sum_rows_of_peers(by_source, self.comm, self.experts, routing["peer_rows"])
        back = all_to_all(by_source, self.comm, self.experts.model_group, "ep", routing["input_splits"],
                          routing["output_splits"])
        return routing["weighted_sum"](back).to(routing["dtype"])


class AllGatherDispatcher:
    """Every token to every rank of the ETP x EP group by all-gather; each keeps its local experts' rows:
    Megatron-Core's MoEAllGatherTokenDispatcher. Tokens, probs and choices are all-gathered over the expert
    tensor-and-model group; combine puts each weighted output row back at its (token, choice), sums over K and
    reduce-scatters over the group, so each rank gets its own tokens' sums (with ETP > 1 that also sums the ETP
    peers' partial outputs). Every rank of the group holds the same number of tokens T, as Megatron assumes too
    (the sequence-parallel slices of one micro-batch)."""

    def __init__(self, experts: ExpertParallel, num_experts: int, comm: Communicator) -> None:
        self.experts, self.num_experts, self.comm = experts, num_experts, comm
        self.num_local, self.first_local = _local_experts(experts, num_experts)
        self.group = experts.tensor_and_model_group
        # Counted as the group it is: the EP group itself while experts are not tensor-parallel.
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
        local = flat - self.first_local  # outside [0, num_local): another rank's expert, or an empty choice
        tokens_per_expert = read_counts(choices_per_expert(local, self.num_local))
        order = grouped_order(local, self.num_local)[:sum(tokens_per_expert)]  # local-expert-major, token order within
        self._routing = dict(dtype=hidden.dtype, weighted_sum=lambda outputs: _weighted_sum_over_choices(
            outputs, order, every_probs, flat.numel()))
        return every_hidden.index_select(0, order // k), tokens_per_expert

    def dispatch_to_capacity(self, hidden: torch.Tensor, routing: CapacityRouting):
        """Drop-and-pad: every rank's routing gathered as each expert's tokens ([E, capacity] a rank: the same shape on
        every rank of the group, as the tokens are); this rank's experts take their rows from every source rank, in
        rank then token order, `capacity` x the group's ranks each."""
        tokens, group_size = hidden.shape[0], self.experts.tensor_size * self.experts.model_size
        capacity = routing.capacity
        every_hidden, every_probs = self._gathered(hidden), self._gathered(routing.probs)
        with torch.no_grad():
            every_tokens = self._gathered(routing.tokens)
        mine = slice(self.first_local, self.first_local + self.num_local)
        offsets = torch.arange(group_size, device=hidden.device).view(group_size, 1, 1) * tokens
        local = CapacityRouting(  # [local expert, (source rank, its token)], as rows of every rank's tokens
            tokens=(every_tokens.view(group_size, self.num_experts, capacity)[:, mine] + offsets).transpose(0, 1)
            .reshape(self.num_local, -1),
            probs=every_probs.view(group_size, self.num_experts, capacity)[:, mine].transpose(0, 1)
            .reshape(self.num_local, -1))
        self._routing = dict(dtype=hidden.dtype, weighted_sum=lambda outputs: _weighted_sum_over_experts(
            outputs, local, tokens * group_size))
        return every_hidden.index_select(0, local.tokens.reshape(-1)), [local.capacity] * self.num_local

    def dispatch_balanced(self, hidden: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """`dispatch` for the stated balanced routing (module docstring): the same gathers; of the group's rows,
        the local experts' equal share. Returns those rows and each local expert's share (a list)."""
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
