"""Megatron-Core's TopKRouter and its routing arithmetic (top-k, group-limited top-k, Sinkhorn, token dropping,
capacity, expert bias) in plain PyTorch. It sees tokens in Megatron's [sequence, batch] order, so order-dependent
results (sequence aux loss, position drop policy) are Megatron's."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from gpt.moe.balancing import (
    MoELossTracker,
    attach,
    scores_for_aux_loss,
    sequence_load_balancing_loss,
    switch_load_balancing_loss,
    z_loss,
)
from gpt.moe.settings import MoESettings
from parallel.init import InitMethod
from parallel.layers import meta_parameter
from parallel.mappings import copy_to_tensor_parallel_region
from parallel.state import ParallelState


def get_capacity(num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: Optional[int] = None) -> int:
    """ceil(tokens / experts * factor), at least `min_capacity`."""
    capacity = math.ceil((num_tokens / num_experts) * capacity_factor)
    return max(capacity, min_capacity) if min_capacity is not None else capacity


def padded_capacity(num_tokens: int, num_experts: int, topk: int, capacity_factor: float) -> int:
    """Rows each expert receives under --moe-pad-expert-input-to-capacity: its capacity, or every token where that is
    more; a host-known shape, so nothing is read back."""
    return min(get_capacity(num_tokens * topk, num_experts, capacity_factor), num_tokens)


def group_limited_topk(scores: torch.Tensor, topk: int, num_groups: int, group_topk: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose `group_topk` groups per token by the sum of each group's top topk/group_topk scores, then the top-k
    experts inside them."""
    num_tokens, num_experts = scores.shape
    group_scores = scores.view(num_tokens, num_groups, -1).topk(topk // group_topk, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(num_tokens, num_groups, num_experts // num_groups).reshape(num_tokens, -1)
    return torch.topk(scores.masked_fill(~score_mask.bool(), float("-inf")), k=topk, dim=-1)


def topk_routing(logits: torch.Tensor, settings: MoESettings, expert_bias: Optional[torch.Tensor] = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs [tokens, experts], zero off the chosen ones; routing map [tokens, experts] bool)."""
    topk, groups, group_topk = settings.router_topk, settings.router_num_groups, settings.router_group_topk

    def choose(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if group_topk:
            return group_limited_topk(scores, topk, groups, group_topk)
        return torch.topk(scores, k=topk, dim=1)

    if settings.router_score_function == "softmax":
        if settings.router_pre_softmax:
            probs, top = choose(torch.softmax(logits, dim=-1, dtype=torch.float32))
        else:
            scores, top = choose(logits)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
        if expert_bias is not None:
            _, top = choose(scores + expert_bias.float())
            scores = torch.gather(scores, dim=1, index=top)
        else:
            scores, top = choose(scores)
        probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else scores
    if settings.router_topk_scaling_factor:
        probs = probs * settings.router_topk_scaling_factor
    probs = probs.type_as(logits)
    routing_probs = torch.zeros_like(logits).scatter(1, top, probs)
    routing_map = torch.zeros_like(logits, dtype=torch.int32).scatter(1, top, 1).bool()
    return routing_probs, routing_map


# Megatron-Core's expert-parallel RNG stream: seed + 1024 + 100 x EP rank + ETP rank
EXPERT_PARALLEL_SEED_OFFSET = 1024


class RandomLogits(torch.autograd.Function):
    """moe_utils.RandomSTE: standard normal logits in place of the router's, the gradient passed straight through."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, generator: Optional[torch.Generator]) -> torch.Tensor:
        return torch.empty_like(logits).normal_(generator=generator)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        return grad_output, None


def random_logits_generator(device: torch.device, expert_parallel_rank: int, expert_tensor_rank: int
                            ) -> Optional[torch.Generator]:
    """The generator --moe-router-force-load-balancing draws from, offset per (EP rank, ETP rank) as Megatron's stream
    and keyed by a draw from the default stream, so a recomputed router draws the same logits."""
    if device.type == "meta":
        return None
    key = int(torch.randint(0, 2 ** 31 - 1, (1,)))
    offset = EXPERT_PARALLEL_SEED_OFFSET + 100 * expert_parallel_rank + expert_tensor_rank
    generator = torch.Generator(device=device)
    generator.manual_seed(key * 65537 + offset)
    return generator


def sinkhorn(cost: torch.Tensor, tol: float = 0.0001) -> torch.Tensor:
    """Rescale exp(cost) until its columns (experts) are balanced."""
    cost = torch.exp(cost)
    d0 = torch.ones(cost.size(0), device=cost.device, dtype=cost.dtype)
    d1 = torch.ones(cost.size(1), device=cost.device, dtype=cost.dtype)
    eps, error, d1_old = 0.00000001, 1e9, d1
    while error > tol:
        d0 = (1 / d0.size(0)) * 1 / (torch.sum(d1 * cost, 1) + eps)
        d1 = (1 / d1.size(0)) * 1 / (torch.sum(d0.unsqueeze(1) * cost, 0) + eps)
        error = torch.mean(torch.abs(d1_old - d1))
        d1_old = d1
    return d1 * cost * d0.unsqueeze(1)


def sinkhorn_routing(logits: torch.Tensor, topk: int, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """In training, experts chosen on Sinkhorn-balanced logits; weights are sigmoid (top-1) or softmax of the raw
    logits."""
    def activation(values: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(values) if topk == 1 else torch.softmax(values, dim=-1, dtype=torch.float32).type_as(values)
    if training and not logits.is_meta:  # on the meta device no balancing can be computed
        with torch.no_grad():
            _, top = torch.topk(sinkhorn(logits.to(dtype=torch.float32)), k=topk, dim=1)
        logits = activation(logits)
    else:
        logits = activation(logits)
        _, top = torch.topk(logits, k=topk, dim=1)
    routing_map = torch.zeros_like(logits, dtype=torch.int32).scatter(1, top, 1).bool()
    return logits * routing_map, routing_map


def drop_tokens(probs: torch.Tensor, routing_map: torch.Tensor, topk: int, capacity_factor: float,
                drop_policy: str, pad_to_capacity: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each expert keeps at most its capacity of tokens, by highest probability or first position; with
    `pad_to_capacity` exactly `capacity` rows (padding rows carry probability 0)."""
    num_tokens, num_experts = probs.shape
    capacity = get_capacity(num_tokens * topk, num_experts, capacity_factor)
    if capacity > num_tokens:
        capacity_mask = torch.ones_like(routing_map)
    else:
        if drop_policy == "probs":
            _, keep = torch.topk(probs, k=capacity, dim=0, sorted=False)
        else:
            # Megatron takes topk of the 0/1 map, whose ties torch breaks in no promised order; the first `capacity` by
            # position is what the policy names.
            rank = torch.cumsum(routing_map.int(), dim=0) - 1
            order = torch.where(routing_map, rank, num_tokens + torch.arange(num_tokens, device=probs.device).unsqueeze(1))
            keep = torch.topk(order, k=capacity, dim=0, largest=False, sorted=False)[1]
        capacity_mask = torch.zeros_like(routing_map).scatter(0, keep, True)
    final_map = capacity_mask if pad_to_capacity else routing_map & capacity_mask
    return probs * final_map, final_map


class TopKRouter(nn.Module):
    """Gating weights [experts, hidden] (and a bias with --add-bias-linear); forward gives (probs, routing_map) for
    tokens in [sequence, batch] order, with the balancing and z-loss gradients attached."""

    def __init__(self, hidden_size: int, settings: MoESettings, *, init_std: float, bias: bool,
                 state: ParallelState, layer_number: int = 0, tracker: Optional[MoELossTracker] = None):
        super().__init__()
        self.settings, self.state, self.layer_number = settings, state, layer_number
        self.tracker = tracker
        experts = settings.num_experts
        self.weight = meta_parameter((experts, hidden_size), InitMethod.normal(init_std))
        if bias:
            self.bias = meta_parameter((experts,), InitMethod.normal(init_std))
        else:
            self.bias = None
        # Neither parameters nor buffers: made on the first forward's device; the expert bias is fp32 as Megatron keeps
        # it.
        self.expert_bias: Optional[torch.Tensor] = None
        self.local_tokens_per_expert: Optional[torch.Tensor] = None
        self._global_tokens: Optional[torch.Tensor] = None
        self._global_steps = 0
        self._global_iteration: Optional[int] = None

    def gating(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits, in --moe-router-dtype where given."""
        dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.settings.router_dtype, hidden.dtype)
        bias = None if self.bias is None else self._summed_over_slices(self.bias).to(dtype)
        return F.linear(hidden.to(dtype), self._summed_over_slices(self.weight).to(dtype), bias)

    def _summed_over_slices(self, parameter: torch.Tensor) -> torch.Tensor:
        """The parameter, its gradient summed over the TP ranks' sequence slices."""
        state = self.state
        return parameter if state.tensor_parallel_size == 1 else copy_to_tensor_parallel_region(parameter, state)

    def _summed_counts(self, counts: torch.Tensor, over_data_parallel: bool = False) -> torch.Tensor:
        """Token counts summed over the TP x CP slices (and DP: Megatron's tp_dp_cp group): a new tensor."""
        counts = counts.detach().clone()
        state = self.state
        if state.tensor_parallel_size > 1:
            state.comm.all_reduce(counts, state.tensor_parallel_group, "tp")
        if state.context_parallel_size > 1:
            state.comm.all_reduce(counts, state.context_parallel_group, "cp")
        if over_data_parallel and state.data_parallel_size > 1:
            state.comm.all_reduce(counts, state.data_parallel_group, "dp")
        return counts

    def forward(self, hidden: torch.Tensor, seq_length: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        settings = self.settings
        logits = self.gating(hidden)
        if settings.router_force_load_balancing:
            experts = self.state.experts
            logits = RandomLogits.apply(logits, random_logits_generator(logits.device, experts.model_rank,
                                                                        experts.tensor_rank))
        grad = self.training and torch.is_grad_enabled()
        if settings.z_loss_coeff is not None and grad:
            # each TP x CP rank's mean weighted 1/(TP x CP): the shares sum to the sequence's mean
            loss = z_loss(logits, settings.z_loss_coeff / self._slices())
            logits = attach(logits, loss, self.tracker)
            self._record("z_loss", loss / settings.z_loss_coeff)
        if settings.router_load_balancing_type == "sinkhorn":
            probs, routing_map = sinkhorn_routing(logits, settings.router_topk, self.training)
        else:
            if settings.router_enable_expert_bias and self.expert_bias is None:
                self.expert_bias = torch.zeros(settings.num_experts, dtype=torch.float32, device=hidden.device)
                self.local_tokens_per_expert = torch.zeros_like(self.expert_bias)
            probs, routing_map = topk_routing(logits, settings, self.expert_bias)
        if settings.expert_capacity_factor is not None:
            probs, routing_map = drop_tokens(probs, routing_map, settings.router_topk, settings.expert_capacity_factor,
                                             settings.token_drop_policy, settings.pad_expert_input_to_capacity)
        if grad and settings.aux_loss_coeff > 0 and settings.router_load_balancing_type in (
                "aux_loss", "seq_aux_loss", "global_aux_loss"):
            probs = self._attach_aux_loss(probs, logits, seq_length, batch)
        if settings.router_enable_expert_bias and torch.is_grad_enabled():
            with torch.no_grad():
                self.local_tokens_per_expert += routing_map.sum(dim=0)
        return probs, routing_map

    def _attach_aux_loss(self, probs: torch.Tensor, logits: torch.Tensor, seq_length: int, batch: int) -> torch.Tensor:
        settings, kind = self.settings, self.settings.router_load_balancing_type
        coeff, topk = settings.aux_loss_coeff, settings.router_topk
        aux_map, scores = scores_for_aux_loss(logits, topk, settings.router_score_function)
        num_tokens = aux_map.shape[0]
        slices = self._slices()
        if kind == "aux_loss":
            loss = switch_load_balancing_loss(scores, self._summed_counts(aux_map.sum(dim=0)), num_tokens * slices,
                                              topk, coeff)
            name = "load_balancing_loss"
        elif kind == "seq_aux_loss":
            loss = sequence_load_balancing_loss(scores, aux_map, seq_length, batch, topk, coeff,
                                                sum_counts=self._summed_counts, slices=slices)
            name = "seq_load_balancing_loss"
        else:
            loss = switch_load_balancing_loss(scores, self._global_tokens_per_expert(aux_map),
                                              num_tokens * self.state.data_parallel_size * slices, topk, coeff)
            name = "global_load_balancing_loss"
        self._record(name, loss / coeff)
        return attach(probs, loss, self.tracker)

    def _slices(self) -> int:
        return self.state.tensor_parallel_size * self.state.context_parallel_size

    def _global_tokens_per_expert(self, aux_map: torch.Tensor) -> torch.Tensor:
        """This micro-batch's counts summed over TP x DP x CP, averaged with the iteration's so far."""
        tokens = self._summed_counts(aux_map.sum(dim=0).float(), over_data_parallel=True)
        iteration = None if self.tracker is None else self.tracker.iteration
        if self._global_tokens is None or iteration != self._global_iteration:
            self._global_tokens, self._global_steps, self._global_iteration = torch.zeros_like(tokens), 0, iteration
        self._global_tokens += tokens
        self._global_steps += 1
        return self._global_tokens / self._global_steps

    def _record(self, name: str, value: torch.Tensor) -> None:
        if self.tracker is not None:
            self.tracker.record(name, self.layer_number, value)

    @torch.no_grad()
    def update_expert_bias(self) -> None:
        """moe_utils.get_updated_expert_bias, after the iteration's backward."""
        if self.expert_bias is None:
            return
        tokens = self._summed_counts(self.local_tokens_per_expert, over_data_parallel=True)
        offset = tokens.sum(dim=-1, keepdim=True) / tokens.shape[-1] - tokens
        self.expert_bias += torch.sign(offset) * self.settings.router_bias_update_rate
        self.local_tokens_per_expert.zero_()
