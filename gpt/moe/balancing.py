"""The balancing losses of Megatron-Core's router (aux_loss, seq_aux_loss, global_aux_loss, z-loss) and how their
gradient enters backward: attached to the layer's output by an autograd function, scaled as the main loss."""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch

# Megatron-Core's names for the logged losses
MOE_LOSS_NAMES = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss",
                  "moe_loss")  # DeepSpeed-MoE's l_aux x --moe-loss-coeff, summed over layers
# logged as the sum over MoE layers (Megatron-DeepSpeed); the others as their mean (Megatron-Core)
SUMMED_OVER_LAYERS = ("moe_loss",)


def switch_load_balancing_loss(scores: torch.Tensor, tokens_per_expert: torch.Tensor, total_tokens: float,
                               topk: int, coeff: float) -> torch.Tensor:
    """`sum(scores.sum(0) * tokens_per_expert) * E * coeff / (topk * T * T)`; `scores` [tokens, experts]."""
    num_experts = scores.shape[-1]
    return torch.sum(scores.sum(dim=0) * tokens_per_expert) * (num_experts * coeff / (topk * total_tokens * total_tokens))


def sequence_load_balancing_loss(scores: torch.Tensor, routing_map: torch.Tensor, seq_length: int, batch: int,
                                 topk: int, coeff: float, sum_counts=None, slices: int = 1) -> torch.Tensor:
    """Tokens in [sequence, batch] order; the batch is folded into the expert dimension so the switch loss is the sum of
    each sequence's, then divided by the batch size. Under SP or CP `sum_counts` sums the counts over the `slices`."""
    scores = scores.reshape(seq_length, -1)
    tokens_per_expert = routing_map.reshape(seq_length, -1).sum(dim=0)
    if sum_counts is not None:
        tokens_per_expert = sum_counts(tokens_per_expert)
    num_experts = routing_map.shape[-1]
    total = seq_length * slices
    per_sequence = torch.sum(scores.sum(dim=0) * tokens_per_expert) * (num_experts * coeff / (topk * total * total))
    return per_sequence / batch


def z_loss(logits: torch.Tensor, coeff: float) -> torch.Tensor:
    """coeff * mean over tokens of logsumexp(logits)^2."""
    return torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * coeff


def scores_for_aux_loss(logits: torch.Tensor, topk: int, score_function: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(routing map of a plain top-k, scores): softmax of all logits, or sigmoid normalized over experts."""
    if score_function == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    _, top = torch.topk(scores, k=topk, dim=1)
    routing_map = torch.zeros_like(logits, dtype=torch.int32).scatter(1, top, 1).bool()
    return routing_map, scores


class MoELossTracker:
    """One iteration's MoE bookkeeping: the losses' backward scale, logged values per layer (each loss / its
    coefficient), and the global aux loss's token counts."""

    def __init__(self) -> None:
        self.backward_scale = 1.0
        self.per_token = False
        self.iteration = 0
        self.values: dict[str, dict[int, float]] = defaultdict(dict)
        self._pending: list[tuple[str, int, torch.Tensor]] = []
        self.tokens_per_expert: dict[int, torch.Tensor] = {}  # layer -> the iteration's tokens per expert

    def begin_iteration(self, backward_scale, per_token: bool = False) -> None:
        self.backward_scale = backward_scale
        self.per_token = per_token
        self.iteration += 1
        self.values = defaultdict(dict)
        self._pending = []
        self.tokens_per_expert = {}

    def count_tokens(self, layer: int, tokens_per_expert: torch.Tensor) -> None:
        """A micro-batch's tokens per expert of `layer`, from a graph-building forward only."""
        counts = tokens_per_expert.detach()
        self.tokens_per_expert[layer] = counts if layer not in self.tokens_per_expert else \
            self.tokens_per_expert[layer] + counts

    def record(self, name: str, layer: int, value: torch.Tensor) -> None:
        self._pending.append((name, layer, value.detach()))

    def sums(self) -> dict[str, dict[int, float]]:
        """Per name and layer, the sum over this iteration's micro-batches (one device sync)."""
        if self._pending:
            numbers = torch.stack([value.float() for _, _, value in self._pending]).tolist()
            for (name, layer, _), number in zip(self._pending, numbers):
                self.values[name][layer] = self.values[name].get(layer, 0.0) + number
            self._pending = []
        return self.values


class AuxLossAutoScaler(torch.autograd.Function):
    """Megatron-Core's MoEAuxLossAutoScaler: forward returns `output`; backward passes its gradient and gives `aux_loss`
    the gradient `tracker.backward_scale`."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, aux_loss: torch.Tensor, tracker) -> torch.Tensor:
        ctx.save_for_backward(aux_loss)
        ctx.tracker = tracker
        return output

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (aux_loss,) = ctx.saved_tensors
        return grad_output, torch.ones_like(aux_loss) * ctx.tracker.backward_scale, None


def attach(output: torch.Tensor, aux_loss: torch.Tensor, tracker: Optional[MoELossTracker]) -> torch.Tensor:
    """`output` carrying `aux_loss`'s gradient; under --calculate-per-token-loss the loss is multiplied by the tokens
    `output` holds, as Megatron-Core."""
    if tracker is None:
        tracker = MoELossTracker()
    if tracker.per_token:
        aux_loss = aux_loss * output.shape[0]
    return AuxLossAutoScaler.apply(output, aux_loss, tracker)
