"""Bounds before work (issue 33, problems 13-15): a run no machine could hold, a value refused on the
command line but taken from a JSON or a YAML, and a zero-sample ramp end in one line and exit 2 before
anything is built or written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pretrain_gpt
from arguments.batch_schedule import batch_schedule
from arguments.bounds import check_machine_bounds
from arguments.config import ConfigError
from arguments.parser import parse_config
from base.errors import run_tool
from tests.reliability_helpers import TINY, run_main


def refused(tmp_path, monkeypatch, *argv):
    """pretrain_gpt.main on argv from an empty directory: its stderr line, after checking the line is
    the only one, the status is 2 and the directory is still empty."""
    monkeypatch.chdir(tmp_path)
    outcome = run_main(pretrain_gpt.main, [*TINY, "--data-cache-dir", str(tmp_path / "cache"), *argv])
    lines = outcome.err.strip().splitlines()
    assert outcome.code == 2 and len(lines) == 1 and "Traceback" not in outcome.err, outcome.err
    assert list(tmp_path.iterdir()) == [], "a refused run created files"
    return lines[0]


# Each of these allocated until killed or raised a traceback before (issue 33, #14 and #15).
@pytest.mark.parametrize("argv, words", [
    (["--global-batch-size", "1000000000000"], "samples"),
    (["--train-iters", "1000000000000000"], "samples"),
    (["--train-samples", "100000000000000000000"], "64-bit"),
    (["--eval-iters", "1000000000000"], "samples"),
    (["--hidden-size", "10000000", "--num-attention-heads", "2"], "MLP weight"),
    (["--seq-length", "100000000", "--max-position-embeddings", "100000000"], "activation"),
    (["--micro-batch-size", "1000000000000", "--global-batch-size", "1000000000000"], "activation"),
    (["--num-layers", "1000000", "--hidden-size", "4096", "--num-attention-heads", "32"], "parameters"),
    (["--distributed-timeout-minutes", "1e300"], "a year"),
    (["--distributed-timeout-minutes", "1e-9"], "5 seconds"),
])
def test_a_run_no_machine_holds_is_one_line_before_any_work(tmp_path, monkeypatch, argv, words):
    assert words in refused(tmp_path, monkeypatch, *argv)


def test_the_estimates_use_the_machine_they_are_given():
    """The same config fits a rank of 1 TiB and not one of 1 GiB: the bound is the machine's, not a constant."""
    config = parse_config(TINY + ["--num-layers", "64", "--hidden-size", "1024", "--num-attention-heads", "8"])
    check_machine_bounds(config, world_size=1, memory=2**40, host_memory=2**40)
    with pytest.raises(ConfigError, match="parameters"):
        check_machine_bounds(config, world_size=1, memory=2**30, host_memory=2**40)
    check_machine_bounds(config, world_size=8, memory=2**30, host_memory=2**40)  # sharded over 8 ranks it fits


def test_a_ramp_over_zero_samples_is_the_full_batch_from_the_start():
    """--rampup-batch-size 2 2 0 divided by zero (issue 33, #15). Megatron's calculator divides the same
    way (megatron/core/num_microbatches_calculator.py, RampupBatchsizeNumMicroBatchesCalculator.update:
    `steps = int(consumed_samples / self.rampup_samples_per_increment)`); an empty ramp is no ramp."""
    config = parse_config(TINY + ["--micro-batch-size", "2", "--global-batch-size", "8",
                                  "--rampup-batch-size", "2", "2", "0"])
    schedule = batch_schedule(config, data_parallel_size=1)
    assert [schedule.global_batch_at(consumed) for consumed in (0, 8, 16)] == [8, 8, 8]


@pytest.mark.parametrize("steps", [0, -3])
def test_a_json_accumulation_value_is_refused_as_the_flag_is(tmp_path, monkeypatch, steps):
    """Issue 33, #13: the value the flag refuses is refused from the JSON too, also when a flag overrides it."""
    config = tmp_path.parent / f"ds-{steps}.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": steps}))
    line = refused(tmp_path, monkeypatch, "--zero-config", config, "--gradient-accumulation-steps", "1")
    assert "--gradient-accumulation-steps must be at least 1" in line and config.name in line


@pytest.mark.parametrize("keys", [("num_layers", "num_layers"), ("num_layers", "num-layers")])
def test_a_preset_giving_a_key_twice_is_refused(tmp_path, monkeypatch, keys):
    """Issue 33, #13: PyYAML keeps the last of two equal keys; one setting named twice is refused."""
    preset = tmp_path.parent / "twice.yaml"
    preset.write_text(f"{keys[0]}: 2\n{keys[1]}: 3\n")
    line = refused(tmp_path, monkeypatch, "--config", preset)
    assert "given twice" in line and "twice.yaml" in line


@pytest.mark.parametrize("argv, words", [(["--layers", "1000000", "1000001"], "parameters"),
                                         (["--timeout", "nan"], "--timeout"), (["--timeout", "-1"], "--timeout")])
def test_the_mini_reproduction_refuses_what_cannot_run_before_it_launches(tmp_path, monkeypatch, argv, words):
    """Issue 33 #14/#15: `--layers 1000000 1000001` launched, was OOM-killed after ~4 min and said
    "the launch failed (137): "; `--timeout nan` was a traceback. Now one line before any rank starts."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts" / "zero_paper"))
    import mini_reproduction
    monkeypatch.chdir(tmp_path)
    def main(args):
        return run_tool("mini_reproduction.py", lambda: mini_reproduction.main(args), (ConfigError,))

    outcome = run_main(main, ["--output", tmp_path / "out" / "x.json", "--data-cache-dir", tmp_path / "cache", *argv])
    assert outcome.code == 2 and words in outcome.err and len(outcome.err.strip().splitlines()) == 1, outcome.err
    assert list(tmp_path.iterdir()) == []


def test_a_full_data_cache_dir_is_named(tmp_path, monkeypatch):
    """Issue 33 #16: a full --data-cache-dir said only "[Errno 28] No space left on device". The disk is
    filled by the write itself failing as a full disk's does (an OSError with errno ENOSPC and no file)."""
    import errno

    from data import corpus

    def full_disk(*_):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(corpus, "_build", full_disk)
    cache = tmp_path / "cache"
    monkeypatch.chdir(tmp_path)
    outcome = run_main(pretrain_gpt.main, [*TINY, "--data-cache-dir", str(cache)])
    lines = outcome.err.strip().splitlines()
    assert outcome.code == 2 and len(lines) == 1 and f"--data-cache-dir {cache}" in lines[0], outcome.err
    assert "No space left on device" in lines[0] and list(cache.iterdir()) == []  # no partial corpus left


def test_the_parameter_lower_bound_of_a_mixed_pattern_stays_below_its_model():
    """A `*-+-` model whose MLA projections outweigh attention's 4h^2: the bound takes the smaller mixer for each
    layer (it took MLA's for all, above the model's own count, so a machine that holds it could be refused)."""
    from arguments.bounds import parameter_lower_bound
    from gpt.shape import model_shape

    mla = ["--multi-latent-attention", "--kv-lora-rank", "256", "--q-lora-rank", "256", "--qk-head-dim", "128",
           "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128", "--position-embedding-type", "rope"]
    base = ["--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "64", "--max-position-embeddings",
            "64", "--vocab-size", "512", "--micro-batch-size", "1", "--global-batch-size", "1"]
    for extra in (["--num-layers", "4", *mla], ["--hybrid-layer-pattern", "*-+-*-+-", *mla]):
        model = parse_config([*base, *extra]).model
        assert parameter_lower_bound(model)[0] <= model_shape(model).parameter_count(model.padded_vocab_size()), extra
