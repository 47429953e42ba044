"""DeepSpeed-MoE's gating, as Megatron-DeepSpeed's --num-experts builds it (deepspeed/moe/sharded_moe.py, TopKGate:
top1gating, top2gating, topkgating, _capacity), for a Megatron-DeepSpeed launch (issue 51 item 3).

Where it differs from Megatron-Core's router (gpt/moe/router.py):
- the logits are fp32 (`wg` applied to `input.float()`), the weight has no bias;
- capacity = ceil(T / E x factor x k) but at least --moe-min-capacity, with --moe-train-capacity-factor in
  training and --moe-eval-capacity-factor in evaluation; --disable-moe-token-dropping keeps every token;
- top-1 keeps, per expert, `capacity` of its tokens chosen at random (Random Token Selection), its weight the
  softmax probability, not renormalized; l_aux = E x sum_e mean_t(probs) x mean_t(chosen);
- top-2 chooses its second expert by argmax of the logits plus Gumbel noise (unless
  --disable-moe-top2-2nd-expert-sampling), keeps tokens by position with every first choice before any second
  (its locations), renormalizes the two kept weights; l_aux = E^2 x mean_e(mean_t(probs) x mean_t(first choice));
- top-k (k > 2) chooses by the logits, keeps per expert the `capacity` highest logits ("probs" policy),
  renormalizes the kept weights; l_aux = E^2 / k x mean_e(mean_t(probs) x mean_t(chosen)).
l_aux x --moe-loss-coeff is added to the loss (Megatron-DeepSpeed's pretrain_gpt.py loss_func: `loss = loss +
moe_loss`), here through its gradient as every MoE loss (gpt/moe/balancing.py), and logged as moe_loss.

The gate returns each token's k choices as the dispatcher takes them: probabilities [T, k], expert indices
[T, k], a dropped choice index -1 (gpt/moe/dispatcher.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def deepspeed_capacity(num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: int) -> int:
    """sharded_moe._capacity: ceil(T / E x factor), at least min_capacity (the caller passes factor x k)."""
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
    # Random Token Selection: each expert keeps `capacity` of its tokens in a random order
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
