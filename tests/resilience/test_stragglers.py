"""Stragglers (issue 69 item 4; Megatron-LM's --log-straggler, --straggler-minmax-count,
--disable-straggler-on-startup): each rank's compute time per log interval, its waits in collectives taken
out, and the N slowest and fastest ranks relative to the median in the line, the records and W&B's keys.

The acceptance run: two ranks, rank 1 slowed by half from outside (SIGSTOP for 75 ms of every 150 ms, from a
test thread): every record after the first names rank 1 the slowest, by more than 10% on average. (One interval
alone can come out near 1.05x on a loaded machine, where the other rank's compute also waits for a core.)
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from tests.resilience.test_peer_loss import launch_pair, stop_all, wait_for_exit


def test_the_extremes_are_relative_to_the_median_of_every_rank():
    from resilience.stragglers import format_stragglers, rank_extremes

    report = rank_extremes([1.0, 1.4, 0.9, 1.0], count=2)
    assert report == {"slowest": [{"rank": 1, "relative": 1.4}, {"rank": 0, "relative": 1.0}],
                      "fastest": [{"rank": 2, "relative": 0.9}, {"rank": 0, "relative": 1.0}]}
    assert format_stragglers(report) == ("slowest: rank 1 (1.40x), rank 0 (1.00x); fastest: rank 2 (0.90x), "
                                         "rank 0 (1.00x) (compute vs median)")
    assert rank_extremes([2.0], count=3) == {"slowest": [{"rank": 0, "relative": 1.0}],
                                             "fastest": [{"rank": 0, "relative": 1.0}]}


def test_the_report_takes_the_waits_out_and_wandb_gets_each_rank_as_a_key():
    from parallel.comm import Communicator
    from resilience.stragglers import StragglerReport
    from training.metrics import scalar_values

    report = StragglerReport(Communicator(), count=1)  # no process group: the world is this rank
    report.add(seconds=1.0, collective_wait_s=0.25)
    report.add(seconds=1.0, collective_wait_s=0.5)
    assert report.compute_s == pytest.approx(1.25)
    gathered = report.gather()
    assert gathered == {"slowest": [{"rank": 0, "relative": 1.0}], "fastest": [{"rank": 0, "relative": 1.0}]}
    assert report.compute_s == 0.0
    values = scalar_values({"iteration": 5, "straggler": gathered})
    assert values == {"train/straggler/slowest/0/rank": 0, "train/straggler/slowest/0/relative": 1.0,
                      "train/straggler/fastest/0/rank": 0, "train/straggler/fastest/0/relative": 1.0}


def slow_down(pid: int, stop: threading.Event, stopped_s: float = 0.075, period_s: float = 0.150) -> None:
    """Stop the process for `stopped_s` of every `period_s` (half its time) until `stop` is set."""
    import os

    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stopped_s)
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            return
        time.sleep(period_s - stopped_s)


@pytest.mark.slow
def test_a_rank_slowed_by_half_is_named_the_slowest(tmp_path, embedded_corpus):
    cache, _ = embedded_corpus
    # iterations of about a quarter second on two idle cores, so that an interval spans a dozen stops
    processes, files = launch_pair(tmp_path, cache, None, "--log-straggler", "--log-interval", "6",
                                   "--hidden-size", "256", "--seq-length", "64", "--max-position-embeddings", "64",
                                   train_iters=30)
    stop = threading.Event()
    slower = threading.Thread(target=slow_down, args=(processes[1].pid, stop), daemon=True)
    slower.start()
    try:
        codes = [wait_for_exit(process, 240)[0] for process in processes]
    finally:
        stop.set()
        slower.join()
        stop_all(processes, files)
    assert codes == [0, 0], (tmp_path / "rank0.err").read_text() + (tmp_path / "rank1.err").read_text()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    reports = [record["straggler"] for record in records if "straggler" in record]
    assert len(reports) == 5
    print([report["slowest"][0] for report in reports])
    for report in reports[1:]:  # the first interval holds each rank's start-up
        assert report["slowest"][0]["rank"] == 1 and report["slowest"][0]["relative"] > 1.0, reports
        assert report["fastest"][0]["rank"] == 0
    relatives = [report["slowest"][0]["relative"] for report in reports[1:]]
    assert sum(relatives) / len(relatives) > 1.1, reports
    assert "stragglers: slowest: rank 1 (" in (tmp_path / "rank0.out").read_text()


def test_the_flags_are_megatrons_and_a_report_disabled_on_startup_is_said_once():
    from arguments.config import ConfigError
    from arguments.parser import parse_arguments
    from resilience.stragglers import straggler_notes

    logging = parse_arguments(["--log-straggler", "--straggler-minmax-count", "2"]).config.logging
    assert (logging.log_straggler, logging.straggler_minmax_count, logging.disable_straggler_on_startup) == (True, 2,
                                                                                                             False)
    with pytest.raises(ConfigError, match="--straggler-minmax-count must be at least 1"):
        parse_arguments(["--straggler-minmax-count", "0"])
    assert straggler_notes(True, False) == [] and straggler_notes(False, True) == []
    assert "--straggler-ctrlr-port" in straggler_notes(True, True)[0]


@pytest.mark.slow
def test_the_recorder_and_the_straggler_report_change_no_loss(tmp_path, embedded_corpus):
    """Both observe the collectives and time them, nothing more: the losses of a two-rank run are bitwise
    those of the same run without them. The plain run is also test_peer_loss.py's normal launch: its heartbeat
    threads stop cleanly, status 0 and nothing on either rank's stderr."""
    cache, _ = embedded_corpus
    losses = {}
    for name, flags in (("plain", ()), ("observed", ("--log-straggler", "--flight-recorder-dump-path",
                                                     str(tmp_path / "flight") + "/"))):
        run_dir = tmp_path / name
        run_dir.mkdir()
        processes, files = launch_pair(run_dir, cache, None, *flags, train_iters=4)
        try:
            codes = [wait_for_exit(process, 240)[0] for process in processes]
        finally:
            stop_all(processes, files)
        assert codes == [0, 0], (run_dir / "rank0.err").read_text() + (run_dir / "rank1.err").read_text()
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [(record["iteration"], repr(record["loss"]), repr(record["grad_norm"])) for record in records
                        if "loss" in record]
        assert (run_dir / "rank0.err").read_text() == (run_dir / "rank1.err").read_text() == ""
    assert len(losses["plain"]) == 4 and losses["observed"] == losses["plain"]
    assert not (tmp_path / "flight" / "_dump_0.json").exists()  # nothing went wrong: no dump, no stacks file
    assert not (tmp_path / "flight" / "_dump_0.stacks").exists()
