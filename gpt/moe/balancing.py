"""The balancing losses of Megatron-Core's router (megatron/core/transformer/moe/moe_utils.py and router.py)
and how their gradient enters backward.

- aux_loss (Switch Transformer / GShard; moe_utils.switch_load_balancing_loss_func):
  E * coeff / (k * T^2) * sum_e P_e * N_e, with P_e the sum over tokens of the expert's score (softmax of all
  logits, or the normalised sigmoid) and N_e the tokens routed to it by a plain top-k of those scores.
- seq_aux_loss (DeepSeek-V2; TopKRouter._apply_seq_aux_loss): the same per sequence, averaged over the batch.
- global_aux_loss (TopKRouter._apply_global_aux_loss): N_e summed over the data-parallel group and averaged over
  the micro-batches of the iteration so far; P_e local, T the global-batch-micro-batch tokens.
- z_loss (ST-MoE; moe_utils.z_loss_func): coeff * mean(logsumexp(logits)^2).

None of them is added to the language-model loss. As Megatron-Core's MoEAuxLossAutoScaler does, the loss is
attached to an activation (the routing probabilities, or the logits for the z-loss) by an autograd function
that passes the activation through unchanged and, in backward, gives the loss the gradient
`backward_scale` - the main loss's own scale: the fp16 loss scale over the micro-batches of the iteration
(megatron/core/pipeline_parallel/schedules.py forward_step: `MoEAuxLossAutoScaler.set_loss_scale(loss_scale /
num_microbatches)`). The scale lives in the model's `MoELossTracker`, not in a class attribute, so two models
in one process do not share it.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import torch

# Megatron-Core's names for the losses it logs (router.py: attach_and_log_load_balancing_loss, apply_z_loss)
MOE_LOSS_NAMES = ("load_balancing_loss", "seq_load_balancing_loss", "global_load_balancing_loss", "z_loss",
                  "moe_loss")  # the last: DeepSpeed-MoE's l_aux x --moe-loss-coeff, summed over the layers
# logged as their sum over the MoE layers (Megatron-DeepSpeed's `moe_loss = sum(moe_losses) * args.moe_loss_coeff`);
# the others as their mean (Megatron-Core's MoEMetricsTracker)
SUMMED_OVER_LAYERS = ("moe_loss",)


def switch_load_balancing_loss(scores: torch.Tensor, tokens_per_expert: torch.Tensor, total_tokens: float,
                               topk: int, coeff: float) -> torch.Tensor:
    """moe_utils.switch_load_balancing_loss_func: `sum(scores.sum(0) * tokens_per_expert) * E * coeff /
    (topk * T * T)`; `scores` [tokens, experts], `tokens_per_expert` [experts]."""
    num_experts = scores.shape[-1]
    return torch.sum(scores.sum(dim=0) * tokens_per_expert) * (num_experts * coeff / (topk * total_tokens * total_tokens))


def sequence_load_balancing_loss(scores: torch.Tensor, routing_map: torch.Tensor, seq_length: int, batch: int,
                                 topk: int, coeff: float, sum_counts=None, slices: int = 1) -> torch.Tensor:
    """TopKRouter._apply_seq_aux_loss: tokens in Megatron's [sequence, batch] order; the batch is folded into the
    expert dimension, so the switch loss of the reshaped tensors is the sum of each sequence's loss, then
    divided by the batch size. Under sequence or context parallelism `seq_length` is this rank's part of the
    sequence, one of `slices` (TP x CP), and `sum_counts` sums the per-sequence counts over them (the loss is then
    this part's share)."""
    scores = scores.reshape(seq_length, -1)
    tokens_per_expert = routing_map.reshape(seq_length, -1).sum(dim=0)
    if sum_counts is not None:
        tokens_per_expert = sum_counts(tokens_per_expert)
    num_experts = routing_map.shape[-1]
    total = seq_length * slices
    per_sequence = torch.sum(scores.sum(dim=0) * tokens_per_expert) * (num_experts * coeff / (topk * total * total))
    return per_sequence / batch


def z_loss(logits: torch.Tensor, coeff: float) -> torch.Tensor:
    """moe_utils.z_loss_func: coeff * mean over tokens of logsumexp(logits)^2."""
    return torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * coeff


def scores_for_aux_loss(logits: torch.Tensor, topk: int, score_function: str) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_utils.compute_routing_scores_for_aux_loss: (routing map of a plain top-k, scores) where the scores
    are the softmax of all logits, or the sigmoid normalised over experts."""
    if score_function == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    _, top = torch.topk(scores, k=topk, dim=1)
    routing_map = torch.zeros_like(logits, dtype=torch.int32).scatter(1, top, 1).bool()
    return routing_map, scores


class MoELossTracker:
    """The model's MoE bookkeeping for one iteration: the backward scale of the attached losses, the values to
    log (each loss / its coefficient, per layer, summed over micro-batches, as Megatron's MoEMetricsTracker
    records them), and the global aux loss's running token counts (reset each iteration, as
    TopKRouter.reset_global_aux_loss_tracker)."""

    def __init__(self) -> None:
        self.backward_scale = 1.0
        self.per_token = False  # --calculate-per-token-loss (attach)
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
        """A micro-batch's tokens per expert of `layer` (its forward that builds the graph: not a recompute's
        no-grad first pass, nor evaluation)."""
        counts = tokens_per_expert.detach()
        self.tokens_per_expert[layer] = counts if layer not in self.tokens_per_expert else \
            self.tokens_per_expert[layer] + counts

    def record(self, name: str, layer: int, value: torch.Tensor) -> None:
        self._pending.append((name, layer, value.detach()))

    def sums(self) -> dict[str, dict[int, float]]:
        """Per name, per layer, the sum over this iteration's micro-batches (one device sync)."""
        if self._pending:
            numbers = torch.stack([value.float() for _, _, value in self._pending]).tolist()
            for (name, layer, _), number in zip(self._pending, numbers):
                self.values[name][layer] = self.values[name].get(layer, 0.0) + number
            self._pending = []
        return self.values


class AuxLossAutoScaler(torch.autograd.Function):
    """Megatron-Core's MoEAuxLossAutoScaler (and its MTPLossAutoScaler, the same function: gpt/mtp.py uses this one):
    forward returns `output`; backward returns the output's gradient unchanged and `tracker.backward_scale` as the
    gradient of `aux_loss` (any tracker with a `backward_scale`)."""

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
    """`output`, carrying `aux_loss`'s gradient into backward (see AuxLossAutoScaler). Under
    --calculate-per-token-loss the loss is multiplied by the tokens `output` holds (its rows: the tokens this router
    saw), as Megatron-Core's router does, since the gradients are then scaled by 1 / the iteration's token count."""
    if tracker is None:
        tracker = MoELossTracker()
    if tracker.per_token:
        aux_loss = aux_loss * output.shape[0]
    return AuxLossAutoScaler.apply(output, aux_loss, tracker)
