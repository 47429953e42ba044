"""DeepSpeed-MoE's gating (TopKGate: top-1, top-2, top-k and capacity) for a Megatron-DeepSpeed launch with
--num-experts: fp32 logits, no bias, DeepSpeed's capacity and token dropping, and its l_aux x --moe-loss-coeff."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from base.errors import ConfigError
from base.options import Const, option
from gpt.moe.balancing import attach

MLP_TYPES = ("standard", "residual")  # Megatron-DeepSpeed's --mlp-type choices


@dataclass(frozen=True)
class DeepSpeedMoESettings:
    """DeepSpeed-MoE's gating section: Megatron-DeepSpeed's flags (--topk, --expert-interval, --mlp-type, ...)."""
    SETTING_PREFIX: ClassVar[str] = ""

    gating: str = option("megatron", choices=("megatron", "deepspeed"),
                         help="megatron: Megatron-Core's router (--moe-router-*); deepspeed: DeepSpeed-MoE's "
                                  "gating (--topk, --moe-train-capacity-factor, ...), which a Megatron-DeepSpeed "
                                  "launch with --num-experts takes")
    topk: int = option(1, setting="topk", help="DeepSpeed-MoE: experts per token (1, 2, or more)")
    train_capacity_factor: float = option(1.0, help="DeepSpeed-MoE: the capacity factor in training")
    eval_capacity_factor: float = option(1.0, help="DeepSpeed-MoE: the capacity factor in evaluation")
    min_capacity: int = option(4, help="DeepSpeed-MoE: each expert's capacity at least this")
    token_dropping: bool = option(
        True, consts=[Const(("--disable-moe-token-dropping",), False,
                            help="Megatron-DeepSpeed: DeepSpeed-MoE keeps every token")],
        help="DeepSpeed-MoE: drop the tokens beyond each expert's capacity")
    loss_coeff: float = option(0.1, help="DeepSpeed-MoE: l_aux's coefficient (its gradient; logged as moe_loss)")
    top2_2nd_expert_sampling: bool = option(
        True, consts=[Const(("--disable-moe-top2-2nd-expert-sampling",), False,
                            help="Megatron-DeepSpeed: top-2's second expert by argmax, not sampled")],
        help="DeepSpeed-MoE top-2: sample the second expert (Gumbel noise on the logits)")
    expert_interval: int = option(2, setting="expert_interval",
                                  help="DeepSpeed-MoE: an MoE layer at every expert-interval-th layer (1-based)")
    # PR-MoE: a dense MLP beside the experts, mixed per token by softmax of a Linear(hidden, 2)
    mlp_type: str = option("standard", setting="mlp_type",
                           help="DeepSpeed-MoE: standard, or residual (PR-MoE: a dense MLP beside the experts, mixed "
                                "per token by a learned coefficient)")

    @property
    def use_residual(self) -> bool:
        return self.mlp_type == "residual"

    def validate(self) -> None:
        """Megatron-DeepSpeed's choices, before any layer's experts are counted."""
        if self.mlp_type not in MLP_TYPES:
            raise ConfigError(f"--mlp-type {self.mlp_type} is not one of {', '.join(MLP_TYPES)} (Megatron-DeepSpeed's "
                              f"choices)", flags=("--mlp-type",))
        if self.expert_interval < 1:
            raise ConfigError(f"--expert-interval must be at least 1, got {self.expert_interval}",
                              flags=("--expert-interval",))

    def validate_layer(self, num_experts: int) -> None:
        """TopKGate's bounds at one layer's `num_experts`."""
        if self.gating != "deepspeed":
            return
        if not 1 <= self.topk <= num_experts:
            raise ConfigError(f"--topk {self.topk} must be between 1 and --num-experts {num_experts}",
                              flags=("--topk", "--num-experts"))
        if self.min_capacity < 0 or self.train_capacity_factor <= 0 or self.eval_capacity_factor <= 0 \
                or self.loss_coeff < 0:
            raise ConfigError("--moe-train-capacity-factor and --moe-eval-capacity-factor must be positive, "
                              "--moe-min-capacity and --moe-loss-coeff not negative",
                              flags=("--moe-train-capacity-factor", "--moe-min-capacity"))


def deepspeed_capacity(num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: int) -> int:
    """ceil(T / E x factor), at least min_capacity (the caller passes factor x k)."""
    return max(math.ceil((num_tokens / num_experts) * capacity_factor), min_capacity)


def top1gating(logits: torch.Tensor, capacity_factor: float, min_capacity: int, drop_tokens: bool,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    indices = torch.argmax(gates, dim=1)
    mask = F.one_hot(indices, num_classes=num_experts)
    l_aux = torch.sum(gates.mean(dim=0) * mask.float().mean(dim=0)) * num_experts
    if drop_tokens:
        capacity = deepspeed_capacity(num_tokens, num_experts, capacity_factor, min_capacity)
    else:
        capacity = int(mask.sum(dim=0).max())
    capacity = min(capacity, num_tokens)
    # Random Token Selection: each expert keeps `capacity` of its tokens in random order
    uniform = torch.rand(mask.shape, generator=generator, device=logits.device)
    keep = torch.zeros_like(mask).scatter_(0, torch.topk(mask * uniform, k=capacity, dim=0)[1], 1)
    kept = (mask * keep).sum(dim=1).bool()
    probs = (gates * mask).sum(dim=1, keepdim=True) * kept.unsqueeze(1)
    return probs, torch.where(kept, indices, -1).unsqueeze(1), l_aux


def top2gating(logits: torch.Tensor, capacity_factor: float, min_capacity: int, drop_tokens: bool,
               second_expert_sampling: bool, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    indices1 = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(indices1, num_classes=num_experts)
    if second_expert_sampling:  # the Gumbel-max trick: a sample of the softmax
        uniform = torch.rand(logits.shape, generator=generator, device=logits.device)
        logits = logits - torch.log(-torch.log(uniform.clamp(min=1e-20)).clamp(min=1e-20))
    indices2 = torch.argmax(logits.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(indices2, num_classes=num_experts)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations2 = torch.cumsum(mask2, dim=0) - 1 + mask1.sum(dim=0, keepdim=True)
    l_aux = torch.mean(gates.mean(dim=0) * mask1.float().mean(dim=0)) * num_experts * num_experts
    if drop_tokens:
        capacity = deepspeed_capacity(num_tokens, num_experts, capacity_factor * 2, min_capacity)
        mask1 = mask1 * torch.lt(locations1, capacity)
        mask2 = mask2 * torch.lt(locations2, capacity)
    gates1 = (gates * mask1).sum(dim=1)
    gates2 = (gates * mask2).sum(dim=1)
    denominator = torch.clamp(gates1 + gates2, min=torch.finfo(gates.dtype).eps)
    kept1, kept2 = mask1.sum(dim=1).bool(), mask2.sum(dim=1).bool()
    probs = torch.stack([gates1 / denominator, gates2 / denominator], dim=1)
    indices = torch.stack([torch.where(kept1, indices1, -1), torch.where(kept2, indices2, -1)], dim=1)
    return probs, indices, l_aux


def topkgating(logits: torch.Tensor, k: int, capacity_factor: float, min_capacity: int, drop_tokens: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    top_logits, top_indices = torch.topk(logits, k=k, dim=1)
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_indices, True)
    l_aux = torch.mean(gates.mean(dim=0) * mask.float().mean(dim=0)) * num_experts * num_experts / k
    if drop_tokens:
        capacity = min(deepspeed_capacity(num_tokens, num_experts, capacity_factor * k, min_capacity), num_tokens)
        masked_logits = torch.zeros_like(logits).scatter(1, top_indices, top_logits)
        keep = torch.topk(masked_logits, k=capacity, dim=0, sorted=False)[1]
        mask = mask & torch.zeros_like(logits).scatter(0, keep, 1).bool()
    gates_masked = gates * mask
    gates_masked = gates_masked / torch.clamp(gates_masked.sum(dim=-1, keepdim=True), min=torch.finfo(gates.dtype).eps)
    kept = torch.gather(mask, 1, top_indices)
    probs = torch.gather(gates_masked, 1, top_indices)
    return probs, torch.where(kept, top_indices, -1), l_aux


def deepspeed_gate(router, tokens: torch.Tensor, training: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSpeed-MoE's TopKGate over `router`'s weight: fp32 logits, its gating for k, l_aux x --moe-loss-coeff attached
    and logged as moe_loss."""
    settings, gating = router.settings, router.settings.deepspeed
    logits = F.linear(tokens.float(), router.weight.float())
    factor = gating.train_capacity_factor if training else gating.eval_capacity_factor
    k = settings.router_topk
    if k == 1:
        probs, indices, l_aux = top1gating(logits, factor, gating.min_capacity, gating.token_dropping)
    elif k == 2:
        probs, indices, l_aux = top2gating(logits, factor, gating.min_capacity, gating.token_dropping,
                                           gating.top2_2nd_expert_sampling)
    else:
        probs, indices, l_aux = topkgating(logits, k, factor, gating.min_capacity, gating.token_dropping)
    if training and torch.is_grad_enabled():
        moe_loss = l_aux * gating.loss_coeff
        probs = attach(probs, moe_loss, router.tracker)
        if router.tracker is not None:
            router.tracker.record("moe_loss", router.layer_number, moe_loss)
    return probs, indices
