"""The process grid every other module is handed: ranks, groups and the device.

A `ParallelState` is built once by `initialize()` and passed explicitly to whatever needs a group or
a rank; nothing in the repo reads parallel layout from module globals. While the tensor-parallel and
data-parallel sizes are 1 it describes a single process with no process group at all, which is what
`python pretrain_gpt.py` runs on a laptop.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelState:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    tensor_parallel_size: int = 1
    tensor_parallel_rank: int = 0
    data_parallel_size: int = 1
    data_parallel_rank: int = 0
    # None while the corresponding size is 1: collectives over a group of one are skipped.
    tensor_parallel_group: Optional[dist.ProcessGroup] = None
    data_parallel_group: Optional[dist.ProcessGroup] = None

    @property
    def is_first_rank(self) -> bool:
        """The rank that prints, writes metrics.jsonl and talks to W&B."""
        return self.rank == 0


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present, else CPU; anything else must name an available device."""
    if name == "auto":
        if torch.cuda.is_available():
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: CUDA is not available on this machine; use --device cpu or auto")
    return device


def launched_world_size() -> int:
    """How many processes the launcher (torchrun or SLURM) started, 1 when run directly."""
    for variable in ("WORLD_SIZE", "SLURM_NTASKS"):
        if variable in os.environ:
            return int(os.environ[variable])
    return 1


def initialize(device_name: str = "auto", tensor_parallel_size: int = 1) -> ParallelState:
    """Build the process grid for this run.

    Multi-process grids (TP x DP over torchrun or SLURM) are the next step of the roadmap; until they
    land, a launch with more than one process is refused here, before any work, rather than silently
    training N independent copies of the model.
    """
    world_size = launched_world_size()
    if world_size != 1 or tensor_parallel_size != 1:
        raise ValueError(
            f"this build trains in a single process (launcher world size {world_size}, "
            f"--tensor-model-parallel-size {tensor_parallel_size}); run `python pretrain_gpt.py` "
            "without torchrun until tensor and data parallelism land")
    device = resolve_device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return ParallelState(device=device)
