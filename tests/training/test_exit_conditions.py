"""training/exit_conditions.py on one process: signals, the iteration interval, the time budget, and the
end-to-end exit with a save (`--exit-duration-in-mins`)."""

import json
import os
import signal

import pytest
import torch

import pretrain_gpt
from arguments.config import CheckpointConfig
from parallel.state import ParallelState
from training.exit_conditions import ExitConditions

STATE = ParallelState(device=torch.device("cpu"))


def test_sigusr1_and_sigterm_are_recorded_then_handlers_restored():
    before = signal.getsignal(signal.SIGUSR1)
    for signum in (signal.SIGUSR1, signal.SIGTERM):
        conditions = ExitConditions(CheckpointConfig(save="unused", exit_signal_handler=True), STATE)
        try:
            assert conditions.check(1) is None
            os.kill(os.getpid(), signum)
            assert conditions.check(2) == f"received {signal.Signals(signum).name} (on this or another rank)"
        finally:
            conditions.close()
    assert signal.getsignal(signal.SIGUSR1) is before


@pytest.mark.smoke
def test_interval_and_duration():
    conditions = ExitConditions(CheckpointConfig(exit_interval=3), STATE)
    assert [conditions.check(i) for i in (1, 2, 3)] == [None, None, "--exit-interval 3 reached"]
    conditions = ExitConditions(CheckpointConfig(exit_interval=0), STATE)  # Megatron-LM's 0: never
    assert [conditions.check(i) for i in (1, 2, 3)] == [None, None, None]
    conditions = ExitConditions(CheckpointConfig(exit_duration_in_mins=0.5), STATE, start_time=0.0)
    assert conditions.check(1) == "--exit-duration-in-mins 0.5 reached"  # monotonic time is far past 30 s
    conditions = ExitConditions(CheckpointConfig(exit_duration_in_mins=60.0), STATE)
    assert conditions.check(1) is None


def test_time_budget_saves_and_exits_zero(tmp_path, corpus_cache):
    metrics, save_dir = tmp_path / "metrics.jsonl", tmp_path / "ckpt"
    argv = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
            "--train-iters", "50", "--eval-iters", "0", "--log-interval", "1", "--tokenizer-vocab-size", "512",
            "--device", "cpu", "--data-cache-dir", corpus_cache, "--metrics-file", str(metrics),
            "--save", str(save_dir), "--exit-duration-in-mins", "1e-6"]
    assert pretrain_gpt.main(argv) == 0
    iterations = [json.loads(line)["iteration"] for line in metrics.read_text().splitlines()]
    assert iterations == [1]
    assert (save_dir / "latest").read_text().strip() == "iter_0000001"


def test_the_kill_switch_stops_a_run_after_its_iteration_and_keeps_a_new_one_from_starting(tmp_path, corpus_cache_300):
    """BigScience's --kill-switch-path: `touch` the file and every run of the group saves and exits 0."""
    import pretrain_gpt
    from tests.reliability_helpers import TINY, metrics_records
    from training import exit_conditions

    switch = tmp_path / "kill-switch"
    check = exit_conditions.ExitConditions.check

    def touch_after_three(self, iteration):
        if iteration == 3:
            switch.touch()
        return check(self, iteration)

    common = TINY + ["--train-iters", "8", "--data-cache-dir", corpus_cache_300, "--save", str(tmp_path / "ck"),
                     "--kill-switch-path", str(switch)]
    exit_conditions.ExitConditions.check = touch_after_three
    try:
        assert pretrain_gpt.main(common + ["--metrics-file", str(tmp_path / "m.jsonl")]) == 0
    finally:
        exit_conditions.ExitConditions.check = check
    assert [r["iteration"] for r in metrics_records(tmp_path / "m.jsonl")] == [1, 2, 3]
    assert (tmp_path / "ck" / "latest").read_text().strip() == "iter_0000003"

    # The switch is still there: a new run (a requeued job) does not start.
    assert pretrain_gpt.main(common + ["--load", str(tmp_path / "ck"), "--metrics-file", str(tmp_path / "n.jsonl")]) == 0
    assert not (tmp_path / "n.jsonl").exists() or not metrics_records(tmp_path / "n.jsonl")
    assert (tmp_path / "ck" / "latest").read_text().strip() == "iter_0000003"
