"""Issue 69 item 7: --rerun-mode report_stats (resilience/rerun_stats.py), Megatron-Core's REPORT_DETERMINISM_STATS:
every iteration runs twice and the relative differences of the validated losses are reported every 2 iterations,
in Megatron's words, side by side with Megatron-Core's own machine and QuickStats (skipped without megatron-core),
and end to end: a real run re-runs each iteration and goes on with the plain run's losses bitwise.
"""

from __future__ import annotations

import copy
import logging
from functools import partial

import pytest

from resilience.rerun_state import RerunMode
from resilience.rerun_stats import QuickStats, report_stats
from tests.reliability_helpers import metrics_records, train
from tests.resilience.rerun_machines import (
    INF_CHECK,
    NAN_CHECK,
    drive_megatron,
    drive_ours,
    megatron_machine_of,
    megatron_rerun_module,
    our_machine,
)

STATS_LINE = "Stats on computation determinism in validation calls"


@pytest.mark.smoke
def test_quick_stats_summarize_the_differences_as_megatron_prints_them():
    stats = QuickStats()
    for difference in (0.0, 2e-3, 0.0, 1e-3):
        stats.record(difference)
    # 4 samples, 2 identical: the percentiles count the identical ones as the lowest
    assert stats.print_stats() == ("4/2 total/identical samples, rel. variability: avg= 7.500E-04, p50= 1.000E-03, "
                                   "p90= 2.000E-03, p99= 2.000E-03, p99.9= 2.000E-03, max: 2.000E-03")
    other = QuickStats()
    other.record(0.0)
    other.record(4e-3)
    stats.combine([other])
    assert stats.print_stats().startswith("6/3 total/identical samples") and stats.max == 4e-3
    empty = QuickStats()
    empty.record(0.0)
    assert empty.print_stats() == "1 samples, all identical"


def test_quick_stats_are_megatrons(monkeypatch):
    rsm = megatron_rerun_module(monkeypatch)
    samples = [0.0, 3e-7, 0.0, 1.5e-6, 2e-7, 0.0, 9e-8, 4e-6, 0.0, 1e-7, 6e-7]
    ours, theirs, ours_other, theirs_other = QuickStats(), rsm.QuickStats(), QuickStats(4), rsm.QuickStats(4)
    for sample in samples:
        ours.record(sample)
        theirs.record(sample)
        ours_other.record(sample * 3)
        theirs_other.record(sample * 3)
    assert ours.print_stats() == theirs.print_stats()
    assert ours_other.print_stats() == theirs_other.print_stats()  # a ring of 4: the oldest overwritten
    ours.combine([ours_other])
    theirs.combine([theirs_other])
    assert ours.print_stats() == theirs.print_stats()


LOSSES = [(5.0, 5.0), (4.9, 4.9001), (4.8, 4.8), (4.7, 4.70002), (4.6, 4.6)]  # (first run, re-run)


def megatron_lines_as_main_prints_them(rsm, monkeypatch, lines: list[str]) -> list[str]:
    """megatron-core 0.16.1's _maybe_report_stats names each validation by `caller.filename` and `caller.lineno`,
    which its Caller (message, rank) no longer has: its first report raises AttributeError. Megatron-LM's main
    (d98e8a6) prints "  From validation call '{caller.message}':". Given those two attributes (the message, 0), the
    0.16.1 machine runs, and its lines are read back in main's words."""
    import inspect
    if "caller.filename" not in inspect.getsource(rsm.RerunStateMachine._maybe_report_stats):
        return lines
    return [f"  From validation call '{line[len('  From '):-len(', line 0:')]}':" if line.endswith(", line 0:") else line
            for line in lines]


def with_call_sites(rsm, monkeypatch) -> None:
    class CallerWithSite(rsm.Caller):
        __slots__ = ()
        filename = property(lambda self: self.message)
        lineno = 0
    monkeypatch.setattr(rsm, "Caller", CallerWithSite)


def test_report_mode_re_runs_every_iteration_and_reports_as_megatron_cores_machine(monkeypatch, caplog):
    rsm = megatron_rerun_module(monkeypatch)
    with_call_sites(rsm, monkeypatch)
    theirs = megatron_machine_of(rsm, 0, "transient_error", mode="report_stats")
    theirs.current_iteration = 0  # Megatron-LM's train(): "Overwriting rerun_state_machine.current_iteration"
    with caplog.at_level(logging.INFO, logger=rsm.__name__):
        their_trace = drive_megatron(theirs, LOSSES, checks=(NAN_CHECK, INF_CHECK))
    their_lines = megatron_lines_as_main_prints_them(rsm, monkeypatch, [
        record.getMessage() for record in caplog.records if record.levelno == logging.INFO and record.name == rsm.__name__])
    ours = our_machine(0, "transient_error", mode=RerunMode.REPORT_DETERMINISM_STATS)
    our_trace = drive_ours(ours, LOSSES, checks=(NAN_CHECK, INF_CHECK))
    assert our_trace == their_trace == [(iteration, 2, False, False, 0) for iteration in range(1, 6)]
    assert ours.lines == their_lines
    assert ours.lines.count(STATS_LINE) == 2  # after iterations 2 and 4
    # by iteration 4: 4 iterations x 2 micro-batches per check, iterations 2 and 4 differing in both micro-batches
    assert ours.lines[-4] == f"  From validation call '{NAN_CHECK}':"
    assert ours.lines[-3].startswith("    8/4 total/identical samples, rel. variability: avg= ")


def test_every_ranks_records_are_combined_on_the_first():
    """Two ranks' records: the first prints the whole, the second forgets what it sent (Megatron's gather)."""
    first, second = {NAN_CHECK: QuickStats()}, {NAN_CHECK: QuickStats(), INF_CHECK: QuickStats()}
    first[NAN_CHECK].record(0.0)
    second[NAN_CHECK].record(1e-6)
    second[INF_CHECK].record(0.0)
    gathered = [first, copy.deepcopy(second)]  # what gather_object hands the first rank: pickled copies
    lines = []
    report_stats(second, lambda records: None, lines.append)  # not the first rank
    assert lines == [] and second[NAN_CHECK].print_stats() == "0 samples, all identical"
    report_stats(first, lambda records: gathered, lines.append)
    assert lines == [STATS_LINE, f"  From validation call '{NAN_CHECK}':",
                     "    2/1 total/identical samples, rel. variability: avg= 5.000E-07, p50= 1.000E-06, p90= 1.000E-06, "
                     "p99= 1.000E-06, p99.9= 1.000E-06, max: 1.000E-06",
                     f"  From validation call '{INF_CHECK}':", "    1 samples, all identical"]


# ---- end to end: pretrain_gpt on one CPU process ----------------------------------------------------------------

RUN = ["--train-iters", "4", "--global-batch-size", "4", "--hidden-dropout", "0.1", "--seed", "5"]


def test_report_stats_runs_every_iteration_twice_and_trains_as_the_plain_run(corpus_cache_300, tmp_path):
    launch = partial(train, corpus_cache_300)
    plain = launch(tmp_path / "plain", *RUN, "--rerun-mode", "disabled")
    assert plain.code == 0, plain.err[-2000:]
    reported = launch(tmp_path / "reported", *RUN, "--rerun-mode", "report_stats")
    assert reported.code == 0, reported.err[-2000:]
    assert "> rerun state machine: --rerun-mode report_stats (as given): every iteration runs twice" in reported.out
    lines = reported.out.splitlines()
    # iterations 2 and 4: 2 micro-batches an iteration, each re-run's loss bitwise its first run's (fp32 on a CPU,
    # the same micro-batches, the dropout streams restored)
    for check in (NAN_CHECK, INF_CHECK):
        at = [index for index, line in enumerate(lines) if line == f"  From validation call '{check}':"]
        assert [lines[index + 1] for index in at] == ["    4 samples, all identical", "    8 samples, all identical"]
    assert lines.count(STATS_LINE) == 2
    losses = [[r["loss"] for r in metrics_records(path / "metrics.jsonl") if "loss" in r]
              for path in (tmp_path / "plain", tmp_path / "reported")]
    assert len(losses[0]) == 4 and losses[0] == losses[1]


def test_nothing_validated_means_nothing_re_run_and_the_line_says_so(corpus_cache_300, tmp_path):
    outcome = train(corpus_cache_300, tmp_path, "--rerun-mode", "report_stats", "--no-check-for-nan-in-loss-and-grad")
    assert outcome.code == 0, outcome.err[-2000:]
    assert ("> rerun state machine: --rerun-mode report_stats (as given) with nothing validated "
            "(--no-check-for-nan-in-loss-and-grad, no --check-for-spiky-loss): no iteration re-runs") in outcome.out
    assert STATS_LINE not in outcome.out
