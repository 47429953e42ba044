"""Delayed scaling's update once per pass (parallel/fp8/delayed_updates.py): for many linears at once, one
collective and batched operations, the same bits as each linear updated alone right after its cast; and a
snapshot puts back everything a pass changes (--fp8-guard's replay)."""

import torch

from parallel.fp8.delayed_updates import BACKWARD, FORWARD, update_delayed_scales
from parallel.fp8.kernel import E4M3, E5M2
from parallel.fp8.recipes import GRAD_OUTPUT, INPUT, WEIGHT, DelayedScaling, Fp8Recipe

RECIPE = Fp8Recipe(fp8_format="hybrid", recipe="delayed", margin=1, amax_history_len=3, amax_compute_algo="max")


def _casts(scalings, step):
    """Every role of every linear cast once, with amaxes that differ by linear and step (one of them 0)."""
    for index, scaling in enumerate(scalings):
        for role, dtype in ((INPUT, E4M3), (WEIGHT, E4M3), (GRAD_OUTPUT, E5M2)):
            scale = 0.0 if (index, role, step) == (1, INPUT, 2) else (index + 1) * (role + 1.7) ** step
            scaling.quantize(torch.linspace(-scale, scale / 3, 12), role, dtype)


def test_one_batched_update_equals_each_linear_updated_alone_and_reduces_once():
    together = [DelayedScaling(RECIPE) for _ in range(3)]
    alone = [DelayedScaling(RECIPE) for _ in range(3)]
    reduced = []
    for step in range(4):
        _casts(together, step)
        _casts(alone, step)
        for which in (FORWARD, BACKWARD):
            update_delayed_scales(together, which, lambda amax: reduced.append(tuple(amax.shape)))
            for scaling in alone:
                update_delayed_scales([scaling], which)
        for mine, theirs in zip(together, alone):
            assert torch.equal(mine.amax_history, theirs.amax_history) and torch.equal(mine.scale, theirs.scale)
    assert reduced == [(3, 2), (3, 1)] * 4  # one reduction a pass: every linear's roles in one buffer
    assert (together[0].scale != 1.0).all() and together[1].amax_history[:, INPUT].eq(0.0).any()


def test_a_snapshot_puts_back_the_histories_scales_and_recompute_stash():
    scaling = DelayedScaling(RECIPE)
    _casts([scaling], 1)
    update_delayed_scales([scaling], FORWARD)
    scaling.stash_for_recompute()
    before = (scaling.amax_history, scaling.scale)
    snapshot = scaling.snapshot()
    _casts([scaling], 2)
    for which in (FORWARD, BACKWARD):
        update_delayed_scales([scaling], which)
    scaling.begin_recompute()
    assert not torch.equal(scaling.scale, before[1]) and not scaling._recompute_stash
    scaling.restore(snapshot)
    assert torch.equal(scaling.amax_history, before[0]) and torch.equal(scaling.scale, before[1])
    assert len(scaling._recompute_stash) == 1
