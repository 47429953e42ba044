"""Issue 69 item 7: Megatron-Core's rerun state machine (megatron/core/rerun_state_machine.py) in
resilience/rerun_state.py, driven by the data-parallel step (training/train_step.py).

- side by side with Megatron-Core's own RerunStateMachine (megatron-core, requirements-bench.txt; skipped when it
  is not importable): the same losses and injected errors give the same re-runs, checkpoints and exit codes;
- each --error-injection-type ends a real run as Megatron-Core ends it: transient on a fatal (NaN/Inf) check:
  exit 17; persistent and correct_result: a checkpoint of the iteration before and exit 16; on a non-fatal check
  (--check-for-spiky-loss) training goes on, and its losses equal the plain run's bitwise (the re-run replays the
  same micro-batches from the same RNG states, dropout on);
- a Megatron launch takes Megatron's default mode (validate_results) and says so in one start-up line, a preset
  launch is disabled.
The resumed job's second re-run: tests/resilience/test_rerun_resume.py; --rerun-mode report_stats:
tests/resilience/test_rerun_stats.py.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from arguments.parser import parse_arguments
from base.errors import ConfigError
from resilience.rerun_state import (
    EXIT_CODE_FAILED_ON_RESULT_VALIDATION,
    EXIT_CODE_RESUME_TO_DISAMBIGUATE,
    iterations_megatron_skips,
)
from tests.forked_runs import logged_iterations
from tests.reliability_helpers import TINY, metrics_records, train
from tests.resilience.rerun_machines import (
    NAN_CHECK,
    drive_megatron,
    drive_ours,
    megatron_machine_of,
    megatron_rerun_module,
    our_machine,
)
from training.late_checks import LATE_CHECKS

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def megatron_machine(monkeypatch):
    """Megatron-Core's RerunStateMachine on a CPU, one process (tests/resilience/rerun_machines.py)."""
    rsm = megatron_rerun_module(monkeypatch)
    return rsm, partial(megatron_machine_of, rsm)


def megatron_checkpoint_on_17(rsm) -> bool:
    """megatron-core 0.16.1 saves a checkpoint before its exit 17 after an in-place re-run; Megatron-LM's main (and
    resilience/rerun_state.py) does not (`return False, True, EXIT_CODE_FAILED_ON_RESULT_VALIDATION`)."""
    import inspect
    return "A checkpoint at the last iteration is being saved" in inspect.getsource(rsm.RerunStateMachine)


@pytest.mark.parametrize("kind", ["transient_error", "persistent_error", "correct_result"])
@pytest.mark.parametrize("fatal", [True, False])
def test_the_same_injected_errors_end_as_megatron_cores_machine_ends_them(megatron_machine, kind, fatal):
    rsm, make = megatron_machine
    losses = [5.0, 4.9, 4.8, 4.7, 4.6, 4.5, 4.4, 4.3]
    random.seed(3)
    theirs = drive_megatron(make(3, kind), losses, fatal)
    random.seed(3)
    ours = drive_ours(our_machine(3, kind), losses, fatal)
    if megatron_checkpoint_on_17(rsm):
        theirs = [(i, runs, False if code == 17 else ckpt, ex, code) for i, runs, ckpt, ex, code in theirs]
    assert ours == theirs
    assert any(runs == 2 for _, runs, *_ in ours)  # an error was injected and the iteration re-run
    end = ours[-1]
    if not fatal:  # a non-fatal check never ends the job: training goes on
        assert end[2:] == (False, False, 0) and len(ours) == len(losses)
    elif kind == "transient_error":  # not reproduced on a fatal check: validation failed
        assert end[2:] == (False, True, EXIT_CODE_FAILED_ON_RESULT_VALIDATION)
    else:  # reproduced: a checkpoint, to re-run it on another GPU
        assert end[2:] == (True, True, EXIT_CODE_RESUME_TO_DISAMBIGUATE)


def test_a_real_nan_and_a_real_spike_are_judged_as_megatron_judges_them(megatron_machine):
    rsm, make = megatron_machine
    nan_losses = [5.0, 4.9, math.nan]
    assert drive_ours(our_machine(0, "transient_error"), nan_losses, True) \
        == drive_megatron(make(0, "transient_error"), nan_losses, True) == [
            (1, 1, False, False, 0), (2, 1, False, False, 0), (3, 2, True, True, EXIT_CODE_RESUME_TO_DISAMBIGUATE)]
    spiky = [5.0, 4.0, 4.5, 60.0, 4.2]  # the first 2 set the maximum (5.0); 60 >= 10 x 5 is a spike
    assert drive_ours(our_machine(0, "transient_error"), spiky, False, spike_samples=2) \
        == drive_megatron(make(0, "transient_error"), spiky, False, spike_samples=2) == [
            (1, 1, False, False, 0), (2, 1, False, False, 0), (3, 1, False, False, 0), (4, 2, False, False, 0),
            (5, 1, False, False, 0)]


def test_the_tracker_file_holds_megatrons_lines_its_own_parser_reads(tmp_path, megatron_machine):
    rsm, _ = megatron_machine
    tracker = tmp_path / "rejected.txt"
    drive_ours(our_machine(0, "transient_error", tracker=str(tracker)), [5.0, math.nan], True)
    statuses = [line.split(" status=")[1].split(" ")[0] for line in tracker.read_text().splitlines()]
    assert statuses == ["initial_run", "first_rerun_reproducible"]
    drive_ours(our_machine(0, "transient_error", tracker=str(tracker)), [5.0, math.nan], True)  # the resumed job
    # Megatron-LM's arguments.py: the iterations its parser finds reproducible twice on a rank are skipped
    assert rsm.RerunStateMachine.get_skipped_iterations_from_tracker_file(str(tracker)) == [2]
    assert iterations_megatron_skips(str(tracker)) == [2]
    # skipping is not implemented here: such a file is refused before any work, naming the flag
    with pytest.raises(ConfigError, match="--result-rejected-tracker-filename .*would skip iterations 2"):
        parse_arguments(["--device", "cpu", "--result-rejected-tracker-filename", str(tracker)],
                        late_checks=LATE_CHECKS)


# ---- end to end: pretrain_gpt on one CPU process ----------------------------------------------------------------

RUN = ["--train-iters", "4", "--global-batch-size", "4", "--hidden-dropout", "0.1", "--seed", "5",
       "--rerun-mode", "validate_results", "--error-injection-rate", "1"]


def test_transient_on_the_nan_check_exits_17_before_the_update(corpus_cache_300, tmp_path):
    cache = corpus_cache_300
    outcome = train(cache, tmp_path, *RUN, "--error-injection-type", "transient_error")
    assert outcome.code == EXIT_CODE_FAILED_ON_RESULT_VALIDATION, outcome.err[-2000:]
    for line in ("Injecting error type Transient error", "Need to rerun step to check reproducibility",
                 "iteration #2: Possible transient error!", "Exiting now. The job can be resumed from a previous"):
        assert line in outcome.out, line
    assert [r["iteration"] for r in metrics_records(tmp_path / "metrics.jsonl") if "loss" in r] == [1]


def test_persistent_saves_the_iteration_before_and_exits_16(corpus_cache_300, tmp_path):
    cache = corpus_cache_300
    outcome = train(cache, tmp_path, *RUN, "--error-injection-type", "persistent_error", "--save", tmp_path / "ckpt")
    assert outcome.code == EXIT_CODE_RESUME_TO_DISAMBIGUATE, outcome.err[-2000:]
    assert "Need to rerun on a different GPU to verify correctness" in outcome.out
    assert "Saving a checkpoint and exiting now" in outcome.out
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "1"


def test_a_non_fatal_rerun_goes_on_with_the_plain_runs_losses_bitwise(corpus_cache_300, tmp_path):
    cache = corpus_cache_300
    plain = train(cache, tmp_path / "plain", *RUN[:8], "--rerun-mode", "disabled")
    assert plain.code == 0, plain.err[-2000:]
    rerun = train(cache, tmp_path / "rerun", *RUN, "--no-check-for-nan-in-loss-and-grad", "--check-for-spiky-loss",
                  "--result-rejected-tracker-filename", tmp_path / "rejected.txt")
    assert rerun.code == 0, rerun.err[-2000:]
    assert rerun.out.count("Possible transient error!") == 3  # iterations 2-4, each re-run once (1 is never checked)
    assert "Continuing normal execution because failed validation was not fatal" in rerun.out
    losses = [[r["loss"] for r in metrics_records(path / "metrics.jsonl") if "loss" in r]
              for path in (tmp_path / "plain", tmp_path / "rerun")]
    assert len(losses[0]) == 4 and losses[0] == losses[1]  # dropout 0.1: the RNG states were restored
    assert (tmp_path / "rejected.txt").read_text().count("status=first_rerun_not_reproducible") == 3


def test_the_defaults_are_megatrons_in_a_megatron_launch_and_the_start_up_line_says_so(corpus_cache_300, tmp_path):
    # Megatron-LM's RerunStateMachineConfig: rerun_mode "validate_results", check_for_nan_in_loss True; a launch
    # that sets the model by flags takes Megatron's defaults (arguments/megatron/defaults.py), a preset ours
    assert parse_arguments(TINY).config.training.faults.rerun_mode == "validate_results"
    training = parse_arguments(["--device", "cpu"]).config.training
    assert (training.faults.rerun_mode, training.faults.check_for_nan_in_loss_and_grad, training.faults.error_injection_rate) == \
        ("disabled", True, 0)
    outcome = train(corpus_cache_300, tmp_path, "--train-iters", "1")
    assert outcome.code == 0, outcome.err[-2000:]
    assert ("> rerun state machine: --rerun-mode validate_results (Megatron-LM's default for a flags launch; a NaN or "
            "Inf loss re-runs the iteration on the same data: exit 17 when the re-run differs, a checkpoint and exit 16 "
            "when it reproduces; --rerun-mode disabled turns it off)") in outcome.out.splitlines()
    assert "Result validation enabled" in outcome.out  # Megatron's own words, which its functional tests look for


@pytest.mark.slow
def test_two_pipeline_stages_re_run_together_and_go_on_with_the_plain_runs_losses(corpus_cache_300, tmp_path):
    """Two ranks, PP 2: only the last stage validates its loss (Megatron's loss_func runs there), the verdict is
    all-reduced, and both stages re-run the iteration from the same batches and RNG states. With --rerun-mode
    report_stats every iteration re-runs, and the first rank (the first stage: it validates nothing) prints the
    records the last stage's rank sent it (resilience/rerun_stats.py, Megatron's gather_object)."""
    losses = []
    runs = (("plain", ["--rerun-mode", "disabled"]),
            ("rerun", RUN[8:] + ["--no-check-for-nan-in-loss-and-grad", "--check-for-spiky-loss"]),
            ("report", ["--rerun-mode", "report_stats"]))
    for name, flags in runs:
        argv = [*TINY, "--num-layers", "2", "--pipeline-model-parallel-size", "2", *RUN[:8], "--data-cache-dir",
                corpus_cache_300, *flags]
        if name == "plain":  # only the losses to go on with: its two ranks forked (tests/forked_runs.py)
            logged_iterations(tmp_path, name, argv, 2)
            losses.append([r["loss"] for r in metrics_records(tmp_path / f"{name}.jsonl") if "loss" in r])
            continue
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   str(REPO / "pretrain_gpt.py"), *argv, "--metrics-file", str(tmp_path / f"{name}.jsonl")]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
        assert done.returncode == 0, done.stderr[-3000:]
        losses.append([r["loss"] for r in metrics_records(tmp_path / f"{name}.jsonl") if "loss" in r])
        if name == "rerun":
            assert done.stdout.count("Need to rerun step to check reproducibility") == 3, done.stdout[-3000:]
        if name == "report":  # iterations 2 and 4, 2 micro-batches each, NaN and Inf checks
            lines = done.stdout.splitlines()
            assert [line.strip() for line in lines if "samples, all identical" in line] == \
                ["4 samples, all identical"] * 2 + ["8 samples, all identical"] * 2, done.stdout[-3000:]
    assert len(losses[0]) == 4 and losses[0] == losses[1] == losses[2]


def test_a_run_the_fp8_guard_discards_is_forgotten_and_the_run_that_stands_is_judged():
    """--fp8-guard runs an iteration's micro-batches again where an FP8 layer failed (training/fp8_guard_replay.py):
    a NaN its first run met (the FP8 layer's doing) asks for no re-run once that run is discarded, and the run that
    stands is validated as the first (its calls counted from 1)."""
    machine = our_machine(0, "transient_error")
    drive_ours(machine, [1.0])  # iteration 1 is never validated
    assert machine.should_run_forward_backward(2, None)
    machine.validate_result(math.nan, math.isnan, NAN_CHECK)
    assert machine.rerun_requested and machine.validation_counts == {NAN_CHECK: 1}
    machine.discard_run()
    machine.validate_result(2.0, math.isnan, NAN_CHECK)
    assert not machine.rerun_requested and machine.validation_counts == {NAN_CHECK: 1}
    assert not machine.should_run_forward_backward(2, None)  # no re-run: the iteration stands
    assert machine.should_checkpoint_and_exit() == (False, False, 0)
