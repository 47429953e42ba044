"""A run owns each output it writes (--save, --metrics-file) through a lock file, created atomically with a hard link
and kept alive by a heartbeat. A lock whose owner is provably gone (dead pid, reboot, reused pid, stale heartbeat) is
taken over; otherwise a second writer fails at start."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Optional

from base.errors import CheckpointError

HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0


def boot_id() -> Optional[str]:
    """This boot's id (Linux); None where the kernel does not say."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip() or None
    except OSError:
        return None


def process_start_ticks(pid: int) -> Optional[int]:
    """When `pid` started, in clock ticks since boot (/proc/<pid>/stat field 22, counted after the command's closing
    parenthesis)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return int(stat[stat.rindex(")") + 2:].split()[22 - 3])
    except (OSError, ValueError, IndexError):
        return None


# Tokens of the locks this process holds: a lock with our pid but another token is a previous container life's.
_HELD_TOKENS: set[str] = set()


def process_is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    except (OverflowError, ValueError):  # not a pid at all
        return False
    return True


class RunLock:
    """Exclusive ownership of one output for a run's life; `what` and `alternative` word the message a second writer
    gets."""

    def __init__(self, path: str | os.PathLike, what: str, alternative: str, *,
                 log: Callable[[str], None] = print, heartbeat_s: float = HEARTBEAT_S,
                 stale_after_s: float = STALE_AFTER_S) -> None:
        self.path = Path(path)
        self.what, self.alternative = what, alternative
        self.log = log
        self.heartbeat_s = heartbeat_s
        self.stale_after_s = stale_after_s
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(),
                      "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "token": uuid.uuid4().hex,
                      "boot_id": boot_id(), "process_start_ticks": process_start_ticks(os.getpid())}
        self._stop = threading.Event()
        self._heartbeat: Optional[threading.Thread] = None

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


    def acquire(self) -> None:
        """Take the lock, taking over a stale one; raise CheckpointError if a live run holds it."""
        for _ in range(3):  # a stale lock that another process takes over first costs one more round
            if self._create():
                _HELD_TOKENS.add(self.owner["token"])
                self._start_heartbeat()
                return
            holder = self._read_holder()
            reason = self._stale_reason(holder)
            if reason is None:
                raise CheckpointError(self._in_use_message(holder))
            if self._retire_stale():
                self.log(f"> taking over the lock {self.path} of {_describe(holder)}: {reason}")
        raise CheckpointError(f"{self.path}: could not take the lock; another run keeps taking it")

    def _create(self) -> bool:
        temporary = self.path.with_name(f"{self.path.name}.tmp-{self.owner['token']}")
        temporary.write_text(json.dumps(self.owner) + "\n", encoding="utf-8")
        try:
            os.link(temporary, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            temporary.unlink(missing_ok=True)

    def _read_holder(self) -> Optional[dict]:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
            holder["heartbeat_age_s"] = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError, TypeError):
            return None
        if not isinstance(holder.get("host"), str) or not isinstance(holder.get("pid"), int):
            return None
        return holder

    def _stale_reason(self, holder: Optional[dict]) -> Optional[str]:
        if holder == {}:
            return "it was released"
        if holder is None:  # not a lock this program wrote: only its age can tell
            try:
                age = time.time() - self.path.stat().st_mtime
            except FileNotFoundError:
                return "it was released"
            return f"unreadable, untouched for {age:.0f} s" if age > self.stale_after_s else None
        if holder["host"] == self.owner["host"]:
            reason = self._owner_gone_on_this_host(holder)
            if reason is not None:
                return reason
        if holder["heartbeat_age_s"] > self.stale_after_s:
            return f"no heartbeat for {holder['heartbeat_age_s']:.0f} s"
        return None

    def _owner_gone_on_this_host(self, holder: dict) -> Optional[str]:
        pid = holder["pid"]
        if pid == os.getpid() and holder.get("token") not in _HELD_TOKENS:
            return (f"its pid {pid} is this process's own: a previous run in this container (a fresh pid "
                    f"namespace) left it")
        if isinstance(holder.get("boot_id"), str) and self.owner["boot_id"] is not None \
                and holder["boot_id"] != self.owner["boot_id"]:
            return "the machine has booted since it was taken"
        if not process_is_running(pid):
            return f"process {pid} is no longer running"
        recorded = holder.get("process_start_ticks")
        if isinstance(recorded, int) and (now := process_start_ticks(pid)) is not None and now != recorded:
            return f"pid {pid} now belongs to another process (started at another time)"
        return None

    def _retire_stale(self) -> bool:
        """Move the stale lock aside; only one of several processes doing this at once succeeds."""
        aside = self.path.with_name(f"{self.path.name}.stale-{self.owner['token']}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        aside.unlink(missing_ok=True)
        return True

    def _in_use_message(self, holder: Optional[dict]) -> str:
        if holder is None:
            return (f"{self.what} is locked by {self.path}, which this program did not write; "
                    f"if no run uses it, delete that file")
        return (f"{self.what} is in use by another run ({_describe(holder)}, started {holder.get('started')}, "
                f"heartbeat {holder['heartbeat_age_s']:.0f} s ago); wait for it to end, or {self.alternative}. "
                f"If that run is gone, delete {self.path} (or wait {self.stale_after_s:.0f} s for its heartbeat "
                f"to go stale)")


    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._heartbeat = threading.Thread(target=self._beat, name=f"{self.path.name}-heartbeat", daemon=True)
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return
        _HELD_TOKENS.discard(self.owner["token"])
        if isinstance(holder, dict) and holder.get("token") == self.owner["token"]:
            self.path.unlink(missing_ok=True)


class MetricsFileLock(RunLock):
    """A `--metrics-file`'s lock, `FILE.lock` beside its real path, so a symlink and its target share it."""

    def __init__(self, metrics_file: str | os.PathLike, **kwargs) -> None:
        path, target = Path(metrics_file), Path(os.path.realpath(metrics_file))
        super().__init__(target.with_name(target.name + ".lock"), f"--metrics-file {path}",
                         "pass another --metrics-file", **kwargs)


def _describe(holder: Optional[dict]) -> str:
    if not holder:
        return "an unknown owner"
    return f"pid {holder['pid']} on host {holder['host']}"
