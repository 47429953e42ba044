"""Drive resilience/rerun_state.py's machine and Megatron-Core's own RerunStateMachine (megatron-core from
requirements-bench.txt) with the same calls, as Megatron-LM's train_step and pretrain_gpt.py's loss_func make them:
per iteration, `while should_run_forward_backward(...)`: each micro-batch's loss validated; then
`should_checkpoint_and_exit()`. Shared by tests/resilience/test_rerun_state.py, test_rerun_resume.py and
test_rerun_stats.py."""

from __future__ import annotations

import math
import struct
from functools import partial
from typing import Optional

import pytest

from resilience.rerun_state import (
    ErrorInjector,
    RerunDiagnostic,
    RerunMode,
    RerunStateMachine,
    python_rng_state,
    restore_python_rng_state,
)

NAN_CHECK = "found NaN in local forward loss calculation"
INF_CHECK = "found Inf in local forward loss calculation"
MICRO_BATCHES = 2



def loss_at(item, run: int, micro_batch: int) -> float:
    """An iteration's loss: a float is every run's and micro-batch's; a tuple gives each run its own (the last
    for later runs), the second micro-batch's 1 more than the first's. Rounded to fp32, as a loss tensor's .item()
    is on both sides (Megatron's machine reads `torch.tensor(loss).item()`, ours the step's fp32 loss)."""
    value = item if not isinstance(item, tuple) else item[min(run, len(item)) - 1] + micro_batch
    return struct.unpack("f", struct.pack("f", value))[0]


def our_machine(rate: int, kind: str, tracker=None, mode: RerunMode = RerunMode.VALIDATE_RESULTS,
                where: tuple[str, str] = ("node", "cpu")) -> RerunStateMachine:
    """Lines it logs (every rank's and the first rank's alike: one process) in `machine.lines`."""
    lines: list[str] = []
    machine = RerunStateMachine(
        mode, rank=0, reduce_any=lambda flags: list(flags), save_rng=python_rng_state,
        restore_rng=restore_python_rng_state, where=where,
        injector=ErrorInjector(rate, RerunDiagnostic(kind), 0, lines.append), tracker_file=tracker, log=lines.append)
    machine.lines = lines
    return machine


def drive_ours(machine: RerunStateMachine, losses, fatal: bool = True, spike_samples=None, first: int = 1,
               checks: tuple[str, ...] = (NAN_CHECK,)) -> list[tuple]:
    """Iterations `first`.. of `losses` (one item per iteration, `loss_at`); per iteration (iteration, runs,
    checkpoint, exit, code), up to the first exit."""
    trace = []
    for iteration in range(first, len(losses) + 1):
        runs = 0
        while machine.should_run_forward_backward(iteration, None):
            runs += 1
            for micro_batch in range(MICRO_BATCHES):
                loss = loss_at(losses[iteration - 1], runs, micro_batch)
                if spike_samples is not None:
                    machine.validate_result(loss, lambda v: machine.is_unexpectedly_large(v, 10, "loss", spike_samples),
                                            "Spiky loss", fatal=fatal)
                    continue
                for check in checks:
                    machine.validate_result(loss, math.isnan if check == NAN_CHECK else math.isinf, check, fatal=fatal)
        decision = machine.should_checkpoint_and_exit()
        trace.append((iteration, runs, *decision))
        if decision[1]:
            break
    return trace


def drive_megatron(machine, losses, fatal: bool = True, spike_samples=None, first: int = 1,
                   checks: tuple[str, ...] = (NAN_CHECK,)) -> list[tuple]:
    """The same calls on Megatron-Core's machine."""
    import torch
    trace = []
    for iteration in range(first, len(losses) + 1):
        runs = 0
        while machine.should_run_forward_backward(None):
            runs += 1
            for micro_batch in range(MICRO_BATCHES):
                result = torch.tensor(loss_at(losses[iteration - 1], runs, micro_batch))
                if spike_samples is not None:
                    machine.validate_result(result, partial(machine.is_unexpectedly_large, threshold=10,
                                                            context="loss", num_samples=spike_samples),
                                            "Spiky loss", fatal=fatal)
                    continue
                for check in checks:
                    machine.validate_result(result, torch.isnan if check == NAN_CHECK else torch.isinf, check,
                                            fatal=fatal)
        decision = machine.should_checkpoint_and_exit()
        trace.append((iteration, runs, *decision))
        if decision[1]:
            break
    return trace


def megatron_rerun_module(monkeypatch, node: Optional[list] = None):
    """megatron.core.rerun_state_machine on a CPU, one process (skipped when megatron-core is not installed): its
    CUDA calls answered as one GPU would (device 0, an RNG state it saves and restores), its all-reduce over one
    rank (the flags themselves), a world of one for its state_dict, and, when `node` is given, os.uname()[1]
    (the node a re-run compares) read from node[0]."""
    rsm = pytest.importorskip("megatron.core.rerun_state_machine")
    import torch
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a, **k: torch.zeros(8, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 1)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(rsm.RerunStateMachine, "_reduce_any",
                        lambda self, value: tuple(value) if isinstance(value, list) else value)
    if node is not None:
        import os
        real = os.uname
        monkeypatch.setattr(os, "uname", lambda: (real()[0], node[0], *real()[2:]))
    return rsm


def megatron_machine_of(rsm, rate: int, kind: str, mode: str = "validate_results"):
    injector = rsm.RerunErrorInjector(error_injection_rate=rate, error_injection_type=rsm.RerunDiagnostic(kind))
    mode = rsm.RerunMode.REPORT_DETERMINISM_STATS if mode == "report_stats" else rsm.RerunMode(mode)
    return rsm.RerunStateMachine(mode=mode, error_injector=injector)
