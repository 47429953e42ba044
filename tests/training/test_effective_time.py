"""The run's end line gives its effective training time (issue 69 item 8): the time of the iterations kept over
the wall time since the process started, as Llama 3 reports its own."""

from __future__ import annotations

import json
import re

import pytest

import pretrain_gpt
from tests.reliability_helpers import TINY, run_main
from training.loop import TrainingSummary
from training.train_step import StepOutcome


def test_the_share_is_the_iterations_time_over_the_wall_time():
    summary = TrainingSummary()
    for iteration in (1, 2):
        summary.add(iteration, StepOutcome(loss=1.0, grad_norm=1.0, skipped=False, loss_scale=1.0, global_batch_size=2,
                                           lr=1e-3, seconds=1.5))
    assert summary.effective_time_line(4.0) == (
        "> effective training time: 75.0% (2 iterations took 3.00 s of the 4.00 s since this process started; the "
        "rest: start-up, evaluation, checkpoints)")


def test_a_run_ends_with_its_effective_training_time(tmp_path, corpus_cache_300):
    metrics = tmp_path / "m.jsonl"
    outcome = run_main(pretrain_gpt.main, TINY + ["--train-iters", "3", "--data-cache-dir", corpus_cache_300,
                                                  "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err
    line = next(line for line in outcome.out.splitlines() if line.startswith("> effective training time:"))
    share, iterations, took, wall = re.fullmatch(
        r"> effective training time: ([\d.]+)% \((\d+) iterations took ([\d.]+) s of the ([\d.]+) s since this "
        r"process started; the rest: start-up, evaluation, checkpoints\)", line).groups()
    records = [json.loads(text) for text in metrics.read_text().splitlines()]
    logged = sum(record["iter_time_s"] for record in records if "iter_time_s" in record)  # --log-interval 1
    assert int(iterations) == 3 and float(took) == pytest.approx(logged, abs=0.05)
    # run in this (pytest worker) process, started long before: the share may print as 0.0%
    assert 0 <= float(share) < 100 and float(share) == pytest.approx(100 * float(took) / float(wall), rel=0.05, abs=0.1)
