"""Who stopped answering: each rank beats a counter in the rendezvous store and watches its ring neighbour's, so the
survivors of a dead or stalled peer name it in one line, never from a transport's error text."""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from rendezvous.store_wire import connect_store_client

HEARTBEAT_INTERVAL_S = 1.0
# A live rank beats about five times in this window even on a loaded machine; a dead one not once.
SILENT_AFTER_S = 5.0
# After a collective failed, wait this long before calling the store: a dead store host has closed its idle socket by
# then.
SETTLE_S = 0.25
FINISH_WAIT_S = 10.0
STORE_TIMEOUT_S = 30.0
# How long to wait for this rank's own main thread to raise a peer's published error too.
FAILURE_GRACE_S = 2.0
LEFT = -1
LEFT_AFTER_LOSS = -2


class Store(Protocol):
    def add(self, key: str, amount: int) -> int: ...
    def set(self, key: str, value: str) -> None: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def multi_get(self, keys: list[str]) -> list[bytes]: ...


class StoreGone(ConnectionError):
    """The store's host closed its connections: it died."""


# A SIGKILLed store host is silent 35-120 ms before its sockets close; the idle socket opens first, so it closes first.
class StoreConnection:
    """An idle TCP connection to the store's port: a zero-timeout select sees the dead host's kernel close it, with no
    byte sent."""

    def __init__(self, host: str, port: int) -> None:
        self.socket = socket.create_connection((host, port), timeout=STORE_TIMEOUT_S)
        self.socket.setblocking(False)

    def closed(self) -> bool:
        readable, _, _ = select.select([self.socket], [], [], 0)
        if not readable:
            return False
        try:
            return self.socket.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        self.socket.close()


class GuardedStore:
    """A store client that raises StoreGone instead of calling a host that died."""

    def __init__(self, store: Store, connection: StoreConnection) -> None:
        self.store, self.connection = store, connection

    def __getattr__(self, name: str):
        call = getattr(self.store, name)

        def guarded(*args, **kwargs):
            if self.connection.closed():
                raise StoreGone("the store's host closed its connections")
            return call(*args, **kwargs)

        return guarded

    def close(self) -> None:
        self.connection.close()
        close = getattr(self.store, "close", None)
        if close is not None:
            close()


@dataclass(frozen=True)
class PeerLoss:
    """Who is gone: silent ranks, ranks that `exited` on their own error, the store's host, this rank itself
    (`paused_for_s`), or a rank whose collective work `failed`."""
    silent: tuple[int, ...] = ()
    exited: tuple[int, ...] = ()
    store_host: Optional[str] = None
    paused_for_s: Optional[float] = None
    failed: Optional[int] = None
    failed_line: str = ""
    failed_status: int = 0

    def to_json(self) -> str:
        fields: dict = {"silent": list(self.silent), "exited": list(self.exited)}
        if self.failed is not None:
            fields.update(failed=self.failed, line=self.failed_line, status=self.failed_status)
        return json.dumps(fields)

    @classmethod
    def from_json(cls, text: bytes | str) -> "PeerLoss":
        fields = json.loads(text)
        return cls(silent=tuple(fields["silent"]), exited=tuple(fields["exited"]), failed=fields.get("failed"),
                   failed_line=fields.get("line", ""), failed_status=fields.get("status", 0))

    def describe(self, rank: int, where: str) -> str:
        if self.failed is not None:
            return f"rank {self.failed} failed {where}: {self.failed_line}; this rank ({rank}) stops too"
        if self.paused_for_s is not None:
            return (f"this rank ({rank}) did not run for {self.paused_for_s:.0f} s (it was stopped, e.g. SIGSTOP or "
                    f"a suspended job, or starved of the CPU) {where}, longer than --heartbeat-timeout-seconds: its "
                    f"peers have given up on it, so it stops too")
        if rank in self.silent:
            return (f"the other ranks found this rank ({rank}) silent for too long (stopped, or starved of the "
                    f"CPU) and stopped {where}; this rank stops too")
        parts = []
        if self.silent:
            parts.append(f"{_ranks(self.silent)} stopped answering (died or hung)")
        if self.exited:
            parts.append(f"{_ranks(self.exited)} exited on an error of {'its' if len(self.exited) == 1 else 'their'} "
                         f"own (see {'its' if len(self.exited) == 1 else 'their'} output)")
        if self.store_host is not None:
            parts.append(f"{self.store_host} stopped answering (died or hung)")
        return f"{' and '.join(parts)} {where}; this rank ({rank}) stops too"


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(str(r) for r in ranks)}"


class Board:
    """This launch's liveness keys: beat/<rank> (a counter, or LEFT / LEFT_AFTER_LOSS) and verdict (a PeerLoss as
    JSON)."""

    def __init__(self, store: Store, prefix: str, rank: int, world_size: int) -> None:
        self.store, self.prefix, self.rank, self.world_size = store, prefix, rank, world_size
        self.verdict_key = f"{prefix}verdict"

    def key(self, rank: int) -> str:
        return f"{self.prefix}beat/{rank}"

    def beat(self) -> None:
        self.store.add(self.key(self.rank), 1)

    def leave(self, after_loss: bool) -> None:
        self.store.set(self.key(self.rank), str(LEFT_AFTER_LOSS if after_loss else LEFT))

    def read(self, ranks: Sequence[int]) -> dict[int, int]:
        """Counters of `ranks`: one round trip when every key exists, else add 0 per rank (creates instead of
        waiting)."""
        keys = [self.key(rank) for rank in ranks]
        if self.store.check(keys):
            return {rank: int(value) for rank, value in zip(ranks, self.store.multi_get(keys))}
        return {rank: int(self.store.add(key, 0)) for rank, key in zip(ranks, keys)}

    def verdict(self) -> Optional[PeerLoss]:
        # An empty expected value creates the key empty, or returns the verdict.
        text = self.store.compare_set(self.verdict_key, "", "")
        return PeerLoss.from_json(text) if text else None

    def propose(self, loss: PeerLoss) -> PeerLoss:
        """Write `loss` unless a verdict stands; return the verdict that stands."""
        return PeerLoss.from_json(self.store.compare_set(self.verdict_key, "", loss.to_json()))


@dataclass
class StallWatch:
    timeout_s: float
    value: Optional[int] = None
    since: float = 0.0

    def stalled(self, value: int, now: float) -> bool:
        if value != self.value:
            self.value, self.since = value, now
        return value >= 0 and now - self.since >= self.timeout_s


def find_lost_peers(board: Board, clock: Callable[[], float], sleep: Callable[[float], None],
                    silent_after_s: float = SILENT_AFTER_S, poll_s: float = HEARTBEAT_INTERVAL_S / 2,
                    ) -> Optional[PeerLoss]:
    """After a collective failed here: the lost peers agreed through the verdict, or None when all are alive."""
    others = [rank for rank in range(board.world_size) if rank != board.rank]
    started = clock()
    first = board.read(others)
    while True:
        verdict = board.verdict()
        if verdict is not None and verdict.failed != board.rank:
            return verdict
        latest = board.read(others)
        exited = tuple(rank for rank in others if latest[rank] == LEFT)
        pending = [rank for rank in others if latest[rank] >= 0 and latest[rank] == first[rank]]
        waited = clock() - started
        if not exited and not pending:
            return None
        if not pending or waited >= silent_after_s:
            return board.propose(PeerLoss(silent=tuple(pending), exited=exited))
        board.beat()
        sleep(poll_s)


class Liveness:
    """One rank's heartbeat and watchdog threads. A loss is found when a collective raises, the neighbour's counter
    stalls, a verdict appears, or the store stops answering; `on_lost(loss)` is called once, from a thread, and does not
    return."""

    def __init__(self, store: Store, rank: int, world_size: int, *, prefix: str, store_host: str,
                 hosts_store: bool, stall_timeout_s: float, on_lost: Callable[[PeerLoss], None],
                 silent_after_s: float = SILENT_AFTER_S, interval_s: float = HEARTBEAT_INTERVAL_S,
                 settle_s: float = SETTLE_S, failure_grace_s: float = FAILURE_GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.board = Board(store, prefix, rank, world_size)
        self.store_host = store_host
        self.hosts_store = hosts_store
        self.stall_timeout_s = stall_timeout_s  # 0: no watching of the neighbour and the store
        self.on_lost = on_lost
        self.silent_after_s = silent_after_s
        self.interval_s = interval_s
        self.settle_s = settle_s
        self.failure_grace_s = failure_grace_s
        self.clock = clock
        self.neighbour = (rank + 1) % world_size
        self._stop = threading.Event()
        self._suspect = threading.Event()
        self._suspected_at = 0.0
        self._answer_ready = threading.Event()
        self._answer: Optional[PeerLoss] = None
        self._reported = threading.Event()
        self._report_lock = threading.Lock()
        self._answered_at = clock()
        self._awake_at = clock()  # a long gap between wakes means this process did not run
        # At least three intervals, so a late wake on a loaded machine is no pause.
        self._pause_s = max(stall_timeout_s - 2 * interval_s, 3 * interval_s)
        self._last_pause: tuple[float, float] = (0.0, float("-inf"))
        self._reported_loss: Optional[PeerLoss] = None
        self._report_done = threading.Event()
        self._explained = False
        self._left_after_loss = False
        self._own_error = False
        self._raising = threading.Event()
        self._failure_seen_at: Optional[float] = None
        self._threads: list[threading.Thread] = []


    def start(self) -> "Liveness":
        self.board.beat()
        self._threads = [threading.Thread(target=self._heartbeat, name="liveness-heartbeat", daemon=True)]
        if self.stall_timeout_s > 0:
            self._threads.append(threading.Thread(target=self._watch_store, name="liveness-watchdog", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def explain_failure(self) -> Optional[PeerLoss]:
        """After a collective failed: the lost peers, or None when all are alive. This rank's own pause is checked
        first."""
        since = self.clock() - self.stall_timeout_s
        margin = self.settle_s + 3 * self.interval_s
        answer = self._own_pause(since)
        if answer is None:
            self._suspected_at = self.clock()
            self._suspect.set()
            if self._answer_ready.wait(self.silent_after_s + margin):
                answer = self._own_pause(since) or self._answer
            elif self.clock() - self._answered_at >= self.silent_after_s:
                answer = self._own_pause(since) or PeerLoss(store_host=self.store_host)
        with self._report_lock:
            if not self._reported.is_set():
                self._explained = True
                if answer is not None and answer.paused_for_s is not None:
                    self._reported.set()
                return answer
        self._report_done.wait(self.silent_after_s + margin)
        return self._reported_loss

    def publish_failure(self, line: str, status: int) -> None:
        """Put this rank's collective-work failure into the verdict, so every peer ends too."""
        self._raising.set()
        try:
            self.board.propose(PeerLoss(failed=self.board.rank, failed_line=line, failed_status=status))
        except Exception:  # noqa: BLE001 - the error itself matters more than telling the peers
            pass

    def stop(self, after_loss: bool = False, own_error: bool = False) -> None:
        """End the threads and mark this rank as left; its own error goes into the verdict so blocked peers stop at
        once."""
        self._left_after_loss = after_loss or self._answer is not None
        self._own_error = own_error and not self._left_after_loss
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2 * self.interval_s + 1)

    def linger(self) -> None:
        """The store's host waits (bounded) for every other rank to leave, then closes its connection."""
        if any(thread.is_alive() for thread in self._threads):
            return
        try:
            if self.hosts_store and not self._reported.is_set():
                self._wait_for_everyone_to_leave(self._answer)
        except Exception:  # noqa: BLE001 - a store that failed at the very end changes nothing
            pass
        close = getattr(self.board.store, "close", None)
        if close is not None:
            close()


    def _heartbeat(self) -> None:
        watch = StallWatch(self.stall_timeout_s)
        try:
            while not self._stop.is_set() and not self._reported.is_set():
                if self._suspect.is_set() and not self._answer_ready.is_set():
                    self._settle()
                    self._answer = find_lost_peers(self.board, self.clock, time.sleep, self.silent_after_s,
                                                   self.interval_s / 2)
                    self._answer_ready.set()
                    continue
                self.board.beat()
                verdict = self.board.verdict()
                neighbour = self.board.read([self.neighbour])[self.neighbour]
                previous_answer, self._answered_at = self._answered_at, self.clock()
                if not self._suspect.is_set():
                    if verdict is not None and verdict.failed is not None:
                        self._peer_failed(verdict)
                    elif verdict is not None:
                        self._blame(verdict, since=previous_answer)
                    elif self.stall_timeout_s > 0 and watch.stalled(neighbour, self._answered_at):
                        # the neighbour only looks still to a rank that slept: ask before proposing
                        paused = self._own_pause(watch.since)
                        if paused is not None:
                            self._report(paused, mark=False)
                        else:
                            self._report(self.board.propose(PeerLoss(silent=(self.neighbour,))))
                self._stop.wait(self.interval_s)
            if not self._reported.is_set():
                if self._own_error:
                    self.board.propose(PeerLoss(exited=(self.board.rank,)))
                self.board.leave(self._left_after_loss)
        except Exception:  # noqa: BLE001 - any store failure means the store's host is gone
            if self._stop.is_set() or self._reported.is_set():
                return
            if self._suspect.is_set():
                self._answer = PeerLoss(store_host=self.store_host)
                self._answer_ready.set()
            else:
                self._blame(PeerLoss(store_host=self.store_host), since=self._answered_at, mark=False)

    def _peer_failed(self, verdict: PeerLoss) -> None:
        """A peer's failure verdict, reported after `failure_grace_s` unless this rank raises too."""
        if verdict.failed == self.board.rank or self._raising.is_set():
            return
        if self._failure_seen_at is None:
            self._failure_seen_at = self.clock()
        elif self.clock() - self._failure_seen_at >= self.failure_grace_s:
            self._report(verdict)

    def _settle(self) -> None:
        settle_until = self._suspected_at + self.settle_s
        while not self._stop.is_set() and self.clock() < settle_until:
            self._stop.wait(settle_until - self.clock())

    def _wait_for_everyone_to_leave(self, loss: Optional[PeerLoss]) -> None:
        """The store's host waits (bounded) for every rank but the lost ones to leave."""
        lost = set(loss.silent + loss.exited) if loss is not None else set()
        others = [rank for rank in range(self.board.world_size) if rank != self.board.rank and rank not in lost]
        deadline = self.clock() + FINISH_WAIT_S
        while self.clock() < deadline:
            beats = self.board.read(others)
            if all(value < 0 for value in beats.values()):
                return
            time.sleep(self.interval_s / 10)

    def _watch_store(self) -> None:
        while not self._stop.wait(self.interval_s) and not self._reported.is_set():
            woke_at = self.clock()
            gap = woke_at - self._awake_at
            if gap >= self._pause_s:
                self._last_pause = (gap, woke_at)
            if self.stall_timeout_s <= gap:
                self._report(PeerLoss(paused_for_s=gap), mark=False)
                return
            self._awake_at = woke_at
            if self._suspect.is_set():
                continue
            if self.clock() - self._answered_at >= self.stall_timeout_s:
                self._blame(PeerLoss(store_host=self.store_host), since=self._answered_at, mark=False)

    # A rank that was itself stopped must not blame a healthy peer: a pause since the silence began is the report
    # instead.
    def _paused_since(self, since: float) -> Optional[float]:
        if self.stall_timeout_s <= 0:
            return None
        length, ended_at = self._last_pause
        ongoing = self.clock() - self._awake_at
        if ongoing >= self._pause_s:
            return max(ongoing, length) if ended_at >= since else ongoing
        return length if ended_at >= since else None

    def _own_pause(self, since: float) -> Optional[PeerLoss]:
        paused_for = self._paused_since(since)
        return None if paused_for is None else PeerLoss(paused_for_s=paused_for)

    def _blame(self, loss: PeerLoss, since: float, mark: bool = True) -> None:
        """Report `loss` unless this process itself paused since `since`; then report the pause."""
        paused = self._own_pause(since)
        if paused is not None:
            self._report(paused, mark=False)
        else:
            self._report(loss, mark)

    def _report(self, loss: PeerLoss, mark: bool = True) -> None:
        with self._report_lock:
            if self._reported.is_set() or self._explained:
                return
            self._reported.set()
            self._reported_loss = loss
        if mark:  # this rank leaves because of the loss, not as its cause
            try:
                self.board.leave(after_loss=True)
                if self.hosts_store:
                    self._wait_for_everyone_to_leave(loss)
            except Exception:  # noqa: BLE001 - the report matters more than the mark
                pass
        try:
            self.on_lost(loss)
        finally:
            self._report_done.set()


def start_liveness(rank: int, world_size: int, master_addr: str, master_port: int,
                   environ: Optional[dict] = None, *, stall_timeout_s: float,
                   on_lost: Callable[[PeerLoss], None]) -> Liveness:
    environ = os.environ if environ is None else environ
    agent = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    connection = StoreConnection(master_addr, master_port)
    store = GuardedStore(connect_store_client(master_addr, master_port, STORE_TIMEOUT_S), connection)
    store_host = (f"the rendezvous store at {master_addr}:{master_port} (torchrun's agent)" if agent
                  else "rank 0 (it hosts the rendezvous store)")
    # The store outlives a run, so each run keys under its attempt and run number.
    attempt = f"zero_gpt/liveness/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    run = (store.add(f"{attempt}arrivals", 1) - 1) // world_size
    prefix = f"{attempt}{run}/"
    return Liveness(store, rank, world_size, prefix=prefix, store_host=store_host,
                    hosts_store=rank == 0 and not agent, stall_timeout_s=stall_timeout_s,
                    on_lost=on_lost).start()
