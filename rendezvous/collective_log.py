"""Each rank's record of its last collectives (the ring a flight recorder dumps) and of the time spent inside them (the
straggler report's wait). PyTorch keeps this only for NCCL, so the Communicator keeps it here for every backend; when
off it costs one `is None` test per collective."""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Optional

# An entry is a list, completed in place: [seq, kind, group, bytes, call site, started_at, completed_at or None, p2p].
SEQ, KIND, GROUP, BYTES, SITE, STARTED, COMPLETED, P2P = range(8)
_DOOR_FILES = ("comm.py", "collective_log.py", "p2p.py", "eager_under_compile.py", "eval_frame.py")


def _call_site():
    """(code, line) of the first frame outside the collective door; the string is made only when a dump reads it."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.endswith(_DOOR_FILES):
        frame = frame.f_back
    return (frame.f_code, frame.f_lineno) if frame is not None else None


def describe_site(site) -> str:
    if site is None:
        return "?"
    code, line = site
    path = code.co_filename
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if path.startswith(root + os.sep):
        path = os.path.relpath(path, root)
    return f"{path}:{line} in {code.co_name}"


class CollectiveLog:
    """The last `capacity` collectives of this rank (0: only the wait clock), each group's next sequence number and
    members, and the seconds spent in collectives since `take_wait_s()`."""

    def __init__(self, capacity: int, clock=time.perf_counter) -> None:
        self.capacity = capacity
        self.ring: list[Optional[list]] = [None] * capacity
        self.count = 0
        self.sequence: dict[str, int] = {}
        self.members: dict[str, tuple[int, ...]] = {}
        self.clock = clock
        self.wait_s = 0.0
        self.iteration: Optional[int] = None

    def start(self, kind: str, group_name: str, group: Any, num_bytes: int) -> list:
        seq = self.sequence.get(group_name, 0) + 1
        self.sequence[group_name] = seq
        if group_name not in self.members:
            self.members[group_name] = _members(group)
        return self._record(seq, kind, group_name, num_bytes)

    def start_p2p(self, kind: str, peer: int, group_name: str, num_bytes: int) -> list:
        """A point-to-point message, numbered per direction and peer ('send to 3' #12 is 'recv from 0' #12 on rank
        3)."""
        kind = f"send to {peer}" if kind == "send" else f"recv from {peer}"
        key = (group_name, kind)
        seq = self.sequence.get(key, 0) + 1
        self.sequence[key] = seq
        return self._record(seq, kind, group_name, num_bytes, p2p=True)

    def _record(self, seq: int, kind: str, group_name: str, num_bytes: int, p2p: bool = False) -> list:
        entry = [seq, kind, group_name, num_bytes, _call_site(), self.clock(), None, p2p]
        if self.capacity:
            self.ring[self.count % self.capacity] = entry
        self.count += 1
        return entry

    def complete(self, entry: list) -> None:
        if entry[COMPLETED] is None:
            entry[COMPLETED] = now = self.clock()
            self.wait_s += now - entry[STARTED]

    def completed_after_wait(self, entry: list, waited_from: float) -> None:
        """An async collective's wait() returned: only the time inside wait() counts as waiting."""
        if entry[COMPLETED] is None:
            entry[COMPLETED] = now = self.clock()
            self.wait_s += now - waited_from

    def take_wait_s(self) -> float:
        waited, self.wait_s = self.wait_s, 0.0
        return waited

    def entries(self) -> list[list]:
        if self.capacity == 0:
            return []
        if self.count <= self.capacity:
            return [entry for entry in self.ring[:self.count]]
        start = self.count % self.capacity
        return self.ring[start:] + self.ring[:start]

    def to_records(self, only_active: bool = False) -> list[dict]:
        """The ring as JSON records, with PyTorch Flight Recorder's field names where they exist."""
        records = []
        for entry in self.entries():
            if only_active and entry[COMPLETED] is not None:
                continue
            records.append({"seq": entry[SEQ], "kind": entry[KIND], "group": entry[GROUP], "bytes": entry[BYTES],
                            "site": describe_site(entry[SITE]), "started_at": entry[STARTED],
                            "state": "started" if entry[COMPLETED] is None else "completed",
                            "duration_s": None if entry[COMPLETED] is None else entry[COMPLETED] - entry[STARTED],
                            "p2p": entry[P2P]})
        return records

    def last_per_group(self) -> dict[str, dict]:
        """Each group's newest collective and newest completed sequence number."""
        last: dict[str, dict] = {}
        for record in self.to_records():
            if record["p2p"]:
                continue
            group = last.setdefault(record["group"], {"completed": 0})
            group["last"] = record
            if record["state"] == "completed":
                group["completed"] = record["seq"]
        return last

    def waiting_p2p(self) -> list[dict]:
        """Point-to-point messages posted and not yet waited for (a pipeline stage blocked on its neighbour)."""
        return [record for record in self.to_records(only_active=True) if record["p2p"]]


def _members(group: Any) -> tuple[int, ...]:
    if group is None:
        return ()
    try:
        import torch.distributed as dist

        return tuple(dist.get_process_group_ranks(group))
    except Exception:  # noqa: BLE001 - a VirtualGroup or a group this rank is not in: members unknown
        return ()


class RecordedWork:
    """An async collective's handle: wait() completes the entry and counts the time waited."""

    def __init__(self, work: Any, log: CollectiveLog, entry: list) -> None:
        self.work, self.log, self.entry = work, log, entry

    def wait(self, timeout=None):
        waited_from = self.log.clock()
        result = self.work.wait() if timeout is None else self.work.wait(timeout)
        self.log.completed_after_wait(self.entry, waited_from)
        return result

    def is_completed(self) -> bool:
        return self.work.is_completed()

    def __getattr__(self, name: str):
        return getattr(self.work, name)
