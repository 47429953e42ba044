"""The store an in-process restart coordinates through: it outlives every process group of the job.

Megatron-LM (megatron/training/inprocess_restart.py, `maybe_wrap_for_inprocess_restart`) opens a TCPStore at
MASTER_PORT + 1, hosted by launch rank 0, and builds each incarnation's process group on
`PrefixStore(str(iteration), store)` (megatron/training/training.py, `pretrain`); nvidia-resiliency-ext's Wrapper
keeps its own bookkeeping in a second store at MASTER_PORT + 2. Here one store at MASTER_PORT + 1 holds both, under
separate prefixes: `inprocess/<incarnation>/pg/` for the process group, and beside it

- `beat/<launch rank>`: each process's last heartbeat, its wall-clock time, set every --inprocess-heartbeat-interval
  by a thread with its own client (so a main thread blocked in a collective still beats; a SIGKILLed process does
  not);
- `<incarnation>/end`: "fault" once any process of the incarnation failed (the spares wait on it), or "done";
- `<incarnation>/failed/<launch rank>`: what a failed process met (rank, error, iteration, time);
- `<incarnation>/arrived/<launch rank>` and `<incarnation>/terminated`: the rendezvous of the next incarnation, where
  the survivors wait for each other and the first to conclude writes who is gone (compare-and-set, so all agree).

Launch rank 0 hosts the store, as in Megatron-LM: its death ends the job.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Optional, Sequence

import torch.distributed as dist

from base.errors import PeerLostError

PREFIX = "inprocess"
POLL_S = 0.05  # how often a waiting process reads the store: a few small round trips, on a store no one else loads


class RestartTimeout(PeerLostError):
    """The survivors did not all arrive within --inprocess-barrier-timeout (a process alive but stuck)."""


@dataclass(frozen=True)
class Failure:
    """What one process met in an incarnation, as it recorded it."""
    launch_rank: int
    rank: int
    error: str
    iteration: Optional[int]
    time: float


class RestartStore:
    def __init__(self, master_addr: str, master_port: int, launch_rank: int, world_size: int,
                 heartbeat_interval_s: float, timeout_s: float, clock: Callable[[], float] = time.time) -> None:
        self.launch_rank, self.world_size, self.clock = launch_rank, world_size, clock
        self.address = (master_addr, master_port + 1)
        timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(master_addr, master_port + 1, world_size, is_master=launch_rank == 0,
                                   timeout=timeout, wait_for_workers=False)
        self._stop = threading.Event()
        self._beats = threading.Thread(target=self._beat, args=(heartbeat_interval_s, timeout),
                                       name="inprocess-heartbeat", daemon=True)
        self._beats.start()

    def ports(self) -> tuple[int, int]:
        """The ports whose connections outlive the process groups: this store's, and MASTER_PORT's (torchrun's
        agent store)."""
        return self.address[1], self.address[1] - 1

    def key(self, incarnation: int, name: str) -> str:
        return f"{PREFIX}/{incarnation}/{name}"

    def group_store(self, incarnation: int) -> dist.Store:
        """The store this incarnation's process group is built on: a key space of its own, as Megatron's prefix."""
        return dist.PrefixStore(self.key(incarnation, "pg"), self.store)

    def record_failure(self, incarnation: int, rank: int, error: str, iteration: Optional[int]) -> None:
        """Before this process destroys its group (which unblocks the peers waiting on it): what it met, and the
        incarnation's end for the spares."""
        record = {"launch_rank": self.launch_rank, "rank": rank, "error": error, "iteration": iteration,
                  "time": self.clock()}
        self.store.set(self.key(incarnation, f"failed/{self.launch_rank}"), json.dumps(record))
        self.store.compare_set(self.key(incarnation, "end"), "", "fault")

    def record_done(self, incarnation: int) -> None:
        self.store.compare_set(self.key(incarnation, "end"), "", "done")

    def wait_for_end(self, incarnation: int, trainers: Sequence[int], heartbeat_timeout_s: float) -> str:
        """A spare's wait: "done" or "fault", whichever the incarnation's trainers write; "fault" too once every
        trainer's heartbeat is older than `heartbeat_timeout_s` (trainers killed at once, a node lost, write
        nothing; one trainer's stale heartbeat alone is not enough: a live trainer's beat can starve on a busy
        host, and a dead one's peers record the fault)."""
        key = self.key(incarnation, "end")
        while True:
            if self.store.check([key]):
                return self.store.get(key).decode()
            now = self.clock()
            if all(now - self._last_beat(launch) > heartbeat_timeout_s for launch in trainers):
                return "fault"
            time.sleep(POLL_S)

    def failures(self, incarnation: int, launch_ranks: Sequence[int]) -> list[Failure]:
        """The failures recorded in `incarnation`, first in time first (the first is the cause; the others met
        its consequence: a collective broken when the failed rank left its group)."""
        keys = [self.key(incarnation, f"failed/{launch}") for launch in launch_ranks]
        found = [json.loads(self.store.get(key)) for key in keys if self.store.check([key])]
        return sorted((Failure(**record) for record in found), key=lambda failure: failure.time)

    def rendezvous(self, incarnation: int, alive_before: Sequence[int], heartbeat_timeout_s: float,
                   barrier_timeout_s: float) -> list[int]:
        """Arrive at `incarnation` and wait until each process of `alive_before` has arrived too or is gone: its
        heartbeat older than `heartbeat_timeout_s` and no failure recorded in the incarnation before (a process
        that recorded one is alive, on its way here through its clean-up, and on a loaded machine its heartbeat
        thread can wait seconds for the CPU); the launch ranks found gone, as the first to conclude wrote them."""
        self.store.set(self.key(incarnation, f"arrived/{self.launch_rank}"), "1")
        decided_key = self.key(incarnation, "terminated")
        started = self.clock()
        while not self.store.check([decided_key]):
            now = self.clock()
            waiting = [launch for launch in alive_before
                       if not self.store.check([self.key(incarnation, f"arrived/{launch}")])]
            gone = [launch for launch in waiting if now - self._last_beat(launch) > heartbeat_timeout_s
                    and not self.store.check([self.key(incarnation - 1, f"failed/{launch}")])]
            if len(gone) == len(waiting):
                self.store.compare_set(decided_key, "", json.dumps(sorted(gone)))
                break
            if now - started > barrier_timeout_s:
                raise RestartTimeout(f"in-process restart {incarnation}: launch ranks {sorted(set(waiting) - set(gone))} "
                                     f"still beat but did not arrive within --inprocess-barrier-timeout "
                                     f"{barrier_timeout_s:g} s (stuck outside the training's collectives)")
            time.sleep(POLL_S)
        return json.loads(self.store.get(decided_key))

    def finish(self, live: int, completion_timeout_s: float) -> None:
        """Every process says it is done; the store's host waits for them all (bounded), so that none is left
        talking to a store that went away."""
        self.store.add(f"{PREFIX}/finished", 1)
        if self.launch_rank != 0:
            return
        deadline = self.clock() + completion_timeout_s
        while self.store.add(f"{PREFIX}/finished", 0) < live and self.clock() < deadline:
            time.sleep(POLL_S)

    def close(self) -> None:
        self._stop.set()
        self._beats.join(timeout=5)

    def _last_beat(self, launch_rank: int) -> float:
        key = f"{PREFIX}/beat/{launch_rank}"
        return float(self.store.get(key)) if self.store.check([key]) else 0.0

    def _beat(self, interval_s: float, timeout: timedelta) -> None:
        try:
            client = dist.TCPStore(*self.address, is_master=False, timeout=timeout)
            while not self._stop.is_set():
                client.set(f"{PREFIX}/beat/{self.launch_rank}", repr(self.clock()))
                self._stop.wait(interval_s)
        except (RuntimeError, OSError):
            return  # the store's host is gone: the job is ending, and the main thread learns it from its own call
