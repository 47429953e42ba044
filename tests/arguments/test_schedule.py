"""The run's length and learning rate equal Megatron's arithmetic (issue 22): iteration-, sample- and
token-based, with and without a batch ramp, and across a resume. Expected values are worked by hand
from Megatron-LM's OptimizerParamScheduler / update_train_iters and Megatron-DeepSpeed's token
variant; the formulas are written out here, not taken from arguments/schedule.py."""

import json
import math

import pytest

import pretrain_gpt
from arguments.batch_schedule import batch_schedule
from arguments.config import ConfigError
from arguments.parser import parse_config
from arguments.schedule import build_lr_schedule, tokens_seen_by_schedule, train_iterations
from tests.reliability_helpers import straight_and_resumed

SEQ = 16
TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", str(SEQ),
        "--max-position-embeddings", str(SEQ), "--tokenizer-vocab-size", "300", "--device", "cpu",
        "--log-interval", "1", "--eval-iters", "0", "--seed", "3", "--lr", "1e-3", "--min-lr", "1e-4",
        "--lr-decay-style", "cosine"]  # the decay these tests work by hand (Megatron's default is linear)
BATCH = ["--micro-batch-size", "2", "--global-batch-size", "4"]
RAMP = ["--micro-batch-size", "2", "--global-batch-size", "8", "--rampup-batch-size", "2", "2", "12"]


def cosine(done, start, end, lr=1e-3, min_lr=1e-4):
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * (done - start) / (end - start)))


def schedule_of(*flags):
    config = parse_config(TINY + list(flags))
    batch = batch_schedule(config, 1)
    return build_lr_schedule(config.optimizer, config.training, config.model.seq_length, batch), train_iterations(config.training, batch), batch


def test_iteration_based_lengths_are_iterations_times_the_global_batch():
    schedule, iterations, _ = schedule_of(*BATCH, "--train-iters", "10", "--lr-warmup-iters", "2")
    assert (iterations, schedule.warmup_samples, schedule.decay_samples) == (10, 8, 40)
    # Megatron: the update of iteration k uses the rate at the samples before it: iteration 1 at 0.
    assert schedule.rate(0) == 0.0 and schedule.rate(4) == pytest.approx(5e-4) and schedule.rate(8) == 1e-3
    assert schedule.rate(24) == pytest.approx(cosine(24, 8, 40))
    assert schedule.rate(40) == pytest.approx(1e-4) and schedule.rate(44) == 1e-4
    fraction, _, _ = schedule_of(*BATCH, "--train-iters", "10", "--lr-decay-iters", "5", "--lr-warmup-fraction", "0.2")
    assert (fraction.warmup_samples, fraction.decay_samples) == (4, 20)


def test_a_resume_to_a_longer_run_names_the_stop_and_resume_recipe_first():
    """Issue 115, item 5: `--load ckpt --train-iters 100` after a 50-iteration run is refused, as in Megatron-LM;
    the line names what a run meant to stop and resume passes before the two scheduler flags."""
    from arguments.schedule import resumed_schedule

    longer = parse_config([*BATCH, "--train-iters", "100"])
    shorter = parse_config([*BATCH, "--train-iters", "50"])
    with pytest.raises(ConfigError) as refused:
        resumed_schedule(longer.optimizer, longer.training, build_lr_schedule(longer.optimizer, longer.training, longer.model.seq_length, batch_schedule(longer, 1)),
                         build_lr_schedule(shorter.optimizer, shorter.training, shorter.model.seq_length, batch_schedule(shorter, 1)), "ckpt/iter_0000050")
    message = str(refused.value)
    assert message.startswith("resuming ckpt/iter_0000050: the learning-rate schedule differs from the checkpoint's (")
    assert message.index("--train-iters FINAL --exit-interval K") < message.index("--override-opt_param-scheduler")


@pytest.mark.parametrize("style, expected", [("linear", 1e-4 + 0.9e-3 * (1 - 16 / 32)), ("constant", 1e-3)])
def test_linear_and_constant(style, expected):
    schedule, _, _ = schedule_of(*BATCH, "--train-iters", "10", "--lr-warmup-iters", "2", "--lr-decay-style", style)
    assert schedule.rate(24) == pytest.approx(expected)


def test_warmup_starts_at_lr_warmup_init():
    schedule, _, _ = schedule_of(*BATCH, "--train-iters", "10", "--lr-warmup-iters", "2", "--lr-warmup-init", "1e-4")
    assert schedule.rate(0) == 1e-4 and schedule.rate(4) == pytest.approx(1e-4 + 0.9e-3 / 2)


def test_sample_based_lengths_and_iterations():
    schedule, iterations, _ = schedule_of(*BATCH, "--train-samples", "30", "--lr-warmup-samples", "8",
                                          "--lr-decay-samples", "26")
    assert iterations == 7  # 30 // 4: Megatron drops the last partial batch
    assert (schedule.warmup_samples, schedule.decay_samples) == (8, 26)
    assert schedule.rate(12) == pytest.approx(cosine(12, 8, 26))
    schedule, _, _ = schedule_of(*BATCH, "--train-samples", "30", "--lr-warmup-fraction", "0.1")
    assert (schedule.warmup_samples, schedule.decay_samples) == (pytest.approx(3.0), 30)


def test_sample_based_iterations_with_a_ramp_follow_update_train_iters():
    """Batches 2, 2, 4, 6 consume 14 > 12 samples (the ramp), then (40 - 14) // 8 = 3 whole batches."""
    _, iterations, _ = schedule_of(*RAMP, "--train-samples", "40")
    assert iterations == 7
    _, iterations, _ = schedule_of(*RAMP, "--train-samples", "9")  # the ramp loop stops past 9 samples
    assert iterations == 4


def test_a_sample_based_run_drops_the_preset_iteration_lengths_and_refuses_explicit_ones():
    config = parse_config(TINY + BATCH + ["--train-samples", "30"])  # the tiny preset sets train_iters, warmup
    assert config.training.train_iters is None and config.optimizer.lr_warmup_iters == 0
    for conflict in (["--train-iters", "5"], ["--lr-decay-iters", "5"], ["--lr-warmup-iters", "1"]):
        with pytest.raises(ConfigError, match="not both"):
            parse_config(TINY + BATCH + ["--train-samples", "30"] + conflict)
    with pytest.raises(ConfigError, match="--train-iters and --lr-decay-samples"):
        parse_config(TINY + BATCH + ["--train-iters", "5", "--lr-decay-samples", "9"])


def test_tokens_lag_the_samples_by_one_iteration():
    _, _, batch = schedule_of(*BATCH, "--train-iters", "10")
    assert [tokens_seen_by_schedule(batch, samples, SEQ) for samples in (0, 4, 8, 12)] == [0, 0, 64, 128]
    _, _, ramp = schedule_of(*RAMP, "--train-iters", "10")
    # boundaries 0, 2, 4, 8, 14, 22: after 14 samples the scheduler has seen the tokens of 8
    assert [tokens_seen_by_schedule(ramp, samples, SEQ) for samples in (2, 8, 14, 22, 30)] == [
        0, 4 * SEQ, 8 * SEQ, 14 * SEQ, 22 * SEQ]


def test_a_warmup_in_samples_then_a_decay_in_tokens_decays_from_the_warmups_end():
    schedule, _, _ = schedule_of(*BATCH, "--train-iters", "10", "--lr-warmup-iters", "2", "--lr-decay-tokens", "512")
    # warmup ends at 8 samples; the scheduler then saw the tokens of 4 samples: 64
    assert schedule.warmup_end_tokens == 64
    assert schedule.rate(12, 128) == pytest.approx(cosine(128, 64, 512))


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if "split" not in json.loads(line)]


@pytest.fixture(scope="module")
def token_runs(tmp_path_factory):
    """Megatron-DeepSpeed's 1.3B recipe in miniature: --train-samples with --train-tokens and a token
    warmup and decay; straight through, and 2 saved + resumed to the end."""
    tmp = tmp_path_factory.mktemp("tokens")
    common = TINY + BATCH + ["--train-samples", "30", "--train-tokens", "300", "--lr-warmup-tokens", "64",
                             "--lr-decay-tokens", "160", "--data-cache-dir", str(tmp / "cache")]
    return straight_and_resumed(common, tmp, exit_interval=2)


def test_token_schedule_and_stop_point_equal_megatron_deepspeeds(token_runs):
    """64 tokens an iteration. The rate of iteration k sees the tokens before iteration k - 1:
    0, 0, 64 (the warmup's end: 1e-3), 128, 192 (past the 160-token decay: min-lr). The loop runs while
    fewer than 300 tokens are consumed: 5 iterations (320 tokens), before --train-samples' 7."""
    full, _, _ = token_runs
    assert [r["iteration"] for r in full] == [1, 2, 3, 4, 5]
    assert [r["consumed_samples"] for r in full] == [4, 8, 12, 16, 20]
    assert [r["lr"] for r in full] == pytest.approx([0.0, 0.0, 1e-3, cosine(128, 64, 160), 1e-4], rel=1e-12)


def test_a_resumed_token_run_continues_the_schedule_and_the_losses_bitwise(token_runs):
    full, parts, save = token_runs
    assert [r["iteration"] for r in parts] == [1, 2, 3, 4, 5]
    for name in ("lr", "loss", "consumed_samples"):
        assert [r[name] for r in parts] == [r[name] for r in full], name
    assert (save / "latest").read_text().strip() == "iter_0000005"


def test_a_resume_with_another_schedule_follows_megatrons_rule(token_runs, tmp_path, capsys):
    """Megatron refuses a resume whose schedule differs from the checkpoint's unless told which wins."""
    _, _, save = token_runs
    common = TINY + BATCH + ["--train-samples", "40", "--lr-warmup-tokens", "64", "--lr-decay-tokens", "160",
                             "--data-cache-dir", str(save.parent / "cache"), "--load", str(save)]
    assert pretrain_gpt.main(common + ["--metrics-file", str(tmp_path / "a.jsonl")]) == 2
    error = capsys.readouterr().err
    assert "decay (samples) 40 (the checkpoint's: 30)" in error and "--override-opt_param-scheduler" in error
    assert error.count("\n") == 1
    # issue 115, item 5: the recipe first (a run counted in samples names its own length flag)
    assert error.index("--train-samples FINAL --exit-interval K") < error.index("--override-opt_param-scheduler")

    assert pretrain_gpt.main(common + ["--metrics-file", str(tmp_path / "b.jsonl"), "--override-opt_param-scheduler"]) == 0
    assert "with this run's learning-rate schedule" in capsys.readouterr().out
    assert [r["iteration"] for r in records(tmp_path / "b.jsonl")] == [6, 7, 8, 9, 10]
    assert pretrain_gpt.main(common + ["--metrics-file", str(tmp_path / "c.jsonl"),
                                       "--use-checkpoint-opt_param-scheduler"]) == 0
    assert "the checkpoint's learning-rate schedule" in capsys.readouterr().out


def test_pad_vocab_size_to_sets_the_embedding_rows_exactly(tmp_path, capsys, corpus_cache_300):
    """BigScience's --pad-vocab-size-to: 300 tokens padded to 640 rows (not to the next 128: 384);
    smaller than the vocabulary is one line."""
    from checkpoint.format import read_metadata

    common = TINY + BATCH + ["--train-iters", "1", "--data-cache-dir", corpus_cache_300]
    assert pretrain_gpt.main(common + ["--pad-vocab-size-to", "640", "--save", str(tmp_path / "ck"),
                                       "--metrics-file", str(tmp_path / "m.jsonl")]) == 0
    metadata = read_metadata(tmp_path / "ck" / "iter_0000001")
    rows = {name: entry["shape"][0] for name, entry in metadata["parameters"].items() if "embedding" in name}
    assert 640 in rows.values(), rows
    for size, words in (("256", "at least the vocabulary (300)"),):
        assert pretrain_gpt.main(common + ["--pad-vocab-size-to", size, "--metrics-file", str(tmp_path / f"{size}.jsonl")]) == 2
        error = capsys.readouterr().err
        assert words in error and error.count("\n") == 1, error


@pytest.fixture(scope="module")
def ramp_sample_runs(tmp_path_factory):
    """--train-samples 40 under the ramp 2 -> 8 over 12 samples: straight through, and 3 saved + resumed
    in the middle of the ramp."""
    tmp = tmp_path_factory.mktemp("ramp-samples")
    common = TINY + RAMP + ["--train-samples", "40", "--lr-warmup-samples", "4", "--data-cache-dir", str(tmp / "cache")]
    return straight_and_resumed(common, tmp, exit_interval=3)


def test_a_sample_based_run_under_a_ramp_stops_where_megatron_stops(ramp_sample_runs):
    """Batches 2, 2, 4, 6 (the ramp), then 8s: update_train_iters gives 4 + (40 - 14) // 8 = 7 iterations,
    38 samples (the last partial batch dropped). Each update at the samples before it, warmup over 4
    samples, cosine decay over the 40: worked by hand."""
    full, parts, _ = ramp_sample_runs
    assert [r["iteration"] for r in full] == list(range(1, 8))
    assert [r["consumed_samples"] for r in full] == [2, 4, 8, 14, 22, 30, 38]
    before = [0, 2, 4, 8, 14, 22, 30]
    expected = [1e-3 * s / 4 if s <= 4 else cosine(s, 4, 40) for s in before]
    assert [r["lr"] for r in full] == pytest.approx(expected, rel=1e-12)
    for name in ("lr", "loss", "consumed_samples", "global_batch_size"):  # resumed after iteration 3, mid-ramp
        assert [r[name] for r in parts] == [r[name] for r in full], name
