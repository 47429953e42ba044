"""Issue 69 item 2: Megatron-Core's fault injector (megatron/core/fault_injector.py, FaultInjectorConfig and
setup_fault_injection; megatron/training/training.py, train: where it is set up and polled) with
nvidia-resiliency-ext's faults (nvidia_resiliency_ext/shared_utils/inject_fault.py), and item 1: an error one
rank alone met is printed by that rank, with its grid coordinates, under torchrun and under scripts/launch.py.

- the nine flags: Megatron's names and defaults (every one None: off), its assertions refused in one line;
- the plan: Megatron-Core's draws in its order from random.Random(--fault-injector-seed);
- the faults that raise (workload_exc at the loop's poll, async_exc, signal_exc) raise InjectedFault;
- who prints an error after the process group exists (rendezvous/failure_report.py) against a real store;
- end to end on two CPU ranks: workload_exc on rank 1 (its one line under torchrun; under launch.py the
  launcher's summary names rank 1 too), and sigkill on rank 1 (the survivor's liveness line names it).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from arguments.parser import parse_arguments
from base.errors import ConfigError, InjectedFault, Reporter
from base.options import setting_value
from rendezvous.failure_report import agree_on_failure
from rendezvous.fault_injector import FaultInjector, FaultInjectorSettings, draw_plan
from tests.checkpoint.test_checkpoint_resume import _launch
from tests.distributed import free_port
from tests.reliability_helpers import TINY
from tests.resilience.test_peer_loss import stop_all, wait_for_exit

REPO = Path(__file__).resolve().parents[2]
# megatron/core/fault_injector.py, FaultInjectorConfig: its fields, each a --flag of the same name (arguments.py,
# _add_fault_injector_args builds the group from the dataclass), each None by default.
MEGATRON_FIELDS = ("fault_injector_ranks", "fault_injector_num_ranks", "fault_injector_fault_types",
                   "fault_injector_fault_probabilities", "fault_injector_fault_delay",
                   "fault_injector_delay_start_iteration", "fault_injector_mtti_seconds",
                   "fault_injector_offset_seconds", "fault_injector_seed")
PLACE_OF_RANK_1 = r"rank 1 \(TP 0/1, PP 0/1, DP 1/2, CP 0/1, EP 0/1\)"


def settings_of(*flags: str) -> FaultInjectorSettings:
    return parse_arguments(["--device", "cpu", *flags]).config.training.fault_injector


def test_the_flags_have_megatrons_names_and_defaults_and_its_assertions_are_refused_in_one_line():
    training = parse_arguments(["--device", "cpu"]).config.training
    assert all(setting_value(training, name) is None for name in MEGATRON_FIELDS)
    assert not training.fault_injector.enabled  # training.py: set up only with ranks or num-ranks
    parsed = settings_of("--fault-injector-ranks", "1,2", "--fault-injector-fault-types", "workload_exc,SIGKILL",
                         "--fault-injector-fault-probabilities", "1,3", "--fault-injector-fault-delay", "2.5",
                         "--fault-injector-delay-start-iteration", "4", "--fault-injector-seed", "9")
    assert parsed == FaultInjectorSettings("1,2", None, "workload_exc,SIGKILL", "1,3", 2.5, 4, None, None, 9)
    assert parsed.fault_types_list() == ["workload_exc", "sigkill"]  # Megatron upper-cases into Fault[...]
    assert parsed.probabilities() == [0.25, 0.75]  # normalized, as get_fault does
    refused = {  # Megatron-Core's assertions (get_fault_ranks, get_fault, get_fault_delay), before any work here
        ("--fault-injector-ranks", "1", "--fault-injector-num-ranks", "1"): "are exclusive",
        ("--fault-injector-ranks", "1", "--fault-injector-fault-delay", "0"): "need --fault-injector-fault-types",
        ("--fault-injector-num-ranks", "1", "--fault-injector-fault-types", "hang"): "hang is no nvidia-resiliency",
        ("--fault-injector-ranks", "1", "--fault-injector-fault-types", "sigkill"): "fault-delay or --fault-inj",
        ("--fault-injector-ranks", "1", "--fault-injector-fault-types", "sigkill,os_abort",
         "--fault-injector-fault-probabilities", "1", "--fault-injector-fault-delay", "0"):
            "Number of fault types and fault probabilities must match",
        ("--fault-injector-ranks", "1", "--fault-injector-fault-types", "gpu_error",
         "--fault-injector-fault-delay", "0"): "gpu_error acts on a CUDA device",
    }
    for flags, message in refused.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            settings_of(*flags)
    with pytest.raises(ConfigError, match=r"between 0 and 1"):
        settings_of("--fault-injector-ranks", "2", "--fault-injector-fault-types", "sigkill",
                    "--fault-injector-fault-delay", "0").check_world(2)


def megatrons_draws(seed: int, world_size: int, num_ranks: int, types: list[str], weights: list[float],
                    mtti: float, offset: float):
    """megatron/core/fault_injector.py's get_fault_ranks, get_fault and get_fault_delay, in setup's order."""
    rng = random.Random(seed)
    ranks = rng.sample(range(1, world_size), k=num_ranks)
    fault = rng.choices(types, [w / sum(weights) for w in weights], k=1)[0]
    delay = offset + (-math.log(1.0 - rng.random()) / (1.0 / mtti))
    return tuple(ranks), fault, delay


@pytest.mark.parametrize("seed", [0, 7, 12345])
def test_the_plan_is_megatron_cores_draws_from_the_seed(seed):
    settings = FaultInjectorSettings(num_ranks=2, fault_types="sigkill,workload_exc,lock_gil",
                                     fault_probabilities="1,2,1", mtti_seconds=30.0, offset_seconds=5.0, seed=seed)
    plan = draw_plan(settings, 8, seed)
    ranks, fault, delay = megatrons_draws(seed, 8, 2, ["sigkill", "workload_exc", "lock_gil"], [1, 2, 1], 30.0, 5.0)
    assert (plan.ranks, plan.fault) == (ranks, fault) and plan.delay_s == pytest.approx(delay, rel=1e-12)
    assert 0 not in plan.ranks and draw_plan(settings, 8, seed) == plan


def test_the_faults_that_raise_raise_an_injected_fault_in_the_main_thread():
    injector = FaultInjector("fault injector")
    injector.poll("here")  # nothing armed: nothing raised
    injector.arm("workload_exc", 0.0).join()
    with pytest.raises(InjectedFault, match="workload_exc raised after iteration 3"):
        injector.poll("after iteration 3")
    injector.poll("again")  # raised once
    for fault in ("async_exc", "signal_exc"):
        previous = signal.getsignal(signal.SIGUSR1)
        try:
            with pytest.raises(InjectedFault, match=fault):
                injector.arm(fault, 0.0)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:  # Python code running in the main thread, where it lands
                    sum(range(1000))
        finally:
            signal.signal(signal.SIGUSR1, previous)


def test_an_error_some_ranks_met_is_printed_by_the_first_of_them_naming_them_and_one_all_met_by_rank_0():
    store = dist.HashStore()

    def agree(prefix, posts, wait_s=0.5):
        """Each rank in `posts` posts its line from its own thread, as the ranks would: their Reporters."""
        found = {}

        def one(rank, line):
            found[rank] = agree_on_failure(store, prefix, rank, 4, line, f"rank {rank} (TP ...)", wait_s=wait_s)

        threads = [threading.Thread(target=one, args=item) for item in posts.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return found

    everyone = agree("a/", {rank: "the same bad input" for rank in range(4)}, wait_s=30)
    assert everyone == {0: Reporter(True, ""), 1: Reporter(False, ""), 2: Reporter(False, ""), 3: Reporter(False, "")}
    alone = agree("b/", {1: "slice missing"})
    assert alone == {1: Reporter(True, "rank 1 (TP ...)")}
    two = agree("c/", {1: "slice missing", 3: "slice missing", 2: "another"})
    assert two == {1: Reporter(True, "ranks 1, 3"), 3: Reporter(False, "ranks 1, 3"), 2: Reporter(True, "rank 2 (TP ...)")}

    class Gone:
        def set(self, *args):
            raise ConnectionError("the store's host died")

    assert agree_on_failure(Gone(), "d/", 1, 2, "x", "rank 1 (TP ...)") == Reporter(True, "rank 1 (TP ...)")

    class Stopped:  # a stopped store host: a call blocks (rendezvous/store_wire.py)
        def set(self, *args):
            threading.Event().wait()

    assert agree_on_failure(Stopped(), "e/", 1, 2, "x", "rank 1 (TP ...)", wait_s=0.1) == Reporter(True, "rank 1 (TP ...)")


def test_launch_py_names_the_rank_that_failed_first_on_an_error_of_its_own(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from launch import first_failure
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert first_failure(tmp_path) is None  # nobody's own error: torchrun's report or the ranks' lines say it
    (tmp_path / "failure3").write_text(json.dumps({"time": 20.0, "line": "pretrain_gpt.py: error: rank 3 (...): b"}))
    (tmp_path / "failure1").write_text(json.dumps({"time": 10.0, "line": "pretrain_gpt.py: error: rank 1 (...): a"}))
    (tmp_path / "failure2").write_text('{"time": 5')  # killed mid-write
    assert first_failure(tmp_path) == "launch.py: rank 1 failed first: pretrain_gpt.py: error: rank 1 (...): a"


def fault_flags(cache: str, metrics: Path, fault: str, start_iteration: int) -> list[str]:
    return [*TINY, "--data-cache-dir", cache, "--tokenizer-vocab-size", "512", "--train-iters", "8",
            "--global-batch-size", "4", "--metrics-file", str(metrics), "--fault-injector-ranks", "1",
            "--fault-injector-fault-types", fault, "--fault-injector-fault-delay", "0",
            "--fault-injector-delay-start-iteration", str(start_iteration), "--fault-injector-seed", "1"]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "launch.py"])
def test_an_exception_injected_on_rank_1_is_its_one_line_on_the_terminal(tmp_path, corpus_cache, launcher):
    """workload_exc armed after Megatron's iteration 1 (the step logged as 2), raised at the next poll: after
    iteration 3. Rank 1 prints it with its place; under launch.py the launcher's summary names rank 1 last."""
    command = [sys.executable, *(["-m", "torch.distributed.run"] if launcher == "torchrun" else
                                 [str(REPO / "scripts" / "launch.py")]),
               "--standalone", "--nproc_per_node", "2", str(REPO / "pretrain_gpt.py"),
               *fault_flags(corpus_cache, tmp_path / "metrics.jsonl", "workload_exc", 1)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"})
    line = (rf"pretrain_gpt\.py: error: {PLACE_OF_RANK_1}: fault injector: workload_exc raised after iteration 3 "
            r"\(--fault-injector-fault-types\)")
    assert "> fault injector: workload_exc on rank 1, 0.000 s after iteration 2" in done.stdout, done.stdout
    lines = done.stderr.splitlines()
    assert sum(bool(re.fullmatch(line, text)) for text in lines) == 1, done.stderr
    assert done.returncode == 1, done.stderr  # Megatron's uncaught InjectedException ends its rank with 1
    if launcher == "launch.py":
        assert re.fullmatch(rf"launch\.py: rank 1 failed first: {line}", lines[-1]), done.stderr
        assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_sigkill_injected_on_rank_1_is_named_by_the_survivors_liveness_line(tmp_path, corpus_cache):
    """sigkill armed after Megatron's iteration 2 (the step logged as 3): rank 1 dies during iteration 4 at the
    latest, and rank 0, its ranks started as torchrun starts them, names it in rendezvous/liveness.py's line."""
    argv = fault_flags(corpus_cache, tmp_path / "metrics.jsonl", "sigkill", 2)
    port = free_port()
    files = [(open(tmp_path / f"rank{rank}.out", "w"), open(tmp_path / f"rank{rank}.err", "w")) for rank in range(2)]
    processes = [_launch(argv, rank, 2, port, out, errors=err) for rank, (out, err) in enumerate(files)]
    try:
        killed, _ = wait_for_exit(processes[1], 240)
        code, _ = wait_for_exit(processes[0], 120)
    finally:
        stop_all(processes, files)
    assert killed == -signal.SIGKILL, (tmp_path / "rank1.err").read_text()
    survivor = (tmp_path / "rank0.err").read_text().strip()
    assert code == 3 and re.fullmatch(r"pretrain_gpt\.py: error: rank 1 stopped answering \(died or hung\) during "
                                      r"\w+ on the \w+ group at iteration [34]; this rank \(0\) stops too",
                                      survivor), survivor
