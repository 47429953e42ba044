"""The store an in-process restart coordinates through, at MASTER_PORT + 1 hosted by launch rank 0 as in Megatron-LM: it
outlives every process group and holds each incarnation's group keys, heartbeats, failures and the next incarnation's
rendezvous."""

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
POLL_S = 0.05


class RestartTimeout(PeerLostError):
    """The survivors did not all arrive within --inprocess-barrier-timeout."""


@dataclass(frozen=True)
class Failure:
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
        """The ports whose connections outlive the process groups: this store's and MASTER_PORT's."""
        return self.address[1], self.address[1] - 1

    def key(self, incarnation: int, name: str) -> str:
        return f"{PREFIX}/{incarnation}/{name}"

    def group_store(self, incarnation: int) -> dist.Store:
        """This incarnation's process-group store: a key space of its own."""
        return dist.PrefixStore(self.key(incarnation, "pg"), self.store)

    def record_failure(self, incarnation: int, rank: int, error: str, iteration: Optional[int]) -> None:
        """Record what this process met before it destroys its group, and the incarnation's end for the spares."""
        record = {"launch_rank": self.launch_rank, "rank": rank, "error": error, "iteration": iteration,
                  "time": self.clock()}
        self.store.set(self.key(incarnation, f"failed/{self.launch_rank}"), json.dumps(record))
        self.store.compare_set(self.key(incarnation, "end"), "", "fault")

    def record_done(self, incarnation: int) -> None:
        self.store.compare_set(self.key(incarnation, "end"), "", "done")

    def wait_for_end(self, incarnation: int, trainers: Sequence[int], heartbeat_timeout_s: float) -> str:
        """A spare's wait: "done" or "fault" as the trainers write; "fault" too once every trainer's heartbeat is stale
        (one stale beat may be a starved live trainer)."""
        key = self.key(incarnation, "end")
        while True:
            if self.store.check([key]):
                return self.store.get(key).decode()
            now = self.clock()
            if all(now - self._last_beat(launch) > heartbeat_timeout_s for launch in trainers):
                return "fault"
            time.sleep(POLL_S)

    def failures(self, incarnation: int, launch_ranks: Sequence[int]) -> list[Failure]:
        """The failures recorded in `incarnation`, earliest (the cause) first."""
        keys = [self.key(incarnation, f"failed/{launch}") for launch in launch_ranks]
        found = [json.loads(self.store.get(key)) for key in keys if self.store.check([key])]
        return sorted((Failure(**record) for record in found), key=lambda failure: failure.time)

    def rendezvous(self, incarnation: int, alive_before: Sequence[int], heartbeat_timeout_s: float,
                   barrier_timeout_s: float) -> list[int]:
        """Arrive at `incarnation` and wait until each of `alive_before` arrived or is gone (stale heartbeat and no
        recorded failure); the launch ranks gone, as the first to conclude wrote them."""
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
        """Every process says it is done; the store's host waits (bounded) so none talks to a vanished store."""
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
            return  # the store's host is gone: the main thread learns it from its own call
