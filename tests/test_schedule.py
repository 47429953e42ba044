import math

import pytest

from gpt.config import OptimizerConfig
from gpt.schedule import learning_rate


def config(style, **overrides):
    values = dict(lr=1.0, min_lr=0.1, lr_warmup_iters=10, lr_decay_style=style)
    values.update(overrides)
    return OptimizerConfig(**values)


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
def test_warmup_is_linear_from_zero(style):
    assert [learning_rate(i, config(style), 100) for i in (1, 5, 10)] == pytest.approx([0.1, 0.5, 1.0])


def test_cosine_decays_to_min_lr():
    c = config("cosine")
    assert learning_rate(55, c, 100) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert learning_rate(100, c, 100) == pytest.approx(0.1)
    assert learning_rate(150, c, 100) == pytest.approx(0.1)
    values = [learning_rate(i, c, 100) for i in range(10, 101)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_linear_and_constant():
    assert learning_rate(55, config("linear"), 100) == pytest.approx(0.1 + 0.9 * 0.5)
    assert learning_rate(55, config("constant"), 100) == 1.0
    assert learning_rate(30, config("linear", lr_decay_iters=50), 100) == pytest.approx(0.1 + 0.9 * 0.5)
