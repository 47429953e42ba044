"""Where this process sits in its launch, from the environment torchrun, SLURM or OpenMPI's mpirun set: rank, world and
node sizes, the rendezvous address, and SLURM's hostlists. A bad value is one line naming the variable, exit 2."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, MutableMapping, Optional

from base.errors import LaunchEnvironmentError

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class LaunchEnvironment:
    """Where this process sits in the launch."""
    launcher: str  # "torchrun", "slurm" or "none"
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: Optional[int] = None  # processes on this node, when the launcher says
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_MASTER_PORT


def read_launch_environment(environ: Mapping[str, str] = os.environ) -> LaunchEnvironment:
    """torchrun's variables win over SLURM's (`srun torchrun` sets both). Every value is checked first, and half of
    torchrun's pair is refused, since a launch that meant N processes would otherwise train as one."""
    has_rank, has_world = "RANK" in environ, "WORLD_SIZE" in environ
    if has_rank != has_world:
        present, missing = ("RANK", "WORLD_SIZE") if has_rank else ("WORLD_SIZE", "RANK")
        raise LaunchEnvironmentError(f"{present}={environ[present]!r} is set but {missing} is not: launch with "
                                     f"torchrun (scripts/launch.py), which sets both, or unset {present} to run one "
                                     f"process")
    if has_rank:
        world_size = _count(environ, "WORLD_SIZE")
        local_world = _count(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else None
        return LaunchEnvironment(
            launcher="torchrun", rank=_index(environ, "RANK", world_size, "WORLD_SIZE"), world_size=world_size,
            local_rank=_index(environ, "LOCAL_RANK", local_world, "LOCAL_WORLD_SIZE", default=0),
            local_world_size=local_world,
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"), master_port=_port(environ))
    if "SLURM_PROCID" in environ and "SLURM_NTASKS" in environ:
        nodelist_variable = "SLURM_JOB_NODELIST" if environ.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
        nodelist = environ.get(nodelist_variable)
        world_size = _count(environ, "SLURM_NTASKS")
        rank = _index(environ, "SLURM_PROCID", world_size, "SLURM_NTASKS")
        local_rank = _index(environ, "SLURM_LOCALID", None, "", default=0)
        if "MASTER_ADDR" in environ:
            master_addr = environ["MASTER_ADDR"]
        elif nodelist:
            try:
                master_addr = expand_nodelist(nodelist)[0]
            except (ValueError, IndexError) as error:
                raise LaunchEnvironmentError(f"{nodelist_variable}={nodelist!r}: {error}; set MASTER_ADDR to the first "
                                  f"node's address") from None
        else:
            raise LaunchEnvironmentError("SLURM launch without SLURM_JOB_NODELIST: set MASTER_ADDR to the first node")
        return LaunchEnvironment(
            launcher="slurm", rank=rank, world_size=world_size, local_rank=local_rank,
            local_world_size=_slurm_tasks_per_node(environ), master_addr=master_addr, master_port=_port(environ))
    return LaunchEnvironment(launcher="none")


OPENMPI_RANKS = (("OMPI_COMM_WORLD_RANK", "RANK"), ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"),
                 ("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"))


def adopt_openmpi_ranks(environ: MutableMapping[str, str] = os.environ) -> Optional[str]:
    """--use-mpi: OpenMPI's ranks become torchrun's variables, as llm-jp's fork does in parse_args. Where mpirun did not
    start this process they are left as they are and the returned line says so (None when OpenMPI's were taken)."""
    if "OMPI_COMM_WORLD_RANK" not in environ or "OMPI_COMM_WORLD_SIZE" not in environ:
        return ("--use-mpi: OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE are not set (this process was not started by "
                "OpenMPI's mpirun); ranks come from torchrun or SLURM as without it")
    for openmpi, torchrun in OPENMPI_RANKS:
        if openmpi in environ:
            environ[torchrun] = environ[openmpi]
    return None


def use_openmpi_ranks(use_mpi: bool) -> list[str]:
    """pretrain_gpt.py's --use-mpi, before anything reads the launch; returns the line to say when mpirun did not start
    us."""
    if not use_mpi:
        return []
    not_mpirun = adopt_openmpi_ranks()
    read_launch_environment()
    return [not_mpirun] if not_mpirun else []


def _integer(environ: Mapping[str, str], variable: str) -> int:
    text = environ[variable]
    if not (text.strip().isascii() and text.strip().isdigit()):
        raise LaunchEnvironmentError(f"environment variable {variable}={text!r} is not a whole number >= 0; the "
                                     f"launcher (torchrun, scripts/launch.py or srun) sets it: unset it or launch "
                                     f"through one")
    return int(text)


def _count(environ: Mapping[str, str], variable: str) -> int:
    value = _integer(environ, variable)
    if value < 1:
        raise LaunchEnvironmentError(f"environment variable {variable}={environ[variable]!r} must be at least 1 (the "
                                     f"number of processes); unset it or launch through torchrun or srun")
    return value


def _index(environ: Mapping[str, str], variable: str, count: Optional[int], count_variable: str,
           default: Optional[int] = None) -> int:
    if variable not in environ and default is not None:
        return default
    value = _integer(environ, variable)
    if count is not None and value >= count:
        raise LaunchEnvironmentError(f"environment variable {variable}={environ[variable]!r} must be below "
                          f"{count_variable}={count}; unset both or launch through torchrun or srun")
    return value


def _port(environ: Mapping[str, str]) -> int:
    if "MASTER_PORT" not in environ:
        return DEFAULT_MASTER_PORT
    text = environ["MASTER_PORT"]
    if not (text.strip().isascii() and text.strip().isdigit() and 1 <= int(text) <= 65535):
        raise LaunchEnvironmentError(f"environment variable MASTER_PORT={text!r} is not a TCP port (1-65535); set a "
                                     f"free port, or unset it for {DEFAULT_MASTER_PORT}")
    return int(text)


def _slurm_tasks_per_node(environ: Mapping[str, str]) -> Optional[int]:
    # "4", "4(x2)" or "4(x2),3": the first node's count is what a TP group lands on
    for variable in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        match = re.match(r"\s*(\d+)", environ.get(variable, ""))
        if match:
            return int(match.group(1))
    return None


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM hostlist: "dgx[001-004,007],other5" -> dgx001 ... dgx004, dgx007, other5; zero padding and several
    bracket groups as SLURM does."""
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        hosts.extend(_expand_host(item))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in SLURM nodelist {text!r}")
        elif char == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in SLURM nodelist {text!r}")
    items.append(text[start:])
    return [item for item in items if item]


def _expand_host(pattern: str) -> list[str]:
    open_at = pattern.find("[")
    if open_at < 0:
        return [pattern]
    close_at = pattern.index("]", open_at)
    prefix, ranges, rest = pattern[:open_at], pattern[open_at + 1:close_at], pattern[close_at + 1:]
    tails = _expand_host(rest)
    hosts = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"cannot parse range {part!r} in SLURM nodelist {pattern!r}")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            hosts.extend(f"{prefix}{number:0{width}d}{tail}" for tail in tails)
    return hosts
