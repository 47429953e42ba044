"""Issue 69, item 6: --inprocess-restart (resilience/inprocess_restart.py), Megatron-LM's in-process restart
(megatron/training/inprocess_restart.py over nvidia-resiliency-ext's inprocess.Wrapper) on gloo.

The two runs of 12 iterations that save every 2 (tests/scripts/test_restart_in_job.py's model and flags) lose a
rank after iteration 5 and end with every loss equal to the uninterrupted 2-rank run's, in the processes they
started with: the fault injector's exception on rank 1 under scripts/launch.py (torchrun), and a SIGKILLed rank 1
with a hot spare
(3 processes, --inprocess-active-world-size 2) launched as SLURM's srun does, one process per rank (torchrun's
agent would stop every worker once one died)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from arguments.parser import parse_arguments
from base.errors import ConfigError
from rendezvous.rank_assignment import TooFewProcesses, first_assignment, reassign
from tests.scripts.test_restart_in_job import (
    REPO,
    TWELVE,
    finish,
    free_port,
    launch_environment,
    losses,
    start,
    uninterrupted_losses,
)

FAST_HEARTBEATS = ["--inprocess-restart", "--inprocess-heartbeat-interval", "0.25", "--inprocess-heartbeat-timeout",
                   "2", "--inprocess-granularity", "rank"]
INCARNATION = re.compile(r"^> in-process incarnation (\d+): launch rank (\d+) \(pid (\d+)\) (.*)$", re.M)


def test_spares_wait_and_one_takes_a_dead_ranks_index_as_nvidia_resiliency_exts_tree_assigns():
    """rank_assignment.Tree with one RESERVE layer of --inprocess-active-world-size ranks: the highest spare
    left replaces the lowest terminated index first; the others keep their index; too few left ends the job."""
    first = first_assignment(4, 2)
    assert first.active_ranks == {0: 0, 1: 1, 2: None, 3: None}
    after = reassign(first, [1])
    assert after.active_ranks == {0: 0, 2: None, 3: 1}
    assert reassign(after, [0]).active_ranks == {2: 0, 3: 1}
    with pytest.raises(TooFewProcesses):
        reassign(reassign(after, [0]), [3])
    assert reassign(first, [3]).active_ranks == {0: 0, 1: 1, 2: None}  # a spare gone: nobody moves
    assert reassign(first_assignment(2, 2), []).active_ranks == {0: 0, 1: 1}  # an exception: the same ranks again


def test_inprocess_flags_are_settings_and_bad_values_are_one_line():
    config = parse_arguments(["--inprocess-restart", "--inprocess-active-world-size", "2", "--inprocess-max-iterations",
                              "3", "--device", "cpu"]).config.training.faults
    assert (config.inprocess_restart, config.inprocess_active_world_size, config.inprocess_max_iterations) == (True, 2, 3)
    with pytest.raises(ConfigError, match="--inprocess-heartbeat-timeout .* must be longer"):
        parse_arguments(["--inprocess-heartbeat-interval", "5", "--inprocess-heartbeat-timeout", "5"])
    with pytest.raises(ConfigError, match="--inprocess-active-world-size must be at least 1"):
        parse_arguments(["--inprocess-active-world-size", "0"])


@pytest.fixture(scope="module")
def uninterrupted(corpus_cache, tmp_path_factory) -> dict[int, float]:
    """test_restart_in_job.py's run to resume to (the in-process restarts resume the same run)."""
    return uninterrupted_losses(corpus_cache, tmp_path_factory.mktemp("uninterrupted"))


def incarnations(out: str) -> dict[int, set[tuple[int, int]]]:
    """launch rank -> {(incarnation, pid)} from each process's line at the start of each incarnation."""
    found: dict[int, set[tuple[int, int]]] = {}
    for incarnation, launch, pid, _ in INCARNATION.findall(out):
        found.setdefault(int(launch), set()).add((int(incarnation), int(pid)))
    return found


@pytest.mark.slow
def test_an_exception_on_rank_1_restarts_in_the_same_processes_with_equal_losses(corpus_cache, uninterrupted,
                                                                                tmp_path):
    """The fault injector's workload_exc on rank 1, armed after the step at which Megatron's 0-based count is 3
    (logged iteration 4) with no delay, raised where the loop polls after iteration 5. Each incarnation plans
    its faults again, as Megatron-LM's train() does; the restarted one resumes at iteration 4, past the arming
    step, so the fault comes once."""
    injector = ["--fault-injector-ranks", "1", "--fault-injector-fault-types", "workload_exc",
                "--fault-injector-fault-delay", "0", "--fault-injector-delay-start-iteration", "3",
                "--fault-injector-seed", "1"]
    code, out, err = finish(start(tmp_path, corpus_cache, [], [*FAST_HEARTBEATS, *injector]), tmp_path)
    assert code == 0, (err[-3000:], out[-3000:])
    assert losses(tmp_path / "metrics.jsonl") == uninterrupted
    seen = incarnations(out)
    for launch in (0, 1):  # each launch rank ran both incarnations in one process
        assert {incarnation for incarnation, _ in seen[launch]} == {0, 1}, out[-3000:]
        assert len({pid for _, pid in seen[launch]}) == 1, seen
    cause = [line for line in err.splitlines() if "in-process restart 1:" in line]
    assert cause == ["pretrain_gpt.py: in-process restart 1: rank 1 failed at iteration 5 with InjectedFault: fault "
                     "injector: workload_exc raised after iteration 5 (--fault-injector-fault-types); every process "
                     "stays, resuming from the checkpoint at iteration 4 in --load"], err[-3000:]
    assert_recovered(out, 4)


def assert_recovered(out: str, resumed: int) -> None:
    # "1 of 9": at most 10 incarnations by default (resilience/inprocess_restart.py)
    recovered = [line for line in out.splitlines() if line.startswith("> recovered (in-process restart 1 of 9)")]
    assert len(recovered) == 1, out[-3000:]
    assert f"this one resumed from the checkpoint at iteration {resumed}: iteration" in recovered[0], recovered


@pytest.mark.slow
def test_a_sigkilled_rank_is_replaced_by_the_hot_spare_and_the_losses_equal(corpus_cache, uninterrupted, tmp_path):
    """3 processes, --inprocess-active-world-size 2: launch rank 2 waits; launch rank 1 SIGKILLed once iteration 5
    is in the metrics; launch rank 2 becomes rank 1 and the run resumes from iteration 4's checkpoint."""
    port = free_port()
    base = {**launch_environment(), "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    flags = [*TWELVE, "--data-cache-dir", corpus_cache, "--save", tmp_path / "ck", "--load", tmp_path / "ck",
             "--metrics-file", tmp_path / "metrics.jsonl", *FAST_HEARTBEATS, "--inprocess-active-world-size", "2"]
    processes = [subprocess.Popen([sys.executable, str(REPO / "pretrain_gpt.py"), *map(str, flags)], cwd=tmp_path,
                                  env={**base, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                  stdout=open(tmp_path / f"out{rank}", "w"), stderr=open(tmp_path / f"err{rank}", "w"))
                 for rank in range(3)]
    try:
        deadline = time.monotonic() + 120
        while not ((tmp_path / "metrics.jsonl").exists() and 5 in losses(tmp_path / "metrics.jsonl")):
            assert time.monotonic() < deadline and processes[1].poll() is None, "iteration 5 never came"
            time.sleep(0.02)
        processes[1].send_signal(signal.SIGKILL)
        codes = [process.wait(timeout=120) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    outs = [(tmp_path / f"out{rank}").read_text() for rank in range(3)]
    errs = [(tmp_path / f"err{rank}").read_text() for rank in range(3)]
    assert codes == [0, -signal.SIGKILL, 0], (codes, errs)
    assert losses(tmp_path / "metrics.jsonl") == uninterrupted
    spare = incarnations(outs[2])[2]
    assert spare == {(0, processes[2].pid), (1, processes[2].pid)}, outs[2][-2000:]
    assert "> in-process incarnation 0: launch rank 2" in outs[2] and "waits as a spare" in outs[2]
    assert f"> in-process incarnation 1: launch rank 2 (pid {processes[2].pid}) trains as rank 1 of 2" in outs[2]
    assert incarnations(outs[0])[0] == {(0, processes[0].pid), (1, processes[0].pid)}
    # the kill lands after iteration 5 (or 6, where rank 1 was a step ahead of rank 0's metrics), before or in the
    # save at 6 (tests/scripts/test_restart_in_job.py, assert_recovery_said)
    resumed = 6 if "resuming after iteration 6" in outs[0] else 4
    cause = [line for line in errs[0].splitlines() if "in-process restart 1:" in line]
    assert len(cause) == 1 and "rank 1 (launch rank 1) is gone: no heartbeat within --inprocess-heartbeat-timeout; " \
        f"launch rank 2 (a spare) becomes rank 1; every process stays, resuming from the checkpoint at iteration " \
        f"{resumed}" in cause[0], errs[0][-3000:]
    assert_recovered(outs[0], resumed)


@pytest.mark.slow
def test_inprocess_max_iterations_bounds_the_restarts(corpus_cache, tmp_path):
    """One process whose every incarnation fails at iteration 3 (tests/kill_rank.py, not once): two incarnations
    with --inprocess-max-iterations 2, then one line and exit 3 (RestartsExhausted, a PeerLostError)."""
    environment = {**launch_environment(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(free_port()), "KILL_AT_ITERATION": "3", "KILL_RANK": "0", "KILL_SIGNAL": "bug"}
    flags = [*TWELVE, "--global-batch-size", "1", "--data-cache-dir", corpus_cache, "--save", tmp_path / "ck",
             "--load", tmp_path / "ck", "--metrics-file", tmp_path / "metrics.jsonl", *FAST_HEARTBEATS,
             "--inprocess-max-iterations", "2"]
    done = subprocess.run([sys.executable, str(REPO / "tests" / "kill_rank.py"), *map(str, flags)], cwd=tmp_path,
                          env=environment, capture_output=True, text=True, timeout=180)
    assert done.returncode == 3, done.stderr[-3000:]
    assert {incarnation for incarnation, _ in incarnations(done.stdout)[0]} == {0, 1}, done.stdout[-3000:]
    assert len({pid for _, pid in incarnations(done.stdout)[0]}) == 1
    assert done.stderr.splitlines()[-1] == (
        "pretrain_gpt.py: error: in-process restart 2: rank 0 failed at iteration 3 with RuntimeError: "
        "tests/kill_rank.py: an injected bug; every process stays, resuming from the checkpoint at iteration 2 in "
        "--load: no restart left (--inprocess-max-iterations 2)"), done.stderr[-3000:]
