"""Megatron's rules for a run's length in iterations or in samples and the schedule lengths that go with
each (arguments/run_lengths.py), from Megatron-LM's validate_args (megatron/training/arguments.py, the
"Iteration-based training." and "Sample-based training." blocks; the same in Megatron-DeepSpeed's
megatron/arguments.py):

    if args.train_iters:  assert args.lr_warmup_samples == 0 (and train_samples, lr_decay_samples None)
                          if args.lr_warmup_fraction is not None: assert args.lr_warmup_iters == 0
    if args.train_samples: assert args.lr_warmup_iters == 0 (and train_iters, lr_decay_iters None)
                          if args.lr_warmup_fraction is not None: assert args.lr_warmup_samples == 0

Values are compared, not whether a flag was typed: the unset value written out is accepted (issue 48: the
gpt3_mcore_reruns_* functional tests give `--lr-warmup-samples: 0` beside `--train-iters: 50`), a value
that means something is refused in one line naming both flags. Expected schedules are worked by hand."""

import pytest

from arguments.batch_schedule import batch_schedule
from arguments.config import ConfigError
from arguments.parser import parse_config
from arguments.schedule import build_lr_schedule

TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--max-position-embeddings", "16", "--tokenizer-vocab-size", "300", "--device", "cpu",
        "--micro-batch-size", "2", "--global-batch-size", "4"]


def schedule_of(argv):
    config = parse_config(TINY + argv)
    return config, build_lr_schedule(config.optimizer, config.training, config.model.seq_length, batch_schedule(config, 1))


# (the run's kind, the warmup flag Megatron asserts == 0 there, the warmup in samples the schedule then has)
ZERO_ASSERTS = [
    pytest.param(["--train-iters", "10", "--lr-warmup-iters", "2"], "--lr-warmup-samples", 2 * 4,
                 id="train-iters: lr_warmup_samples == 0"),
    pytest.param(["--train-samples", "40"], "--lr-warmup-iters", 0, id="train-samples: lr_warmup_iters == 0"),
    pytest.param(["--train-iters", "10", "--lr-warmup-fraction", "0.2"], "--lr-warmup-iters", 0.2 * 10 * 4,
                 id="train-iters, warmup fraction: lr_warmup_iters == 0"),
    pytest.param(["--train-samples", "40", "--lr-warmup-fraction", "0.25"], "--lr-warmup-samples", 0.25 * 40,
                 id="train-samples, warmup fraction: lr_warmup_samples == 0"),
]


@pytest.mark.parametrize("kind, warmup_flag, warmup_samples", ZERO_ASSERTS)
def test_the_unset_warmup_is_accepted_and_a_real_one_refused_naming_both_flags(kind, warmup_flag, warmup_samples):
    """Before: `--lr-warmup-samples 0` beside `--train-iters` was refused ("give one of --train-iters and
    --lr-warmup-samples, not both"), as were the other three zeros Megatron asserts."""
    config, schedule = schedule_of(kind + [warmup_flag, "0"])
    assert schedule.warmup_samples == warmup_samples
    assert getattr(config.optimizer, warmup_flag[2:].replace("-", "_")) == 0
    with pytest.raises(ConfigError) as error:
        parse_config(TINY + kind + [warmup_flag, "3"])
    message = str(error.value)
    other = "--lr-warmup-fraction" if "--lr-warmup-fraction" in kind else kind[0]
    assert "\n" not in message and f"give one of {other} and {warmup_flag}, not both" in message, message


@pytest.mark.parametrize("flag, value", [("--lr-warmup-samples", "8"), ("--lr-decay-samples", "9")])
def test_a_sample_length_in_a_run_counting_iterations_by_default_is_refused(flag, value):
    """Before: `--lr-decay-samples 9` with neither --train-iters nor --train-samples was accepted and then
    ignored (the run counts the preset's --train-iters 250). Megatron-LM asserts it unset whenever
    train_iters is set, whoever set it."""
    with pytest.raises(ConfigError) as error:
        parse_config(TINY + [flag, value])
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{flag} {value} on the command line is a length in samples, "
                                                      f"and this run counts iterations (--train-iters 250, default)"), message
    assert "give --train-samples" in message
    config, schedule = schedule_of(["--train-samples", "40", flag, value])  # counting samples, it applies
    assert getattr(config.optimizer, flag[2:].replace("-", "_")) == int(value)
    assert (schedule.warmup_samples if "warmup" in flag else schedule.decay_samples) == int(value)


def test_the_megatron_functional_tests_schedule_flags_are_accepted_as_written():
    """gpt3_mcore_reruns_resume/model_config.yaml (NVIDIA/Megatron-LM): `--train-iters: 50` and
    `--lr-warmup-samples: 0`, no warmup otherwise: Megatron's default --lr-warmup-iters is 0, and a
    launch that names no preset and sets the model by flags starts from Megatron's defaults, so there is
    no warmup at all."""
    config, schedule = schedule_of(["--use-mcore-models", "--train-iters", "50", "--lr", "3e-4",
                                    "--lr-warmup-samples", "0"])
    assert (config.training.train_iters, config.optimizer.lr_warmup_iters) == (50, 0)
    assert schedule.warmup_samples == 0 and schedule.decay_samples == 50 * 4
