"""How many intra-op threads a training process gives torch, decided once at start-up: OMP_NUM_THREADS when set, else
the cores not already busy shared by this node's processes, never more than torch's default (one per core, which ran
3.5x slower than one thread on a loaded 2-core machine)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

import torch

# torch's own choice, taken when this module is first imported
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
    """The thread count for one training process (`processes_on_node`: the local world size)."""
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
    """The cores this process may run on."""
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
    """Choose and apply with torch.set_num_threads; returns the choice, for the start line."""
    omp = environ.get("OMP_NUM_THREADS")
    # with OMP_NUM_THREADS torch's choice is what it read from it at start
    torch_default = torch.get_num_threads() if omp is not None and omp.strip() else TORCH_DEFAULT_THREADS
    choice = choose_intra_op_threads(torch_default, available_cores(), processes_on_node, omp, load_average())
    if choice.threads != torch.get_num_threads():
        torch.set_num_threads(choice.threads)
    return choice
