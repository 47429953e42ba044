"""Megatron-LM's --lr-decay-style WSD (warmup-stable-decay) and inverse-square-root, from its
OptimizerParamScheduler.get_lr (megatron/core/optimizer_param_scheduler.py) and get_optimizer_param_scheduler
(megatron/training/training.py: the anneal is --lr-wsd-decay-iters x the global batch, or --lr-wsd-decay-samples).
Before, WSD was argparse's "invalid choice", alone, hiding the launch's other problems."""

import math

import pytest

from arguments.batch_schedule import batch_schedule
from arguments.config import ConfigError
from arguments.parser import parse_arguments, parse_config
from arguments.schedule import build_lr_schedule

LR, MIN_LR, BATCH = 3e-4, 3e-5, 8


def megatron_get_lr(num_steps, warmup_steps, decay_steps, style, wsd_decay_steps=None, wsd_style=None):
    """get_lr, written out from the cited file (init_lr 0), in samples."""
    if warmup_steps > 0 and num_steps <= warmup_steps:
        return LR * num_steps / warmup_steps
    if style == "constant":
        return LR
    if num_steps > decay_steps:
        return MIN_LR
    if style == "inverse-square-root":
        return max(MIN_LR, LR * max(warmup_steps, 1) ** 0.5 / max(num_steps, 1) ** 0.5)
    decay_ratio = (num_steps - warmup_steps) / (decay_steps - warmup_steps)
    if style == "WSD":
        anneal_start = decay_steps - wsd_decay_steps
        if num_steps <= anneal_start:
            coeff = 1.0
        else:
            ratio = (num_steps - anneal_start) / wsd_decay_steps
            coeff = {"linear": 1.0 - ratio, "cosine": 0.5 * (math.cos(math.pi * ratio) + 1.0),
                     "exponential": 2.0 * math.pow(0.5, ratio) - 1.0, "minus_sqrt": 1.0 - math.sqrt(ratio)}[wsd_style]
    else:
        coeff = 1.0 - decay_ratio if style == "linear" else 0.5 * (math.cos(math.pi * decay_ratio) + 1.0)
    return MIN_LR + coeff * (LR - MIN_LR)


COMMON = ["--lr", str(LR), "--min-lr", str(MIN_LR), "--global-batch-size", str(BATCH), "--micro-batch-size", "1",
          "--train-iters", "100", "--lr-warmup-iters", "10"]


@pytest.mark.parametrize("wsd_style", ["exponential", "linear", "cosine", "minus_sqrt"])
def test_wsd_rate_over_a_whole_run_is_megatrons(wsd_style):
    config = parse_config(COMMON + ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "30",
                                    "--lr-wsd-decay-style", wsd_style])
    schedule = build_lr_schedule(config.optimizer, config.training, config.model.seq_length, batch_schedule(config, 1))
    for iteration in range(101):
        samples = iteration * BATCH
        assert schedule.rate(samples) == pytest.approx(
            megatron_get_lr(samples, 10 * BATCH, 100 * BATCH, "WSD", 30 * BATCH, wsd_style), rel=1e-12, abs=0), iteration
    assert schedule.rate(60 * BATCH) == LR and schedule.rate(70 * BATCH) == LR  # stable until the anneal
    assert schedule.rate(100 * BATCH) == pytest.approx(MIN_LR)


def test_wsd_in_samples_and_inverse_square_root():
    config = parse_config(["--lr", str(LR), "--min-lr", str(MIN_LR), "--global-batch-size", str(BATCH),
                           "--micro-batch-size", "1", "--train-samples", "800", "--lr-warmup-samples", "80",
                           "--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "240"])
    schedule = build_lr_schedule(config.optimizer, config.training, config.model.seq_length, batch_schedule(config, 1))
    assert [schedule.rate(s) for s in range(0, 801, 8)] == pytest.approx(
        [megatron_get_lr(s, 80, 800, "WSD", 240, "exponential") for s in range(0, 801, 8)], rel=1e-12)
    config = parse_config(COMMON + ["--lr-decay-style", "inverse-square-root"])
    schedule = build_lr_schedule(config.optimizer, config.training, config.model.seq_length, batch_schedule(config, 1))
    assert [schedule.rate(i * BATCH) for i in range(101)] == pytest.approx(
        [megatron_get_lr(i * BATCH, 80, 800, "inverse-square-root") for i in range(101)], rel=1e-12)


def test_an_invalid_style_is_reported_with_the_launchs_other_problems():
    with pytest.raises(ConfigError) as error:
        parse_arguments(["--lr-decay-style", "bogus", "--num-layerz", "3"])
    message = str(error.value)
    assert message.startswith("2 problems:") and "--lr-decay-style 'bogus' is not one of" in message
    assert "unrecognized arguments: --num-layerz 3" in message
    with pytest.raises(ConfigError, match="--lr-decay-style WSD needs the anneal's length"):
        parse_config(["--lr-decay-style", "WSD"])
