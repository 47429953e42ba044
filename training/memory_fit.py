"""Memory before the build: the planner's per-rank peak (device and host bytes) against what each host (MemAvailable or
its cgroup's limit, shared by its ranks) and device has free. A run that cannot fit is one line and exit 2 on every
rank, before any output is claimed, instead of an OOM kill half an hour in."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from arguments.batch_schedule import BatchSchedule
from arguments.config import ConfigError, PretrainConfig
from parallel.state import ParallelState
from zero.config import ActivationCheckpointConfig, ZeroConfig

# module attributes so a test can point them at its own files
MEMINFO_PATH = "/proc/meminfo"
PROC_CGROUP_PATH = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
UNLIMITED = 2**60  # cgroup v1's "no limit" is near 2**63; v2 says "max"

# (config, state, batch) -> (device bytes or None, host bytes, why not): the planner's dry run, passed in.
PlanRank = Callable[[PretrainConfig, ParallelState, BatchSchedule], tuple[Optional[int], int, str]]


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


def mem_available_bytes(meminfo_path: Optional[str] = None) -> Optional[int]:
    """MemAvailable of /proc/meminfo, or None where the file or the line is missing."""
    try:
        with open(meminfo_path or MEMINFO_PATH) as meminfo:
            for line in meminfo:
                name, _, value = line.partition(":")
                if name == "MemAvailable":
                    number, _, unit = value.strip().partition(" ")
                    return int(number) * (1024 if unit.strip() == "kB" else 1)
    except (OSError, ValueError):
        return None
    return None


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= UNLIMITED else value


def _inactive_file(stat_path: str, key: str) -> int:
    try:
        with open(stat_path) as file:
            for line in file:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_directories(proc_cgroup: str, cgroup_root: str) -> list[tuple[str, str]]:
    """(directory, version) of this process's memory cgroup and its ancestors, deepest first."""
    try:
        with open(proc_cgroup) as file:
            lines = file.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            found.append((cgroup_root, path, "v2"))
            if os.path.isdir(os.path.join(cgroup_root, "unified")):
                found.append((os.path.join(cgroup_root, "unified"), path, "v2"))
        elif "memory" in controllers.split(","):
            found.append((os.path.join(cgroup_root, "memory"), path, "v1"))
    directories = []
    for root, path, version in found:
        relative = path.strip("/")
        start = os.path.join(root, relative) if relative and os.path.isdir(os.path.join(root, relative)) else root
        directory = start
        while True:
            directories.append((directory, version))
            if os.path.normpath(directory) == os.path.normpath(root):
                break
            directory = os.path.dirname(directory)
    return directories


def cgroup_available_bytes(proc_cgroup: Optional[str] = None, cgroup_root: Optional[str] = None) -> Optional[int]:
    """The least any memory cgroup still lets this process take (limit less usage less inactive file cache); None
    unlimited."""
    least = None
    for directory, version in _cgroup_directories(proc_cgroup or PROC_CGROUP_PATH, cgroup_root or CGROUP_ROOT):
        if version == "v2":
            limit = _read_int(os.path.join(directory, "memory.max"))
            usage = _read_int(os.path.join(directory, "memory.current"))
            cache = _inactive_file(os.path.join(directory, "memory.stat"), "inactive_file")
        else:
            limit = _read_int(os.path.join(directory, "memory.limit_in_bytes"))
            usage = _read_int(os.path.join(directory, "memory.usage_in_bytes"))
            cache = _inactive_file(os.path.join(directory, "memory.stat"), "total_inactive_file")
        if limit is None:
            continue
        left = max(0, limit - max(0, (usage or 0) - cache))
        least = left if least is None else min(least, left)
    return least


def available_host_memory() -> tuple[Optional[int], str]:
    """(bytes this host can still give, source), or (None, why)."""
    available = mem_available_bytes()
    limited = cgroup_available_bytes()
    if limited is not None and (available is None or limited < available):
        return limited, "the memory cgroup's limit less its usage"
    if available is None:
        return None, "no MemAvailable in /proc/meminfo"
    return available, "MemAvailable"


def available_device_memory(device: torch.device) -> Optional[int]:
    """Free bytes on a CUDA device; None on a CPU."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return int(free)


@dataclass(frozen=True)
class RankMemory:
    """One rank's planned bytes and its host's and device's free bytes."""
    rank: int
    host: str                        # ranks with the same host share its memory
    device_bytes: int                # the planner's device peak
    host_bytes: int                  # the planner's host bytes (offload, P_a+cpu)
    device_is_host: bool             # a CPU run: the device bytes come out of the host's memory too
    host_available: Optional[int]
    host_source: str
    device_available: Optional[int]  # None on a CPU
    device_name: str = ""
    unplanned: str = ""              # why the planner had no figure ("" when it had)

    @property
    def host_need(self) -> int:
        return self.host_bytes + (self.device_bytes if self.device_is_host else 0)


def _offload_flags(zero: ZeroConfig) -> list[str]:
    return [flag for flag, on in (("--offload-optimizer", zero.offload_optimizer),
                                  ("--offload-param", zero.offload_param)) if on]


def _stage_lever(stage: int) -> str:
    sharded = {0: "the optimizer states, gradients and parameters", 1: "the gradients and parameters",
               2: "the parameters"}[stage]
    return f"another ZeRO stage (--zero-stage 3 also shards {sharded}; this run has {stage})"


def _host_levers(zero: ZeroConfig, device_is_host: bool) -> str:
    """What lowers a host's need."""
    levers = ["shard over more ranks on more hosts (ranks on one host share its memory)"]
    offloaded = _offload_flags(zero)
    if device_is_host and zero.stage < 3:
        levers.append(_stage_lever(zero.stage))
    if offloaded and not device_is_host:
        levers.append(f"offload only what fits (drop {' or '.join(reversed(offloaded))}: those states then take "
                      f"device memory)")
    levers.append("a smaller model (--num-layers, --hidden-size)")
    return ", ".join(levers[:-1]) + " or " + levers[-1]


def _device_levers(zero: ZeroConfig, activations: ActivationCheckpointConfig) -> str:
    """What lowers a CUDA device's need."""
    stage = zero.stage
    levers = ["shard over more ranks"]
    if stage < 3:
        levers.append(_stage_lever(stage))
    if not zero.offload_optimizer:
        levers.append("--offload-optimizer")
    elif stage == 3 and not zero.offload_param:
        levers.append("--offload-param")
    if not activations.checkpoint_activations:
        levers.append("--checkpoint-activations")
    elif activations.recompute_method == "block":  # its layers past the first N keep their activations
        levers.append("--recompute-method uniform")
    levers.append("a smaller --micro-batch-size or model")
    return ", ".join(levers[:-1]) + " or " + levers[-1]


def _host_words(zero: ZeroConfig, activations: ActivationCheckpointConfig) -> str:
    """What a rank keeps in host memory, by its flags."""
    words = _offload_flags(zero)
    if activations.cpu_checkpointing:
        words.append("--cpu-checkpointing")
    return ", ".join(words) or "host-resident buffers"


def _per_rank(ranks: list[RankMemory], zero: ZeroConfig, activations: ActivationCheckpointConfig) -> str:
    """What the host's ranks each need, in the planner's terms."""
    first = ranks[0]
    parts = []
    if first.device_is_host:
        parts.append(f"{_gib(first.device_bytes)} of model states, buffers and working set")
    if first.host_bytes:
        parts.append(f"{_gib(first.host_bytes)} in host memory ({_host_words(zero, activations)})")
    figure = " + ".join(parts)
    if len(ranks) == 1:
        return f"rank {first.rank}: {figure}"
    needs = [rank.host_need for rank in ranks]
    if min(needs) == max(needs):
        return f"{len(ranks)} ranks x {_gib(needs[0])}, each {figure}"
    return f"{len(ranks)} ranks of {_gib(min(needs))}-{_gib(max(needs))} each"


def memory_verdict(ranks: list[RankMemory], zero: ZeroConfig, activations: ActivationCheckpointConfig) -> Optional[str]:
    """The one line refusing the run, or None when everything fits."""
    hosts: dict[str, list[RankMemory]] = {}
    for rank in ranks:
        hosts.setdefault(rank.host, []).append(rank)
    for name, on_host in hosts.items():
        readable = [rank.host_available for rank in on_host if rank.host_available is not None]
        if not readable:
            continue
        available = min(readable)
        need = sum(rank.host_need for rank in on_host)
        if need > available:
            first = on_host[0]
            source = next(rank.host_source for rank in on_host if rank.host_available == available)
            return (f"this run needs {_gib(need)} of host memory on host {name} for its {len(on_host)} rank(s) there "
                    f"(the planner's peak, {_per_rank(on_host, zero, activations)}) and {_gib(available)} is available "
                    f"({source}): "
                    f"{_host_levers(zero, first.device_is_host)}; `pretrain_gpt.py ... --dry-run` itemizes it")
    for rank in ranks:
        if rank.device_available is not None and rank.device_bytes > rank.device_available:
            return (f"rank {rank.rank} needs {_gib(rank.device_bytes)} on {rank.device_name} of {rank.host} (the "
                    f"planner's peak: model states, buffers and working set, before the CUDA context and NCCL's "
                    f"buffers) and {_gib(rank.device_available)} is free (torch.cuda.mem_get_info): "
                    f"{_device_levers(zero, activations)}; `pretrain_gpt.py ... --dry-run` itemizes it")
    return None


def check_memory_fits(config: PretrainConfig, state: ParallelState, batch: BatchSchedule, plan_rank: PlanRank,
                      log: Callable[[str], None]) -> None:
    """Refuse on every rank a run whose planned bytes exceed what a host or device has free; unplanned ranks count
    nothing."""
    device_bytes, host_bytes, why_not = plan_rank(config, state, batch)
    on_cpu = state.device.type != "cuda"
    host_available, source = available_host_memory()
    mine = RankMemory(rank=state.rank, host=socket.gethostname(), device_bytes=device_bytes or 0,
                      host_bytes=host_bytes if device_bytes is not None else 0, device_is_host=on_cpu,
                      host_available=host_available, host_source=source,
                      device_available=None if device_bytes is None else available_device_memory(state.device),
                      device_name=str(state.device), unplanned=why_not if device_bytes is None else "")
    ranks = state.comm.all_gather_object(mine)
    for rank in ranks:
        if rank.unplanned:
            log(f"> memory not checked before the build for rank {rank.rank}: {rank.unplanned}")
    verdict = memory_verdict(ranks, config.zero, config.activations)
    if verdict is not None:
        raise ConfigError(verdict, flags=("--num-layers", "--hidden-size", "--zero-stage", *_offload_flags(config.zero)))
