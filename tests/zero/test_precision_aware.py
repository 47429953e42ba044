"""--use-precision-aware-optimizer with --exp-avg-dtype bf16 / --exp-avg-sq-dtype bf16: Adam's moments stored as bf16
between updates computed in fp32 (issue 54 item 3).

Megatron-LM: megatron/core/optimizer/optimizer_config.py (exp_avg_dtype, exp_avg_sq_dtype), megatron/core/optimizer/
__init__.py (`_get_megatron_optimizer_based_on_param_groups` hands them to TransformerEngine's FusedAdam,
transformer_engine/pytorch/optimizers/fused_adam.py, whose kernel reads a bf16 moment, updates it in fp32 with the
apex/TE AdamW arithmetic and stores it back as bf16). The formula below is that arithmetic written out.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed import run_distributed
from tests.zero.grid_runs import four_steps_on_every_grid


def formula_step(p, grad, m, v, step, lr, beta1, beta2, eps, wd):
    """One AdamW step with the moments `m`, `v` held in their own dtype: upcast to fp32, TE's update in fp32
    ((m / bc1) / (sqrt(v / bc2) + eps) + wd p), the moments written back with .to(their dtype) (round to nearest
    even). The operations are torch's elementwise ones, in the order the update
    reads (each one rounded to fp32 as the kernel's are). Returns the new moments."""
    m32 = m.to(torch.float32).mul(beta1).add(grad, alpha=1 - beta1)
    v32 = v.to(torch.float32).mul(beta2).addcmul(grad, grad, value=1 - beta2)
    denom = v32.div(1.0 - beta2 ** step).sqrt().add(eps)
    update = m32.div(1.0 - beta1 ** step).div(denom).add(p, alpha=wd)
    p.add_(update, alpha=-lr)
    return m32.to(m.dtype), v32.to(v.dtype)


def ours_over_steps(values, grads, dtypes, window=None):
    import zero.precision_aware as precision_aware

    param = torch.nn.Parameter(values.clone())
    optimizer = precision_aware.PrecisionAwareAdamW([param], lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    optimizer.state[param] = {"step": torch.zeros(()), "exp_avg": torch.zeros_like(values, dtype=dtypes[0]),
                              "exp_avg_sq": torch.zeros_like(values, dtype=dtypes[1])}
    saved = precision_aware.WINDOW
    try:
        precision_aware.WINDOW = window or saved
        for grad in grads:
            param.grad = grad.clone()
            optimizer.step()
    finally:
        precision_aware.WINDOW = saved
    return param.detach(), optimizer.state[param]


@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32),
                                    (torch.float32, torch.bfloat16)])
def test_bf16_moments_step_is_fp32_compute_with_bf16_storage(dtypes):
    """Six steps of a 1000-element fp32 master: ours equals the formula (fp32 compute, each moment stored in its
    dtype between steps) to the bit, also stepped in 64-element windows; the bf16 moments really are bf16, and the
    weights differ from an all-fp32 Adam's (the rounding is there)."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(1000, generator=generator)
    grads = [torch.randn(1000, generator=generator) for _ in range(6)]
    reference = values.clone()
    m, v = torch.zeros(1000, dtype=dtypes[0]), torch.zeros(1000, dtype=dtypes[1])
    fp32_reference, m32, v32 = values.clone(), torch.zeros(1000), torch.zeros(1000)
    for step, grad in enumerate(grads, 1):
        m, v = formula_step(reference, grad, m, v, step, 3e-3, 0.9, 0.95, 1e-8, 0.1)
        m32, v32 = formula_step(fp32_reference, grad, m32, v32, step, 3e-3, 0.9, 0.95, 1e-8, 0.1)
    for window in (None, 64):
        ours, state = ours_over_steps(values, grads, dtypes, window)
        assert torch.equal(ours, reference), window
        assert state["exp_avg"].dtype == dtypes[0] and state["exp_avg_sq"].dtype == dtypes[1]
        assert torch.equal(state["exp_avg"], m) and torch.equal(state["exp_avg_sq"], v)
        assert int(state["step"]) == 6
    assert not torch.equal(reference, fp32_reference)


BF16_MOMENTS = dict(lr=3e-3, weight_decay=0.1, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
GRIDS = ((0, False), (1, False), (3, False), (2, True), (3, True))  # (stage, offload_optimizer)


def train_every_grid(rank, world_size):
    """Per (stage, offload): the losses of four steps of a tiny GPT-2 on two data-parallel ranks with bf16 moments,
    the moments' dtypes and the first moment's norm over this rank's partition."""
    def summarize(model, zero, losses):
        moments = zero.sharded.moments()
        return (losses, {key: str(t.dtype) for key, t in moments.items()}, moments["exp_avg"].float().norm().item(),
                zero.sharded.adam_step)
    return four_steps_on_every_grid(rank, world_size, BF16_MOMENTS, GRIDS, summarize)


def test_bf16_moments_under_zero_1_2_3_and_offload_train_as_zero_0_on_two_ranks():
    """ZeRO 1-3 partition the bf16 moments as they partition fp32 ones, and the offloaded host step runs the same
    update per sub-group: on two data-parallel ranks every grid's losses equal ZeRO 0's with the same settings."""
    for outcomes in run_distributed(train_every_grid, 2, timeout=300):
        reference, dtypes, norm, steps = outcomes[(0, False)]
        assert dtypes == {"exp_avg": "torch.bfloat16", "exp_avg_sq": "torch.bfloat16"}
        assert norm > 0 and steps == 4 and reference[-1] < reference[0]
        for grid, (losses, grid_dtypes, grid_norm, grid_steps) in outcomes.items():
            assert grid_dtypes == dtypes and grid_steps == 4 and grid_norm > 0, grid
            assert losses == pytest.approx(reference, rel=1e-6, abs=0), grid
