"""A skipped fp16 step does not advance the learning-rate schedule.

Megatron-LM (megatron/training/training.py, train_step): `if update_successful: ... opt_param_scheduler.step(
increment=increment)`, with increment = the global batch; OptimizerParamScheduler.get_lr reads its num_steps
(samples of the updates taken). DeepSpeed (deepspeed/runtime/engine.py, _take_model_step): `if overflow: ...
else: ... if self.lr_scheduler is not None: self.lr_scheduler.step()`. Before, the rate here followed the
samples consumed, so every skipped step ran the schedule ahead and an fp16 run ended its decay early.
"""

import math

from tests.reliability_helpers import metrics_records, train

LR, MIN_LR, WARMUP_ITERS, DECAY_ITERS, BATCH = 1e-3, 1e-4, 2, 8, 2
SCHEDULE = ["--lr", str(LR), "--min-lr", str(MIN_LR), "--lr-warmup-iters", str(WARMUP_ITERS), "--lr-decay-iters",
            str(DECAY_ITERS), "--lr-decay-style", "cosine", "--train-iters", "8",
            "--max-consecutive-skipped-iterations", "0"]


def megatron_lr(num_steps: int) -> float:
    """OptimizerParamScheduler.get_lr (megatron/core/optimizer_param_scheduler.py) in samples: linear warmup
    from 0, then cosine decay to min_lr."""
    warmup, decay = WARMUP_ITERS * BATCH, DECAY_ITERS * BATCH
    if num_steps <= warmup:
        return LR * num_steps / warmup
    ratio = (num_steps - warmup) / (decay - warmup)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (math.cos(math.pi * ratio) + 1.0)


def training_records(path):
    return [r for r in metrics_records(path) if "lr" in r and "split" not in r]


def test_a_run_whose_every_step_is_skipped_keeps_step_zeros_rate(corpus_cache_300, tmp_path):
    """A static scale of 1e30 overflows every backward: every update is skipped, so the rate stays the one of
    no update taken (0 under the warmup), where before it ran through the warmup and the decay."""
    outcome = train(corpus_cache_300, tmp_path, "--fp16", "--loss-scale", "1e30", *SCHEDULE)
    assert outcome.code == 0, outcome.err
    records = training_records(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in records] == list(range(1, 9))
    assert records[-1]["skipped_iterations"] == 8
    assert {r["lr"] for r in records} == {megatron_lr(0)}


def test_some_skipped_steps_end_the_schedule_where_megatrons_arithmetic_does(corpus_cache_300, tmp_path):
    """A dynamic scale starting at 2**20 overflows the first steps and halves until it fits: those steps are
    skipped, and each later step's rate is Megatron's at the samples of the updates taken before it."""
    outcome = train(corpus_cache_300, tmp_path, "--fp16", "--initial-loss-scale", str(2 ** 20), "--hysteresis", "1",
                    *SCHEDULE)
    assert outcome.code == 0, outcome.err
    records = training_records(tmp_path / "metrics.jsonl")
    skipped_before, expected = 0, []
    for iteration, record in enumerate(records, start=1):
        taken = iteration - 1 - skipped_before  # updates taken before this iteration
        expected.append(megatron_lr(taken * BATCH))
        skipped_before = record["skipped_iterations"]
    assert 0 < records[-1]["skipped_iterations"] < 8  # some skipped, some taken
    assert [r["lr"] for r in records] == expected
    # the run ends its schedule short of the decay's end by the skipped steps, as Megatron's does
    assert records[-1]["lr"] > megatron_lr((8 - 1) * BATCH)
