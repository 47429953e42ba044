"""Megatron's --rampup-batch-size: the global batch of every iteration is a function of the samples
consumed before it, the data loader, the learning rate, the consumed samples, tokens/s and FLOPs
follow it, and a run resumed in the middle of the ramp continues it bitwise."""

import dataclasses

import pytest

from arguments.batch_schedule import batch_schedule
from arguments.config import ConfigError
from arguments.parser import parse_config
from tests.reliability_helpers import straight_and_resumed
from training.metrics import flops_per_iteration

SEQ = 16
TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", str(SEQ),
        "--max-position-embeddings", str(SEQ), "--tokenizer-vocab-size", "300", "--device", "cpu",
        "--log-interval", "1", "--eval-iters", "0", "--seed", "3", "--lr-warmup-iters", "0"]
# START 2, INCREMENT 2, over the first 12 samples, to 8: three increments, one every 4 samples.
RAMP = ["--micro-batch-size", "2", "--global-batch-size", "8", "--rampup-batch-size", "2", "2", "12"]


def test_the_ramp_follows_megatrons_arithmetic():
    """Worked by hand: 12 samples / 3 increments = one increment per 4 consumed samples, and the full
    batch once more than 12 are consumed. From 0: 2 (0 consumed), 2 (2), 4 (4), 6 (8), 8 (14), 8 ..."""
    batch = batch_schedule(parse_config(TINY + RAMP), data_parallel_size=1)
    consumed, batches = 0, []
    for _ in range(7):
        batches.append(batch.global_batch_at(consumed))
        consumed += batches[-1]
    assert batches == [2, 2, 4, 6, 8, 8, 8]
    assert [batch.accumulation_steps_at(c) for c in (0, 4, 8, 14)] == [1, 2, 3, 4]
    assert batch.consumed_after(7) == sum(batches) == consumed
    assert batch.consumed_after(3, consumed_samples=8) == 8 + 6 + 8 + 8
    plain = batch_schedule(parse_config(TINY + ["--micro-batch-size", "2", "--global-batch-size", "8"]), 1)
    assert plain.consumed_after(5) == 40


@pytest.mark.parametrize("ramp, data_parallel_size, words", [
    (["2", "2", "12"], 2, "START and INCREMENT must be multiples of --micro-batch-size 2 x data-parallel size 2"),
    (["3", "2", "12"], 1, "the ramp must reach --global-batch-size 8 from 3 in steps of 2"),
    (["10", "2", "12"], 1, "the ramp must reach --global-batch-size 8 from 10"),
    (["0", "2", "12"], 1, "START and INCREMENT must be at least 1"),
])
def test_a_ramp_that_cannot_split_into_micro_batches_is_refused(ramp, data_parallel_size, words):
    with pytest.raises(ConfigError, match=words):
        config = parse_config(TINY + ["--micro-batch-size", "2", "--global-batch-size", "8", "--rampup-batch-size",
                                      *ramp])
        batch_schedule(config, data_parallel_size)


def test_a_ramp_and_accumulation_steps_together_are_refused():
    with pytest.raises(ConfigError, match="--rampup-batch-size sets the accumulation steps"):
        parse_config(TINY + RAMP + ["--gradient-accumulation-steps", "4"])


@pytest.fixture(scope="module")
def ramp_runs(tmp_path_factory):
    """Six iterations straight through; and three (saved) + three resumed from the checkpoint, which
    lands in the middle of the ramp (8 samples consumed, batch 6 next)."""
    tmp = tmp_path_factory.mktemp("ramp")
    common = TINY + RAMP + ["--train-iters", "6", "--data-cache-dir", str(tmp / "cache")]
    full, parts, _ = straight_and_resumed(common, tmp, exit_interval=3)
    return full, parts


def test_every_iteration_trains_its_batch_and_reports_it(ramp_runs):
    full, _ = ramp_runs
    assert [r["global_batch_size"] for r in full] == [2, 2, 4, 6, 8, 8]
    assert [r["consumed_samples"] for r in full] == [2, 4, 8, 14, 22, 30]
    config = parse_config(TINY + RAMP)
    for record in full:  # one iteration per record: its own batch's tokens and FLOPs over its own time
        tokens = record["global_batch_size"] * SEQ
        assert record["tokens_per_s"] == pytest.approx(tokens / record["iter_time_s"], rel=1e-9)
        model = dataclasses.replace(config.model, vocab_size=300)
        flops = flops_per_iteration(model, record["global_batch_size"], padded_vocab_size=384)
        assert record["tflops_per_gpu"] == pytest.approx(flops / (record["iter_time_s"] * 1e12), rel=1e-9)


def test_the_learning_rate_follows_consumed_samples(ramp_runs):
    """Megatron's scheduler in samples: decay over --train-iters 6 x --global-batch-size 8 = 48 samples
    (no warmup), and each update at the samples consumed before it: 0, 2, 4, 8, 14, 22."""
    full, _ = ramp_runs
    # A launch that sets the model by flags and names no --config takes Megatron-LM's defaults (issue 34):
    # --min-lr 0 and a linear decay; --lr is ours (Megatron has none).
    lr, min_lr = 1e-3, 0.0
    before = [r["consumed_samples"] - r["global_batch_size"] for r in full]
    assert before == [0, 2, 4, 8, 14, 22]
    expected = [min_lr + (lr - min_lr) * (1 - samples / 48) for samples in before]
    assert [r["lr"] for r in full] == pytest.approx(expected, rel=1e-12)


def test_a_resume_in_the_middle_of_the_ramp_is_bitwise(ramp_runs):
    full, parts = ramp_runs
    assert [r["iteration"] for r in parts] == list(range(1, 7))
    for key in ("loss", "lr", "grad_norm", "global_batch_size", "consumed_samples"):
        assert [r[key] for r in parts] == [r[key] for r in full], key
