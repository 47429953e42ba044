"""An injected fault is one fault (issue 79 item 6), and an in-process restart's end is said once, naming the rank.

Before: Megatron-LM sets its injector up again at every recovery (megatron/training/training.py calls
setup_fault_injection in each train()), so under --inprocess-restart a fault with a fixed delay fired again in every
incarnation (async_exc on rank 1 reached "in-process restart 547"); the clock of --fault-injector-delay-start-iteration
started before that iteration's save, so a fault of delay 0 landed inside the save and each restart resumed from the
save before, re-armed and died the same way; restarts had no bound by default; with no spare a stopped rank ended the
job without being named, and "no restart left" was printed by every process.
"""

from __future__ import annotations

import math
import random
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rendezvous.fault_injector import FaultInjector, FaultInjectorSettings, draw_plan
from resilience.fault_injection import plan_faults
from tests.reliability_helpers import TINY
from tests.resilience.test_inprocess_restart import FAST_HEARTBEATS, incarnations
from tests.scripts.test_restart_in_job import REPO, TWELVE, finish, free_port, launch_environment, start


def _state(world_size: int = 2, rank: int = 1):
    return SimpleNamespace(world_size=world_size, rank=rank, device=SimpleNamespace(type="cpu"))


def test_a_fixed_delay_fault_is_not_armed_again_at_a_restart():
    settings = FaultInjectorSettings(ranks="1", fault_types="async_exc", fault_delay=2.0, seed=3)
    lines: list[str] = []
    assert plan_faults(settings, _state(), 0, lines.append) is not None
    assert plan_faults(settings, _state(), 4, lines.append, restart=1) is None
    assert lines[-1].startswith("> fault injector: not armed again at restart 1"), lines


def test_an_mtti_plan_draws_the_next_fault_at_a_restart_as_megatron_cores_module_rng_draws_on():
    """megatron/core/fault_injector.py keeps one module-level `rng` per process (made once, from the seed) and each
    setup_fault_injection draws ranks, fault and delay on from it."""
    settings = FaultInjectorSettings(num_ranks=1, fault_types="async_exc,sigkill", mtti_seconds=30.0, seed=11)
    rng = random.Random(11)
    megatrons = []
    for _ in range(3):
        ranks = tuple(rng.sample(range(1, 4), k=1))
        fault = rng.choices(["async_exc", "sigkill"], [0.5, 0.5], k=1)[0]
        megatrons.append((ranks, fault, -math.log(1.0 - rng.random()) * 30.0))
    for restart, (ranks, fault, delay) in enumerate(megatrons):
        plan = draw_plan(settings, 4, 11, index=restart)
        assert (plan.ranks, plan.fault) == (ranks, fault) and plan.delay_s == pytest.approx(delay, rel=1e-12)
        schedule = plan_faults(settings, _state(4, ranks[0]), 0, lambda line: None, restart=restart)
        assert schedule is not None and schedule.plan == plan


def test_a_fault_armed_by_an_iteration_lands_after_its_save(corpus_cache_300, tmp_path):
    """SIGKILL with no delay once the iteration of --fault-injector-delay-start-iteration 1 (logged iteration 2) is
    done: its save is complete and named. Before, the kill came while iteration 2 was being saved."""
    ck = tmp_path / "ck"
    command = [sys.executable, str(REPO / "pretrain_gpt.py"), *TINY, "--train-iters", "4", "--data-cache-dir",
               corpus_cache_300, "--metrics-file", str(tmp_path / "metrics.jsonl"), "--save", str(ck),
               "--save-interval", "2", "--fault-injector-ranks", "0", "--fault-injector-fault-types", "sigkill",
               "--fault-injector-delay-start-iteration", "1", "--fault-injector-fault-delay", "0"]
    killed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (ck / "latest").read_text() == "iter_0000002\n" and not list(ck.glob("*.partial")), killed.stdout[-2000:]


@pytest.mark.slow
def test_an_async_exception_with_a_fixed_delay_is_injected_once_under_inprocess_restart(corpus_cache, tmp_path):
    """The issue's run: async_exc on rank 1, 2 ranks, a save every 2 iterations, --inprocess-restart: one restart,
    then the job ends 0 (before, a restart per incarnation without end)."""
    injector = ["--fault-injector-ranks", "1", "--fault-injector-fault-types", "async_exc",
                "--fault-injector-fault-delay", "0.5", "--fault-injector-seed", "1"]
    # 400 iterations, a few seconds: twelve took 0.11 s once the corpus was cached, over before the fault was due
    longer = ["--train-iters", "400", "--save-interval", "100"]
    code, out, err = finish(start(tmp_path, corpus_cache, [], [*FAST_HEARTBEATS, *injector, *longer]), tmp_path)
    assert code == 0, (err[-3000:], out[-3000:])
    assert {incarnation for incarnation, _ in incarnations(out)[1]} == {0, 1}, out[-3000:]
    assert "> fault injector: not armed again at restart 1" in out, out[-3000:]
    assert "> in-process restart: --inprocess-max-iterations bounds the incarnations (10 by default here)" in out


def test_a_fault_not_due_when_training_ends_is_not_injected_and_said_so(corpus_cache_300, tmp_path):
    """async_exc due an hour after the start of a run of 2 iterations: before, the injector's thread slept on and a
    fault due during the run's last lines ended the process with status 1 and no line; now the end of training
    cancels it, exit 0, said in one line."""
    command = [sys.executable, str(REPO / "pretrain_gpt.py"), *TINY, "--train-iters", "2", "--data-cache-dir",
               corpus_cache_300, "--metrics-file", str(tmp_path / "metrics.jsonl"), "--fault-injector-ranks", "0",
               "--fault-injector-fault-types", "async_exc", "--fault-injector-fault-delay", "3600"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "before its async_exc was due (3600.000 s): nothing injected" in done.stdout, done.stdout[-2000:]


def test_a_cancelled_injector_never_fires():
    injector = FaultInjector("test")
    fired = injector.arm("workload_exc", 0.2)
    injector.cancel()
    fired.join(timeout=5)
    injector.poll("after the delay")  # raises InjectedFault had the workload exception been set


def _two_ranks(tmp_path: Path, corpus_cache: str, kill: dict[str, str], *flags) -> list[subprocess.Popen]:
    """Two processes launched as SLURM's srun launches them (one per rank, no agent to stop the others), each
    tests/kill_rank.py with `kill`'s settings, under --inprocess-restart with fast heartbeats and no spare."""
    port, processes = free_port(), []
    for rank in (0, 1):
        environment = {**launch_environment(), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **kill}
        argv = [*TWELVE, "--data-cache-dir", corpus_cache, "--save", tmp_path / "ck", "--load", tmp_path / "ck",
                "--metrics-file", tmp_path / "metrics.jsonl", *FAST_HEARTBEATS, *flags]
        processes.append(subprocess.Popen([sys.executable, str(REPO / "tests" / "kill_rank.py"), *map(str, argv)],
                                          cwd=tmp_path, env=environment, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    return processes


@pytest.mark.slow
def test_a_stopped_rank_with_no_spare_is_named(corpus_cache, tmp_path):
    """Rank 1 stops itself (SIGSTOP) after iteration 3; rank 0's collective times out, its heartbeat has stopped, and
    rank 0 says which rank is gone and that no process is left to take its place, exit 3 (before: '1 processes left
    of the 2 that train ...', no rank named)."""
    # in an incarnation nothing watches a silent peer: rank 0 waits in its collective until c10d's timeout
    survivor, stopped = _two_ranks(tmp_path, corpus_cache, {"KILL_AT_ITERATION": "3", "KILL_RANK": "1",
                                                            "KILL_SIGNAL": "SIGSTOP"}, "--distributed-timeout-minutes",
                                   "0.2")
    try:
        _, err = survivor.communicate(timeout=180)
    finally:
        stopped.kill()  # ours: started above
        stopped.communicate()
    assert survivor.returncode == 3, err[-3000:]
    assert err.splitlines()[-1].startswith("pretrain_gpt.py: error: in-process restart 1: rank 1 (launch rank 1) is "
                                           "gone: no heartbeat within --inprocess-heartbeat-timeout; 1 processes "
                                           "left of the 2 that train"), err[-3000:]


@pytest.mark.slow
def test_no_restart_left_is_said_once_for_the_job(corpus_cache, tmp_path):
    """Rank 1 fails at iteration 3 in every incarnation; with --inprocess-max-iterations 2 both processes end with
    exit 3 and one line between them (before: one per process)."""
    processes = _two_ranks(tmp_path, corpus_cache, {"KILL_AT_ITERATION": "3", "KILL_RANK": "1", "KILL_SIGNAL": "bug"},
                           "--inprocess-max-iterations", "2")
    errors = [process.communicate(timeout=180)[1] for process in processes]
    assert [process.returncode for process in processes] == [3, 3], errors
    said = [line for err in errors for line in err.splitlines() if "no restart left" in line]
    assert said == ["pretrain_gpt.py: error: in-process restart 2: rank 1 failed at iteration 3 with RuntimeError: "
                    "tests/kill_rank.py: an injected bug; every process stays, resuming from the checkpoint at "
                    "iteration 2 in --load: no restart left (--inprocess-max-iterations 2)"], errors
