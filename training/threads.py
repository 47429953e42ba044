"""How many intra-op threads a training process gives torch: the one rule, applied once at start-up.

torch's default is one thread per physical core, whatever else runs. Each process of a multi-process run
on one node would then start that many, and the default single-process run on a shared 2-core machine
spent 3.5x longer per iteration with torch's 2 threads than with one (issue 49: 12,990 against 3,706 ms,
the same losses). The figures behind the rule are docs/cpu-benchmark-threads-*.json
(scripts/bench/benchmark_threads.py, with the load average beside every figure) and
docs/cpu-benchmark-model-124m-*.json; docs/performance.md reads them.

The rule (choose_intra_op_threads), the same on every device:
- OMP_NUM_THREADS set: torch already took it at start; it is kept (what a user or a launcher asked for:
  torchrun sets 1 per process when it starts several, torch/distributed/run.py; scripts/launch.py too).
- otherwise the cores not already busy, shared by this node's processes, and never more than torch's
  default: min(torch's default, max(1, cores - round(1-minute load average)) // processes on the node),
  at least 1. Alone on a quiet machine that is torch's default; alone on the loaded 2-core machine
  (load 4-7) it is one thread, which measured 2-5x faster than torch's two there; two processes on two
  cores get one each, as torchrun gives them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

# torch's own choice, taken when this module is first imported (before any run sets its own).
TORCH_DEFAULT_THREADS = torch.get_num_threads()


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    torch_default: int
    reason: str

    @property
    def differs(self) -> bool:
        return self.threads != self.torch_default

    def words(self) -> str:
        plural = "s" if self.threads != 1 else ""
        return f"{self.threads} torch thread{plural} (torch's default {self.torch_default}: {self.reason})"


def choose_intra_op_threads(torch_default: int, cores: int, processes_on_node: Optional[int],
                            omp_num_threads: Optional[str], load_average: float) -> ThreadChoice:
    """The thread count for one training process (the rule in the module docstring). `cores`: the cores
    this process may run on; `processes_on_node`: the launcher's local world size (None: not launched,
    one process); `omp_num_threads`: the environment's OMP_NUM_THREADS, if set; `load_average`: the
    machine's 1-minute load average (the runnable processes, os.getloadavg) before this run's work."""
    if omp_num_threads is not None and omp_num_threads.strip():
        return ThreadChoice(torch_default, torch_default, f"OMP_NUM_THREADS={omp_num_threads.strip()} kept")
    processes = max(1, processes_on_node or 1)
    free = cores - round(load_average)
    threads = max(1, min(torch_default, max(1, free) // processes))
    if threads == torch_default:
        return ThreadChoice(threads, torch_default, "torch's default")
    load = f"load average {load_average:.2f} on {cores} cores " + (f"leaves {free} free" if free >= 1 else
                                                                    "keeps every core busy")
    sharing = f", shared by {processes} processes" if processes > 1 else ""
    return ThreadChoice(threads, torch_default, f"{load}{sharing}; OMP_NUM_THREADS overrides")


def available_cores() -> int:
    """The cores this process may run on (its affinity where the platform says, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def set_intra_op_threads(processes_on_node: Optional[int],
                         environ: Mapping[str, str] = os.environ) -> ThreadChoice:
    """Choose (choose_intra_op_threads) and apply with torch.set_num_threads; the choice, for the start line."""
    omp = environ.get("OMP_NUM_THREADS")
    # with OMP_NUM_THREADS torch's choice is what it read from it at start, and stays
    torch_default = torch.get_num_threads() if omp is not None and omp.strip() else TORCH_DEFAULT_THREADS
    choice = choose_intra_op_threads(torch_default, available_cores(), processes_on_node, omp, load_average())
    if choice.threads != torch.get_num_threads():
        torch.set_num_threads(choice.threads)
    return choice
