"""Run a function on N local processes, the way torchrun would, and fail fast when any of them fails.

    results = run_distributed(check_something, 4, arg1, arg2, timeout=60)

Each child gets torchrun's environment (MASTER_ADDR/PORT on a free local port, RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE) and calls `fn(rank, world_size, *args)`; `fn` must be a module-level
function (children import it by name), `args` and its return value picklable. The results come back
in rank order. If a rank raises, dies, or the whole run exceeds `timeout` seconds, every child is
terminated and `DistributedTestError` carries the failing rank's traceback: a hung collective fails
the test instead of stalling CI.

Children come from a forkserver that has imported torch once, not from a fresh interpreter each:
importing torch costs ~2 s of CPU per process, which on a 2-core CI machine made a 4-rank test take
10 s instead of 0.2 s. The server also imports what every training rank imports next (PRELOAD): the
project's modules, torch._dynamo, which torch.optim imports on an optimizer's first parameter
group (1.6 s a process), and what a launch imports only when it gets there: torch.distributed.checkpoint (a
torch_dist save), TensorBoard's writer and wandb (0.5 s; most replayed launches name a W&B project). The server forks before any test code runs in it, so children start with no
threads, no process group and no CUDA context, as spawned ones would.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import queue
import random
import socket
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# Imported once in the forkserver, so each child starts with them. None starts a thread or reads the
# environment at import (children get the caller's environment after the fork). A module that fails
# to import is skipped by multiprocessing, and the child imports it itself, as before.
PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "pytest", "pretrain_gpt", "planner.dry_run",
           "checkpoint.torch_dist.writer", "torch.utils.tensorboard", "wandb"]


class DistributedTestError(AssertionError):
    """A rank raised, died, or the run timed out."""


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux: /proc/sys/net/ipv4/ip_local_port_range), 32768 where
    it cannot be read."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(ports: range) -> bool:
    with contextlib.ExitStack() as stack:
        for port in ports:
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def free_port(consecutive: int = 1) -> int:
    """A port free now, picked BELOW the ephemeral range. A test picks the ports of its later launches up front and
    binds them seconds or minutes later; a port from the ephemeral range (bind to 0) can be taken meanwhile by any
    process's outgoing connection - gloo's pair connections of another test's ranks, on the other xdist worker -
    and the launch then fails with EADDRINUSE (CI once did, 2026-11-24). Below the range only a listener can take
    it, and listeners pick their ports the same way, at random among ~20,000. `consecutive`: the first of that many
    ports in a row, all free now (the in-process restart's store listens at MASTER_PORT + 1, rendezvous/restart_store.py:
    CI once failed with it taken, 2026-11-25)."""
    low = _ephemeral_low()
    rng = random.SystemRandom()
    if low > 12000:
        for _ in range(64):
            port = rng.randrange(10000, low - consecutive)
            if _bindable(range(port, port + consecutive)):
                return port
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if _bindable(range(port, port + consecutive)):
            return port
    raise OSError(f"no {consecutive} free ports in a row")


def _child(module: str, name: str, sys_path: list, environ: dict, rank: int, world_size: int, port: int,
           args: tuple, results) -> None:
    # The forkserver kept the sys.path and environment of when it started; give the child the
    # caller's current ones, as a spawned process would have.
    sys.path[:] = sys_path
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    # The processes share a couple of cores: one intra-op thread each avoids oversubscription.
    torch.set_num_threads(1)
    try:
        fn = getattr(importlib.import_module(module), name)
        results.put((rank, "ok", _as_bytes(fn(rank, world_size, *args))))
    except BaseException:  # noqa: BLE001 - every failure must reach the parent with its traceback
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _as_bytes(result) -> bytes:
    """The result pickled with its tensors' bytes inside. Put on the queue as it is, a tensor is shared by a file
    descriptor the child must still serve when the parent reads it; a child that had already exited failed the
    test with FileNotFoundError (CI, 2026-11-29)."""
    buffer = io.BytesIO()
    torch.save(result, buffer)
    return buffer.getvalue()


def run_distributed(fn, world_size: int, *args, timeout: float = 120) -> list:
    """fn(rank, world_size, *args) on `world_size` processes; their return values in rank order.

    Called from a script rather than pytest, the script needs multiprocessing's usual
    `if __name__ == "__main__":` guard.
    """
    if "<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>" or fn.__module__ == "__main__":
        raise TypeError(f"run_distributed needs a function defined at the top of an importable module, "
                        f"got {fn.__module__}.{fn.__qualname__}")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_child, daemon=True,
                                 args=(fn.__module__, fn.__qualname__, list(sys.path), dict(os.environ), rank,
                                       world_size, port, args, results))
                 for rank in range(world_size)]
    outputs: dict[int, object] = {}
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.start()
        dead_since: dict[int, float] = {}
        while len(outputs) < world_size:
            try:
                rank, status, payload = results.get(timeout=0.2)
            except queue.Empty:
                _fail_on_dead_or_late(processes, outputs, dead_since, deadline, timeout)
                continue
            if status == "error":
                raise DistributedTestError(_failures(rank, payload, world_size, results, processes, outputs))
            outputs[rank] = torch.load(io.BytesIO(payload), weights_only=False)
        for process in processes:
            process.join(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        _stop(processes)
        results.close()
    return [outputs[rank] for rank in range(world_size)]


def _failures(rank: int, payload: str, world_size: int, results, processes, outputs: dict,
              grace_s: float = 5.0) -> str:
    """The first failed rank's report and those of the ranks that fail within `grace_s` after it: a rank
    that met a bad input every rank met is silent (rank 0 prints it, base/errors.py), so the first failure
    to arrive may say nothing of why (CI once reported only rank 1's bare exit 2, 2026-11-26)."""
    reports = {rank: payload}
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and len(reports) + len(outputs) < world_size:
        try:
            other, status, text = results.get(timeout=0.2)
        except queue.Empty:
            if all(process.exitcode is not None for process in processes):
                break
            continue
        if status == "error":
            reports[other] = text
        else:
            outputs[other] = torch.load(io.BytesIO(text), weights_only=False)
    return "\n".join(f"rank {failed} of {world_size} failed:\n{text}" for failed, text in sorted(reports.items()))


def _fail_on_dead_or_late(processes, outputs: dict, dead_since: dict, deadline: float, timeout: float) -> None:
    now = time.monotonic()
    for rank, process in enumerate(processes):
        # A rank that exited without reporting crashed (segfault, os._exit, killed for memory). Its
        # report may still be in the pipe for a moment after it exits, hence the grace period.
        if rank not in outputs and process.exitcode is not None:
            if now - dead_since.setdefault(rank, now) > 2.0:
                raise DistributedTestError(f"rank {rank} exited with code {process.exitcode} without a result")
    if now > deadline:
        waiting = [rank for rank in range(len(processes)) if rank not in outputs]
        raise DistributedTestError(f"timed out after {timeout:.0f} s waiting for ranks {waiting} "
                                   "(a hung collective, or a rank stuck before it)")


def _stop(processes) -> None:
    started = [process for process in processes if process.pid is not None]  # start() may have failed
    for process in started:
        if process.is_alive():
            process.terminate()
    for process in started:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)
