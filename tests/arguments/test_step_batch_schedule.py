"""Megatron-LM main's --step-batch-size-schedule (issue 34, point 6), against Megatron's own code:

- megatron/core/num_microbatches_calculator.py (NVIDIA/Megatron-LM d98e8a64, the commit
  arguments/megatron/flags_harvested.json was harvested at): StepBatchsizeNumMicroBatchesCalculator.
  _parse_numeric_value (K/M/B/T suffixes, int(float(v) * multiplier)), _parse_schedule (entries split on
  spaces or commas, `threshold // seq_length` when seq_length is given, sorted), _validate_schedule
  (first threshold 0, strictly increasing, batches > 0), _get_batch_size_for_samples (the batch of the
  last threshold <= consumed samples);
- megatron/training/global_vars.py _build_num_microbatches_calculator call: seq_length=args.seq_length
  (thresholds are tokens in training);
- megatron/training/arguments.py validate_args, lines 694-703: 'Cannot specify both
  --step-batch-size-schedule and --global-batch-size'; then args.global_batch_size = micro x DP;
- megatron/training/training.py get_optimizer_param_scheduler: lr_decay_steps = lr_decay_iters x
  args.global_batch_size (so micro x DP under a schedule); update_train_iters: iterate while consumed <
  train_samples (a last partial batch counts).
"""

import math

import pytest

from arguments.batch_schedule import batch_schedule
from arguments.config import ConfigError
from arguments.parser import parse_config
from arguments.schedule import build_lr_schedule, train_iterations
from arguments.step_batch_schedule import parse_step_schedule
from tests.reliability_helpers import straight_and_resumed

SEQ = 16
TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", str(SEQ),
        "--max-position-embeddings", str(SEQ), "--tokenizer-vocab-size", "300", "--device", "cpu",
        "--log-interval", "1", "--eval-iters", "0", "--seed", "3", "--lr-warmup-iters", "0"]
# Thresholds in tokens: 0, 64 and 0.16K = 160 tokens = 0, 4 and 10 samples of 16 tokens.
STEPS = ["--micro-batch-size", "2", "--step-batch-size-schedule", "0:2, 0.16K:8 64:4"]


def test_megatrons_gpt3_example_schedule_parses_to_samples():
    # examples/gpt3/train_gpt3_175b_distributed.sh: --seq-length 2048 and this schedule
    steps = parse_step_schedule("0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536", 2048)
    assert steps == ((0, 16), (1_171_875, 320), (2_343_750, 624), (3_515_625, 928), (4_687_500, 1232),
                     (5_859_375, 1536))


def test_the_batch_is_the_last_thresholds_and_the_run_ends_at_the_last_batch():
    batch = batch_schedule(parse_config(TINY + STEPS), data_parallel_size=1)
    assert batch.steps == ((0, 2), (4, 4), (10, 8)) and batch.global_batch_size == 8
    assert [batch.global_batch_at(c) for c in (0, 3, 4, 9, 10, 1000)] == [2, 2, 4, 4, 8, 8]
    assert batch.consumed_after(6) == 2 + 2 + 4 + 4 + 8 + 8


def test_train_samples_count_a_last_partial_batch_and_the_lr_decays_over_micro_x_dp():
    config = parse_config(TINY[:-2] + STEPS + ["--train-samples", "21"])  # without --lr-warmup-iters
    batch = batch_schedule(config, 1)
    # 2, 2, 4, 4 (12 consumed), 8 (20), then 1 sample left: one more iteration, as update_train_iters counts
    assert train_iterations(config.training, batch) == 6
    iters = parse_config(TINY + ["--micro-batch-size", "1", STEPS[2], STEPS[3], "--train-iters", "6"])
    schedule = build_lr_schedule(iters.optimizer, iters.training, iters.model.seq_length, batch_schedule(iters, 2))
    assert schedule.decay_samples == 6 * 1 * 2  # --train-iters x (micro batch 1 x DP 2), not x 8


@pytest.mark.parametrize("extra, words", [
    (["--global-batch-size", "8"], ["--step-batch-size-schedule", "--global-batch-size 8", "drop"]),
    (["--rampup-batch-size", "2", "2", "12", "--global-batch-size", "8"], ["--rampup-batch-size", "keep one"]),
    (["--gradient-accumulation-steps", "2"], ["--gradient-accumulation-steps"]),
])
def test_what_megatron_refuses_beside_a_schedule_is_refused_in_one_line(extra, words):
    with pytest.raises(ConfigError) as error:
        config = parse_config(TINY + STEPS + extra)
        batch_schedule(config, 1)
    assert "\n" not in str(error.value) and all(word in str(error.value) for word in words), str(error.value)


@pytest.mark.parametrize("schedule, data_parallel_size, words", [
    ("16:2 64:4", 1, "first threshold must be 0"),
    ("0:2 32:4 33:8", 1, "strictly increase"),  # 32 and 33 tokens are both 2 samples
    ("0:2 64:x", 1, "not THRESHOLD:BATCH"),
    ("0:2 64:6", 2, "not a multiple of --micro-batch-size 2 x data-parallel size 2"),
])
def test_a_schedule_megatron_would_assert_on_is_refused(schedule, data_parallel_size, words):
    with pytest.raises(ConfigError, match=words):
        config = parse_config(TINY + ["--micro-batch-size", "2", "--step-batch-size-schedule", schedule])
        batch_schedule(config, data_parallel_size)


def test_a_run_trains_each_step_and_resumes_in_the_middle_bitwise(tmp_path, corpus_cache_300):
    # --config tiny: the learning-rate schedule below is the tiny preset's (a flag launch without a preset
    # takes Megatron's defaults: linear decay to 0)
    common = ["--config", "tiny"] + TINY + STEPS + ["--train-iters", "6", "--data-cache-dir", corpus_cache_300]
    full, parts, _ = straight_and_resumed(common, tmp_path, exit_interval=3)
    assert [r["global_batch_size"] for r in full] == [2, 2, 4, 4, 8, 8]
    assert [r["consumed_samples"] for r in full] == [2, 4, 8, 12, 20, 28]
    # decay over 6 iterations x micro batch 2 x DP 1 = 12 samples, each update at the samples before it
    lr, min_lr = 1e-3, 1e-4  # the tiny preset's
    before = [r["consumed_samples"] - r["global_batch_size"] for r in full]
    expected = [min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * min(samples, 12) / 12)) for samples in before]
    assert [r["lr"] for r in full] == pytest.approx(expected, rel=1e-12)
    for key in ("loss", "lr", "grad_norm", "global_batch_size", "consumed_samples"):
        assert [r[key] for r in parts] == [r[key] for r in full], key
