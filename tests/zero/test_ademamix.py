"""--optimizer ademamix: swiss-ai's AdEMAMix (issue 54).

swiss-ai/Megatron-LM (main, 81d44dbe):
- megatron/core/optimizer/ademamix.py `AdEMAMix.step`: m1 (exp_avg_fast) and nu (exp_avg_sq) as Adam's, m2
  (exp_avg_slow) = beta3 m2 + (1 - beta3) g with no bias correction, update
  (m1 / bc1 + alpha m2) / (sqrt(nu) / sqrt(bc2) + eps) + wd p, p -= lr update; alpha from
  `linear_warmup_scheduler` (0 -> alpha), beta3 from `linear_hl_warmup_scheduler` (beta1 -> beta3 by half-life);
- megatron/core/optimizer/__init__.py `_get_megatron_optimizer_based_on_param_groups`: betas (adam_beta1,
  adam_beta2, ademamix_beta3), alpha ademamix_alpha, the warmups, eps adam_eps, the groups' weight decay;
- megatron/core/optimizer/distrib_optimizer.py: the distributed optimizer shards exp_avg_slow (and exp_avg_fast,
  exp_avg_sq) like Adam's moments.
"""

from __future__ import annotations

import math

import pytest
import torch

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from tests.zero.grid_runs import four_steps_on_every_grid
from tests.zero.test_zero_distributed import SEQ, VOCAB, tiny_gpt2
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig


def fork_linear_warmup_scheduler(step, alpha_end, alpha_start=0, warmup=1):
    """swiss-ai/Megatron-LM megatron/core/optimizer/ademamix.py linear_warmup_scheduler, as written there."""
    if step < warmup:
        a = step / float(warmup)
        return (1.0 - a) * alpha_start + a * alpha_end
    return alpha_end


def fork_linear_hl_warmup_scheduler(step, beta_end, beta_start=0, warmup=1):
    """swiss-ai/Megatron-LM megatron/core/optimizer/ademamix.py linear_hl_warmup_scheduler, as written there."""
    def f(beta, eps=1e-8):
        return math.log(0.5) / math.log(beta + eps) - 1

    def f_inv(t):
        return math.pow(0.5, 1 / (t + 1))

    if step < warmup:
        a = step / float(warmup)
        return f_inv((1.0 - a) * f(beta_start) + a * f(beta_end))
    return beta_end


def fork_step(p, grad, state, step, lr, lmbda, eps, beta1, beta2, beta3_final, alpha_final, beta3_warmup,
              alpha_warmup):
    """The body of the fork's AdEMAMix.step for one parameter, its expressions copied (state: the three EMAs)."""
    bias_correction1 = 1.0 - (beta1 ** step)
    bias_correction2 = 1.0 - (beta2 ** step)
    if alpha_warmup is not None:
        alpha = fork_linear_warmup_scheduler(step, alpha_end=alpha_final, alpha_start=0, warmup=alpha_warmup)
    else:
        alpha = alpha_final
    if beta3_warmup is not None:
        beta3 = fork_linear_hl_warmup_scheduler(step, beta_end=beta3_final, beta_start=beta1, warmup=beta3_warmup)
    else:
        beta3 = beta3_final
    exp_avg_fast, exp_avg_slow, exp_avg_sq = state["exp_avg_fast"], state["exp_avg_slow"], state["exp_avg_sq"]
    if beta1 != 0.0:
        exp_avg_fast.mul_(beta1).add_(grad, alpha=1 - beta1)
    else:
        exp_avg_fast = grad
    exp_avg_slow.mul_(beta3).add_(grad, alpha=1 - beta3)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    update = (exp_avg_fast.div(bias_correction1) + alpha * exp_avg_slow) / denom
    update.add_(p, alpha=lmbda)
    p.add_(update, alpha=-lr)


def ours_over_steps(values, grads, lr, wd, betas, alpha, beta3_warmup, alpha_warmup, window=None):
    """zero.ademamix.AdEMAMix stepping a copy of `values` with each of `grads` in turn."""
    import zero.ademamix as ademamix

    param = torch.nn.Parameter(values.clone())
    optimizer = ademamix.AdEMAMix([param], lr=lr, betas=betas, alpha=alpha, beta3_warmup=beta3_warmup,
                                  alpha_warmup=alpha_warmup, eps=1e-8, weight_decay=wd)
    optimizer.state[param] = {"step": torch.zeros(()), **{key: torch.zeros_like(values)
                                                          for key in ademamix.AdEMAMix.STATE_KEYS}}
    saved = ademamix.WINDOW
    try:
        ademamix.WINDOW = window or saved
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
    finally:
        ademamix.WINDOW = saved
    return param.detach(), optimizer.state[param]


@pytest.mark.parametrize("beta1", [0.9, 0.0])
def test_our_ademamix_step_is_the_forks_formula_bit_for_bit_over_warmups_and_after(beta1):
    """Seven steps of a 1000-element tensor, alpha warming up over 3 steps and beta3 over 5 (then both at their
    final values), weight decay 0.1: ours equals the fork's step written out above, bit for bit, also when
    stepped in 64-element windows (the bound on its temporaries); with beta1 = 0 the gradient stands in for m1."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(1000, generator=generator)
    grads = [torch.randn(1000, generator=generator) for _ in range(7)]
    betas, lr, wd = (beta1, 0.95, 0.999), 3e-3, 0.1
    reference = values.clone()
    state = {key: torch.zeros(1000) for key in ("exp_avg_fast", "exp_avg_slow", "exp_avg_sq")}
    for step, grad in enumerate(grads, 1):
        fork_step(reference, grad, state, step, lr, wd, 1e-8, *betas, 8.0, 5, 3)
    for window in (None, 64):
        ours, our_state = ours_over_steps(values, grads, lr, wd, betas, 8.0, 5, 3, window)
        assert torch.equal(ours, reference), window
        assert torch.equal(our_state["exp_avg_slow"], state["exp_avg_slow"])
        assert torch.equal(our_state["exp_avg_sq"], state["exp_avg_sq"])
        assert int(our_state["step"]) == 7
    assert not torch.equal(reference, values)


def test_the_forks_default_warmups_of_minus_one_are_no_warmup():
    """The fork's --ademamix-alpha-warmup / --ademamix-beta3-warmup default to -1 (megatron/training/arguments.py),
    passed to AdEMAMix as is: `step < -1` never holds, so alpha and beta3 are their final values from step 1
    (and the same as the fork's `None`)."""
    generator = torch.Generator().manual_seed(1)
    values = torch.randn(256, generator=generator)
    grads = [torch.randn(256, generator=generator) for _ in range(3)]
    reference = values.clone()
    state = {key: torch.zeros(256) for key in ("exp_avg_fast", "exp_avg_slow", "exp_avg_sq")}
    for step, grad in enumerate(grads, 1):
        fork_step(reference, grad, state, step, 1e-3, 0.0, 1e-8, 0.9, 0.95, 0.999, 5.0, None, None)
    ours, _ = ours_over_steps(values, grads, 1e-3, 0.0, (0.9, 0.95, 0.999), 5.0, -1, -1)
    assert torch.equal(ours, reference)


GRIDS = ((0, False), (1, False), (2, False), (3, False), (2, True), (3, True))  # (stage, offload_optimizer)
ADEMAMIX = dict(optimizer="ademamix", lr=3e-3, weight_decay=0.1, ademamix_alpha=5.0, ademamix_beta3=0.999,
                ademamix_alpha_warmup=2, ademamix_beta3_warmup=3)


def train_every_grid(rank, world_size):
    """Per (stage, offload): the losses of four AdEMAMix steps of a tiny GPT-2 on two data-parallel ranks, and
    the slow momentum's norm over this rank's partition."""
    def summarize(model, zero, losses):
        shard = zero.sharded.sharded_state_dict(model)
        return (losses, sorted(shard.tensors), shard.optimizer, zero.sharded.exp_avg_slow.norm().item(),
                zero.sharded.adam_step)
    return four_steps_on_every_grid(rank, world_size, ADEMAMIX, GRIDS, summarize)


def test_ademamix_under_zero_1_2_3_and_offload_trains_as_zero_0_on_two_ranks():
    """ZeRO 1-3 partition the three states as they partition Adam's two, and the offloaded host step runs the
    same AdEMAMix per sub-group: on two data-parallel ranks every grid's losses equal ZeRO 0's."""
    for outcomes in run_distributed(train_every_grid, 2, timeout=300):
        reference, keys, name, slow_norm, steps = outcomes[(0, False)]
        assert keys == ["exp_avg", "exp_avg_slow", "exp_avg_sq", "master"] and name == "ademamix"
        assert slow_norm > 0 and steps == 4
        assert reference[-1] < reference[0]
        for grid, (losses, grid_keys, _, slow, grid_steps) in outcomes.items():
            assert grid_keys == keys and grid_steps == 4 and slow > 0, grid
            assert losses == pytest.approx(reference, rel=1e-6, abs=0), grid


def test_ademamix_is_not_adamw():
    """The same run with --optimizer adam takes other steps (AdEMAMix is not Adam under another name)."""
    def losses(optimizer):
        model = tiny_gpt2()
        state = initialize("cpu", 1)
        try:
            config = OptimizerConfig.of(**{**ADEMAMIX, "optimizer": optimizer})
            zero = ZeroHarness(model, config, ZeroConfig(stage=0), state)
            tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
            out = []
            for _ in range(3):
                zero.zero_grad()
                loss = model(input_ids=tokens, labels=tokens).loss
                out.append(loss.item())
                zero.backward(loss)
                zero.step()
            return out, sorted(zero.sharded.sharded_state_dict(model).tensors)
        finally:
            destroy(state)

    ademamix, ademamix_keys = losses("ademamix")
    adam, adam_keys = losses("adam")
    assert ademamix[0] == adam[0] and ademamix[1:] != adam[1:]
    assert adam_keys == ["exp_avg", "exp_avg_sq", "master"]
    assert ademamix_keys == ["exp_avg", "exp_avg_slow", "exp_avg_sq", "master"]
