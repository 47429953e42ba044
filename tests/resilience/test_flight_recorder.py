"""A hang traced to its collective (issue 69 item 3; Megatron-LM's --flight-recorder-* flags, PyTorch's Flight
Recorder record): each rank's ring of collectives, the dump when the heartbeat watch fires, the one line
naming where each group's ranks stand, and `python -m rendezvous.flight_recorder DUMP_PATH`.

- the ring itself (rendezvous/collective_log.py) through the Communicator of a planned state: sequence numbers
  per group, wrap-around, the call site outside the door, the time inside collectives;
- the analysis on records of four ranks, one of them silent (the issue's MoE example);
- two ranks, rank 1 SIGSTOPped (tests/kill_rank.py): rank 0's line names rank 1 and each group's last
  collective within --heartbeat-timeout-seconds + 30 s, the dumps are there, the continued rank 1 dumps too,
  and the command re-reads them;
- rank 1 holding the GIL (a test-only hook: nvidia-resiliency-ext's lock_gil, without the injector): named
  the same way, and its own stacks are written anyway, by faulthandler's C thread.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.resilience.test_peer_loss import (
    CONTINUED_LINE,
    KILL_AT,
    launch_pair,
    stop_all,
    stopped,
    the_one_line,
    wait_for_exit,
)


def test_the_ring_numbers_each_groups_collectives_and_names_their_call_site():
    import torch

    from parallel.state import virtual_state
    from rendezvous.collective_log import CollectiveLog

    state = virtual_state(4, tensor_parallel_size=2)
    state.comm.log = log = CollectiveLog(capacity=3)
    tensor = torch.zeros(8, device="meta")
    for _ in range(2):
        state.comm.all_reduce(tensor, state.tensor_parallel_group, "tp")
    state.comm.all_gather(torch.zeros(8, device="meta"), torch.zeros(4, device="meta"), state.data_parallel_group, "dp")
    state.comm.all_reduce(tensor, state.tensor_parallel_group, "tp")
    state.comm.all_reduce(tensor, None, "tp")  # a group of one: no collective, no record
    records = log.to_records()
    assert [(r["kind"], r["group"], r["seq"], r["state"]) for r in records] == [
        ("all_reduce", "tp", 2, "completed"), ("all_gather", "dp", 1, "completed"), ("all_reduce", "tp", 3, "completed")]
    assert records[0]["site"].startswith("tests/resilience/test_flight_recorder.py:")
    assert records[0]["site"].endswith("in test_the_ring_numbers_each_groups_collectives_and_names_their_call_site")
    assert records[1]["bytes"] == 8 * 4
    assert log.count == 4 and log.take_wait_s() >= 0 and log.wait_s == 0
    assert log.last_per_group()["tp"]["completed"] == 3


def test_an_async_collective_completes_when_waited_for_and_counts_only_the_wait():
    from rendezvous.collective_log import CollectiveLog, RecordedWork

    ticks = iter([10.0, 15.0, 16.5])  # started at 10; wait() entered at 15, returned at 16.5
    log = CollectiveLog(capacity=2, clock=lambda: next(ticks))

    class Work:
        def wait(self):
            return True

    entry = log.start("reduce_scatter", "dp", None, 64)
    work = RecordedWork(Work(), log, entry)
    assert log.to_records()[0]["state"] == "started"
    assert work.wait() is True
    assert log.to_records()[0]["state"] == "completed"
    assert log.take_wait_s() == pytest.approx(1.5)


def summaries_of_an_ep_hang():
    """Ranks 0-2 entered all_to_all #411 of the EP group and wait; rank 3 has no record (silent)."""
    def rank(r):
        return {"rank": r, "iteration": 7, "members": {"ep": [0, 1, 2, 3], "dp": [r]},
                "groups": {"ep": {"completed": 410, "last": {"seq": 411, "kind": "all_to_all", "state": "started",
                                                             "site": "gpt/moe/token_dispatch.py:88 in dispatch"}},
                           "dp": {"completed": 30, "last": {"seq": 30, "kind": "all_reduce", "state": "completed",
                                                            "site": "x"}}}}
    return {r: rank(r) for r in range(3)}


def test_the_analysis_names_who_waits_where_and_what_the_silent_rank_last_completed():
    from rendezvous.flight_recorder import analyze

    assert analyze(summaries_of_an_ep_hang(), 4, silent=[3]) == (
        "rank 3 silent (no record); ep group (0-3): ranks 0-2 wait in all_to_all #411 (gpt/moe/token_dispatch.py:88 "
        "in dispatch), rank 3 last completed #410 or later (its peers completed it; no record of its own)")


def test_the_command_re_reads_the_dumps(tmp_path):
    from rendezvous.collective_log import CollectiveLog
    from rendezvous.flight_recorder import FlightRecorderSettings, write_dump

    settings = FlightRecorderSettings(dump_path=str(tmp_path) + "/")
    for rank in range(2):
        log = CollectiveLog(4)
        log.members["dp"] = (0, 1)
        log.complete(log.start("all_reduce", "dp", None, 8))
        if rank == 0:
            log.start("all_reduce", "dp", None, 8)  # rank 0 entered #2; rank 1 never did
        write_dump(log, settings, rank, 2, iteration=3, reason="test")
    assert json.loads((tmp_path / "_dump_0.json").read_text())["entries"][0]["seq"] == 2  # only the active one
    assert "most recent call first" in (tmp_path / "_dump_1.stacks").read_text()
    result = subprocess.run([sys.executable, "-m", "rendezvous.flight_recorder", str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].startswith(
        "dp group (0-1): rank 1 last completed all_reduce #1, rank 0 waits in all_reduce #2 (")


def test_megatrons_flags_export_pytorchs_flight_recorder_variables(tmp_path):
    from rendezvous.flight_recorder import FlightRecorderSettings, torch_environment

    environ = {"TORCH_INCLUDE_STACK_TRACE": "1"}
    kept = torch_environment(FlightRecorderSettings(dump_path=str(tmp_path), trace_buffer_size=77,
                                                    dump_on_timeout=False), environ)
    assert kept == ["TORCH_INCLUDE_STACK_TRACE"]  # megatron/training/initialize.py: a set variable wins
    assert environ["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "_dump_")  # a directory: Megatron's prefix
    assert environ["TORCH_FR_BUFFER_SIZE"] == "77" and environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    assert torch_environment(FlightRecorderSettings(), environ := {}) == [] and environ == {}


LINE = (r"pretrain_gpt\.py: error: rank 1 stopped answering \(died or hung\) during \w+ on the \w+ group at iteration "
        rf"{KILL_AT + 1}; this rank \(0\) stops too; flight recorder: rank 1 silent \(no record\); "
        r"(\w+) group \(0-1\): rank 0 waits in (\w+) #(\d+) \((\S+):\d+ in \w+\), rank 1 last completed #(\d+) or later "
        r".*\(dumps: .*_dump_<rank>\.json and \.stacks\)")


def run_with_rank_one(tmp_path, corpus, fault: str):
    cache, _ = corpus
    dump = tmp_path / "flight"
    processes, files = launch_pair(tmp_path, cache, {"KILL_RANK": "1", "KILL_SIGNAL": fault},
                                   "--heartbeat-timeout-seconds", "6", "--flight-recorder-dump-path", f"{dump}/")
    return processes, files, dump


def wait_until_stopped(processes, tmp_path) -> float:
    deadline = time.monotonic() + 240
    while not stopped(processes[1]):
        assert processes[1].poll() is None, (tmp_path / "rank1.err").read_text()
        assert time.monotonic() < deadline, "rank 1 never stopped itself"
        time.sleep(0.05)
    return time.monotonic()


@pytest.mark.slow
def test_a_stopped_rank_is_traced_to_its_collective_and_every_rank_dumps(tmp_path, embedded_corpus):
    processes, files, dump = run_with_rank_one(tmp_path, embedded_corpus, "SIGSTOP")
    try:
        stopped_at = wait_until_stopped(processes, tmp_path)
        code, exited_at = wait_for_exit(processes[0], 120)
        still_stopped = stopped(processes[1])  # rank 0 must not wait for it to go
        processes[1].send_signal(signal.SIGCONT)  # it finds it did not run, and dumps its own ring
        continued_code, _ = wait_for_exit(processes[1], 60)
    finally:
        stop_all(processes, files)
    line = the_one_line(tmp_path, 0)
    assert code == 3 and continued_code == 3, line
    match = re.fullmatch(LINE, line)
    assert match, line
    group, kind, seq, site, completed = match.groups()
    assert int(completed) == int(seq) - 1 and not site.startswith("parallel/")  # the caller, not the door
    print(f"stop to rank 0's line: {exited_at - stopped_at:.1f} s")
    # test_peer_loss.py's checks of a stopped rank 1 (its stopped-rank tests stop rank 0): named within the heartbeat
    # timeout (the watch counts from its last beat, up to a second earlier), while it is still stopped
    assert still_stopped and 4.5 <= exited_at - stopped_at < 6 + 30
    assert {path.name for path in dump.iterdir()} >= {"_dump_0.json", "_dump_0.stacks", "_dump_1.json",
                                                     "_dump_1.stacks"}
    dumped = json.loads((dump / "_dump_0.json").read_text())
    assert dumped["entries"] and all(entry["state"] == "started" for entry in dumped["entries"])
    assert "in _heartbeat" in (dump / "_dump_0.stacks").read_text()  # every thread, not only the main one
    continued = (tmp_path / "rank1.err").read_text()  # rank 1 says where it was when it was stopped
    assert re.fullmatch(CONTINUED_LINE.format(rank=1) + "; flight recorder: .*", the_one_line(tmp_path, 1)), continued
    assert re.search(rf"flight recorder: {group} group \(0-1\): this rank last completed \w+ #{completed}[;( ]",
                     continued), continued
    result = subprocess.run([sys.executable, "-m", "rendezvous.flight_recorder", str(dump)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("flight recorder: 2 of 2 ranks dumped"), result
    print(result.stdout)


@pytest.mark.slow
def test_a_rank_holding_the_gil_is_named_and_still_writes_its_stacks(tmp_path, embedded_corpus):
    processes, files, dump = run_with_rank_one(tmp_path, embedded_corpus, "hold_gil")
    try:
        code, _ = wait_for_exit(processes[0], 240)
        deadline = time.monotonic() + 30  # faulthandler's C thread fires --heartbeat-timeout-seconds after the hold
        while "check_then_die" not in ((dump / "_dump_1.stacks").read_text() if (dump / "_dump_1.stacks").exists()
                                       else ""):
            assert time.monotonic() < deadline, "rank 1 wrote no stacks"
            time.sleep(0.2)
        assert processes[1].poll() is None  # still spinning with the GIL
    finally:
        stop_all(processes, files)
    line = the_one_line(tmp_path, 0)
    assert code == 3 and re.fullmatch(LINE, line), line
    stacks = (dump / "_dump_1.stacks").read_text()
    assert stacks.startswith("Timeout (0:00:06)!") and "tests/kill_rank.py" in stacks


def test_a_ring_of_size_zero_keeps_only_the_wait_clock_and_a_negative_size_is_refused():
    from arguments.config import ConfigError
    from arguments.parser import parse_arguments
    from rendezvous.collective_log import CollectiveLog

    log = CollectiveLog(capacity=0, clock=iter([1.0, 3.0]).__next__)
    log.complete(log.start("all_reduce", "dp", None, 8))
    assert log.to_records() == [] and log.take_wait_s() == 2.0 and log.sequence == {"dp": 1}
    with pytest.raises(ConfigError, match="--flight-recorder-trace-buffer-size must be 0"):
        parse_arguments(["--flight-recorder-trace-buffer-size", "-1"])


def test_pipeline_messages_are_numbered_per_peer_and_a_message_not_waited_for_is_named():
    import torch

    from parallel.comm import DryRunCommunicator
    from rendezvous.collective_log import CollectiveLog
    from rendezvous.flight_recorder import analyze, summary

    comm = DryRunCommunicator(rank=1)
    comm.log = CollectiveLog(capacity=8)
    tensor = torch.zeros(4)
    for work in comm.receive(tensor, peer=0, tag=0) + comm.send(tensor, peer=2, tag=0):
        work.wait()
    comm.receive(tensor, peer=0, tag=0)  # posted, never completed: this stage waits for stage 0
    records = comm.log.to_records()
    assert [(r["kind"], r["seq"], r["state"]) for r in records] == [
        ("recv from 0", 1, "completed"), ("send to 2", 1, "completed"), ("recv from 0", 2, "started")]
    assert comm.log.last_per_group() == {}  # messages are not the pp group's collectives
    line = analyze({1: summary(comm.log, 1, iteration=4)}, world_size=3, silent=[0])
    assert line.startswith("rank 0 silent (no record); rank 1 waits in recv from 0 #2 of the pp group (tests/resilience/"
                           "test_flight_recorder.py:"), line


def test_pytorchs_dump_path_variable_turns_the_recorder_on_as_in_megatron():
    from rendezvous.flight_recorder import FlightRecorderSettings, with_environment_path

    settings, said = with_environment_path(FlightRecorderSettings(), {"TORCH_FR_DUMP_TEMP_FILE": "/tmp/fr_rank_"})
    assert settings.on and settings.dump_path == "/tmp/fr_rank_" and "TORCH_FR_DUMP_TEMP_FILE" in said[0]
    assert with_environment_path(FlightRecorderSettings(), {}) == (FlightRecorderSettings(), [])
    flag = FlightRecorderSettings(dump_path="/runs/fr/")
    assert with_environment_path(flag, {"TORCH_FR_DUMP_TEMP_FILE": "/x"}) == (flag, [])  # the flag's path is ours


@pytest.mark.slow
def test_a_collective_timeout_with_every_rank_alive_says_where_each_stands(tmp_path, embedded_corpus):
    """Rank 1 sleeps outside any collective, its heartbeat beating, so only rank 0's collective timeout (15 s)
    ends the run: rank 0 prints where each rank stands above its traceback, and rank 1, told that rank 0
    exited, reads rank 0's shared record and names the collective rank 0 was in."""
    cache, _ = embedded_corpus
    dump = tmp_path / "flight"
    processes, files = launch_pair(tmp_path, cache, {"KILL_RANK": "1", "KILL_SIGNAL": "sleep", "SLEEP_S": "120"},
                                   "--distributed-timeout-minutes", "0.25", "--flight-recorder-dump-path", f"{dump}/")
    try:
        failed_code, _ = wait_for_exit(processes[0], 240)
        code, _ = wait_for_exit(processes[1], 60)
    finally:
        stop_all(processes, files)
    first = (tmp_path / "rank0.err").read_text().splitlines()[0]
    assert failed_code == 1 and re.fullmatch(
        r"pretrain_gpt\.py: flight recorder: rank 1 alive but shared no record \(stuck outside a collective\? see its "
        r"stacks\); dp group \(0-1\): rank 0 waits in reduce_scatter #(\d+) \(zero/[^)]+\), rank 1 last completed "
        r"#\d+ or later .*", first), first
    line = the_one_line(tmp_path, 1)
    assert code == 3 and re.search(r"flight recorder: dp group \(0-1\): rank 1 last completed all_reduce #\d+, "
                                   r"rank 0 waits in reduce_scatter #\d+", line), line
    assert "check_then_die" in (dump / "_dump_1.stacks").read_text()  # where rank 1 was: its sleep


def test_a_dump_path_that_cannot_be_written_is_said_before_any_work(tmp_path):
    from parallel.comm import Communicator
    from rendezvous.flight_recorder import FlightRecorderSettings, check_dump_path, start_flight_recorder

    with pytest.raises(NotADirectoryError, match=r"--flight-recorder-dump-path .*missing/fr_: .*missing is not a "
                                                 r"writable directory"):
        check_dump_path(str(tmp_path / "missing" / "fr_"))
    check_dump_path(str(tmp_path / "made" / "deeper") + "/")  # a directory path is made
    recorder = start_flight_recorder(FlightRecorderSettings(dump_path=str(tmp_path / "run_")), Communicator(), 0, 1,
                                     stack_timeout_s=0)
    assert recorder.log.capacity == 2000 and recorder.stack_watch is None
