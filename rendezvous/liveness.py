"""Who stopped answering: a heartbeat per rank in the rendezvous store, so that the survivors of a dead or stalled
peer name it in one line, promptly, instead of a transport's traceback or the collective timeout. Every rank runs a thread with its own client of the rendezvous store (torchrun's agent's TCPStore, or rank 0's):
once a second it adds 1 to its own counter and reads its ring neighbour's counter and the verdict, three small
round trips a second and nothing per collective. Identity never comes from the transport's error text: a rank is
silent when its counter stops moving. A loss is found in one of four ways:
1. A collective raises (gloo notices a closed socket at once): `explain_failure()` reads every counter for up to
   SILENT_AFTER_S; those that did not move are the lost ranks, and the first survivor to conclude writes the verdict
   (compare-and-set: all survivors name the same ranks). If every counter moves, the error is this rank's own.
2. The neighbour's counter stands still for --heartbeat-timeout-seconds while this rank may be blocked in a
   collective only the collective timeout would end (a stopped or hung peer; NCCL never notices a dead one).
3. A verdict appears: another survivor found the loss, or a rank wrote that it fails alone. A verdict may also be
   a peer's error inside collective work (`publish_failure`, parallel/comm.py `collective_work`): a rank whose own
   main thread is not raising too within FAILURE_GRACE_S ends with that peer's status (it may be blocked in a
   collective the failed rank will never join); the failed rank prints the line.
4. The store stops answering: a dead host closes its connections, which an idle socket beside the client sees
   before any call (`StoreConnection`, whose comment tells the window a SIGKILL leaves); a call to a stopped host
   blocks with no timeout, so a second thread, which never touches the store, watches when it last answered.
That watchdog thread also measures this process's own gaps: a rank that was itself stopped and continued reports
its pause rather than blaming a healthy peer (`Liveness._paused_since`). Reporting is the caller's `on_lost(loss)`,
called from a thread while the main thread may be blocked for good. A rank that leaves marks its counter (LEFT, or
LEFT_AFTER_LOSS), so nobody blames a rank that only left first; a store-hosting rank 0 waits for all (`linger`)."""

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
# How long a rank whose collective failed watches the others' counters: a live rank beats about five
# times in this window even on a loaded machine; a dead one not once.
SILENT_AFTER_S = 5.0
# After a collective failed, how long the thread waits before it calls the store: if the store's host
# died, the failure means its kernel is already closing its sockets (gloo's came first), and closing
# the rest takes well under a millisecond each, so after this the idle connection says whether the
# host is gone (a call sent before that would be reset under it; see way 4 in the docstring).
SETTLE_S = 0.25
# How long the store's host waits at the end for the other ranks to leave.
FINISH_WAIT_S = 10.0
# Calls that wait for a key (the client's connect, get) give up after this; add and compare_set to a
# stopped host block regardless, which is why the watchdog thread exists.
STORE_TIMEOUT_S = 30.0
# After a peer published an error of collective work, how long a rank waits for its own main thread to raise as
# well (every rank met it: each reports through rendezvous/failure_report.py) before it ends (it is blocked).
FAILURE_GRACE_S = 2.0
LEFT = -1
LEFT_AFTER_LOSS = -2


class Store(Protocol):
    """The part of torch.distributed.Store used here (a fake one in the tests)."""

    def add(self, key: str, amount: int) -> int: ...
    def set(self, key: str, value: str) -> None: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def multi_get(self, keys: list[str]) -> list[bytes]: ...


class StoreGone(ConnectionError):
    """The store's host closed its connections: it died."""


# A SIGKILLed store host is first silent, then closed: its kernel tears down the process's memory before it closes
# its sockets, in descriptor order (35-120 ms from the kill to the idle connection's close for a torch process on a
# 2-core machine, measured). A call sent in between is neither answered nor refused until the close resets it.
# torch's client would print a dozen lines of C++ warnings above the one line; the threads' client
# (rendezvous/store_wire.py) raises and prints nothing, and the reset reads as the host's loss. Where the server does
# not speak that client's protocol (another torch), torch's client is used, and two rules keep most calls out of the
# window: after a collective failed, the thread waits SETTLE_S before its first call, and the idle socket is opened
# before the store client, so the host closes it first. A round that falls in the window by chance (a few in a
# hundred, each time a store-hosting rank 0 dies) then still prints the warning. Under torchrun the agent hosts the
# store, and a rank's death leaves it answering.
class StoreConnection:
    """An idle TCP connection to the store's port, opened beside the store client. When the host's
    process dies, its kernel closes the connection, and a zero-timeout select sees that without a
    byte sent; the server never hears from this socket, so it has nothing to answer or log."""

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
        except OSError:  # reset
            return True

    def close(self) -> None:
        self.socket.close()


class GuardedStore:
    """A store client whose calls first check the host's connection, and raise StoreGone instead of
    calling a host that died."""

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
        close = getattr(self.store, "close", None)  # ours has one; torch's client closes when collected
        if close is not None:
            close()


@dataclass(frozen=True)
class PeerLoss:
    """Who is gone: ranks whose counter stopped (`silent`), ranks that left on an error of their own
    (`exited`), or the store itself (`store_host`: "rank 0" or the agent's address); or this rank,
    which did not run for `paused_for_s` seconds (stopped, then continued): its peers have given up on
    it; or `failed`, a rank whose collective work raised (its line and the exit status it ends with, which
    its peers take). Only `silent`, `exited` and `failed` go into the verdict; the pause is this rank's own finding."""
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
        """The line: who, what this rank was doing (`where`, from the Communicator), and that it stops."""
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
    """This launch's liveness keys in the store: beat/<rank> (a counter, or LEFT / LEFT_AFTER_LOSS)
    and verdict (a PeerLoss as JSON; empty while nobody is lost)."""

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
        """Counters of `ranks`: one round trip when every key exists (the usual case), else one per
        rank (add 0 creates a missing key instead of waiting for it)."""
        keys = [self.key(rank) for rank in ranks]
        if self.store.check(keys):
            return {rank: int(value) for rank, value in zip(ranks, self.store.multi_get(keys))}
        return {rank: int(self.store.add(key, 0)) for rank, key in zip(ranks, keys)}

    def verdict(self) -> Optional[PeerLoss]:
        # compare_set with an empty expected value creates the key empty, or returns the verdict.
        text = self.store.compare_set(self.verdict_key, "", "")
        return PeerLoss.from_json(text) if text else None

    def propose(self, loss: PeerLoss) -> PeerLoss:
        """Write `loss` unless a verdict is there already; the verdict that stands."""
        return PeerLoss.from_json(self.store.compare_set(self.verdict_key, "", loss.to_json()))


@dataclass
class StallWatch:
    """The neighbour's counter, and since when it has stood still."""
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
    """After a collective failed on this rank: the peers that are gone, agreed through the verdict,
    or None when every peer is alive (the failure is this rank's own). Beats itself while it watches,
    so that the other survivors, watching too, see this rank alive."""
    others = [rank for rank in range(board.world_size) if rank != board.rank]
    started = clock()
    first = board.read(others)
    while True:
        verdict = board.verdict()
        if verdict is not None and verdict.failed != board.rank:  # this rank's own failure is no peer's loss
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
    """The heartbeat and watchdog threads of one rank, and the answer to "who is gone?".

    `on_lost(loss)` is called at most once, from one of the threads, when a loss is found while the
    main thread is not asking (ways 2-4 in the module's docstring); it is expected not to return.
    """

    def __init__(self, store: Store, rank: int, world_size: int, *, prefix: str, store_host: str,
                 hosts_store: bool, stall_timeout_s: float, on_lost: Callable[[PeerLoss], None],
                 silent_after_s: float = SILENT_AFTER_S, interval_s: float = HEARTBEAT_INTERVAL_S,
                 settle_s: float = SETTLE_S, failure_grace_s: float = FAILURE_GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.board = Board(store, prefix, rank, world_size)
        self.store_host = store_host  # how to name the store's host in a line
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
        self._suspect = threading.Event()  # the main thread asks: who is gone?
        self._suspected_at = 0.0  # when it asked: a dying store host's sockets close soon after
        self._answer_ready = threading.Event()
        self._answer: Optional[PeerLoss] = None
        self._reported = threading.Event()  # on_lost was called: the threads are done
        self._report_lock = threading.Lock()
        self._answered_at = clock()  # when the store last answered this rank
        self._awake_at = clock()  # when the watchdog last woke: a long gap means this process did not run
        # The shortest gap between two watchdog wakes that may be why the peers gave up on this rank
        # (see the module's docstring); at least three intervals, so that a wake late on a loaded
        # machine is no pause (--heartbeat-timeout-seconds is at least five intervals).
        self._pause_s = max(stall_timeout_s - 2 * interval_s, 3 * interval_s)
        self._last_pause: tuple[float, float] = (0.0, float("-inf"))  # (its length, when it ended)
        self._reported_loss: Optional[PeerLoss] = None
        self._report_done = threading.Event()  # on_lost returned (only a test's does)
        self._explained = False  # the main thread has its answer: the threads report nothing more
        self._left_after_loss = False
        self._own_error = False
        self._raising = threading.Event()  # this rank's main thread is raising an error of collective work
        self._failure_seen_at: Optional[float] = None  # when a peer's failure verdict was first read
        self._threads: list[threading.Thread] = []

    # ---- the main thread's side -------------------------------------------------------------------

    def start(self) -> "Liveness":
        self.board.beat()  # before the threads, so that a peer's explain_failure finds the key
        self._threads = [threading.Thread(target=self._heartbeat, name="liveness-heartbeat", daemon=True)]
        if self.stall_timeout_s > 0:
            self._threads.append(threading.Thread(target=self._watch_store, name="liveness-watchdog", daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def explain_failure(self) -> Optional[PeerLoss]:
        """Called by the main thread after a collective (or anything) failed: the lost peers, or None
        when every peer is alive. Takes up to SETTLE_S + SILENT_AFTER_S and a little more. A
        continued rank's collective fails the moment it runs again, often before its watchdog has
        woken: a pause of this process in the last timeout is why the peers went, and that is the
        answer."""
        since = self.clock() - self.stall_timeout_s
        margin = self.settle_s + 3 * self.interval_s
        answer = self._own_pause(since)
        if answer is None:
            self._suspected_at = self.clock()
            self._suspect.set()
            if self._answer_ready.wait(self.silent_after_s + margin):
                answer = self._own_pause(since) or self._answer
            elif self.clock() - self._answered_at >= self.silent_after_s:  # blocked on a store that stopped
                answer = self._own_pause(since) or PeerLoss(store_host=self.store_host)
        with self._report_lock:
            if not self._reported.is_set():
                self._explained = True
                if answer is not None and answer.paused_for_s is not None:
                    self._reported.set()  # this rank's own finding: not marked in the store (as _report)
                return answer
        # A thread reported first and its on_lost ends the process: the main thread says nothing else.
        self._report_done.wait(self.silent_after_s + margin)
        return self._reported_loss

    def publish_failure(self, line: str, status: int) -> None:
        """This rank's collective work raised (`line`, ending the process with `status`): into the verdict, unless
        one stands, so that every peer ends too (module docstring, way 3). A store that does not answer leaves
        the peers to the heartbeat's other ways."""
        self._raising.set()
        try:
            self.board.propose(PeerLoss(failed=self.board.rank, failed_line=line, failed_status=status))
        except Exception:  # noqa: BLE001 - the error itself matters more than telling the peers
            pass

    def stop(self, after_loss: bool = False, own_error: bool = False) -> None:
        """End the threads and mark this rank as left: after a loss it found (not to be blamed), or
        after an error of its own, which goes into the verdict so that the peers blocked on this
        rank stop at once and point at its output."""
        self._left_after_loss = after_loss or self._answer is not None
        self._own_error = own_error and not self._left_after_loss
        self._stop.set()
        for thread in self._threads:
            # A heartbeat blocked on a stopped store never returns; the threads are daemons.
            thread.join(timeout=2 * self.interval_s + 1)

    def linger(self) -> None:
        """After stop() and after the process group is gone (so that a peer blocked on this rank
        fails, and reads this rank's mark): the store's host waits, boundedly, until every other rank
        has left too, so that none finds the store gone while it still reads it. Then the store
        connection closes."""
        if any(thread.is_alive() for thread in self._threads):
            return  # blocked on a store that does not answer: nothing to wait for
        try:
            if self.hosts_store and not self._reported.is_set():
                self._wait_for_everyone_to_leave(self._answer)
        except Exception:  # noqa: BLE001 - a store that failed at the very end changes nothing
            pass
        close = getattr(self.board.store, "close", None)
        if close is not None:
            close()

    # ---- the threads ------------------------------------------------------------------------------

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
                    elif verdict is not None:  # written since the last read, maybe while this rank slept
                        self._blame(verdict, since=previous_answer)
                    elif self.stall_timeout_s > 0 and watch.stalled(neighbour, self._answered_at):
                        # the neighbour only looks still to a rank that slept: asked before proposing
                        paused = self._own_pause(watch.since)
                        if paused is not None:
                            self._report(paused, mark=False)
                        else:
                            self._report(self.board.propose(PeerLoss(silent=(self.neighbour,))))
                self._stop.wait(self.interval_s)
            if not self._reported.is_set():  # a report marked the counter already
                if self._own_error:
                    self.board.propose(PeerLoss(exited=(self.board.rank,)))
                self.board.leave(self._left_after_loss)
        except Exception:  # noqa: BLE001 - any store failure means the store's host is gone
            if self._stop.is_set() or self._reported.is_set():
                return
            if self._suspect.is_set():
                self._answer = PeerLoss(store_host=self.store_host)  # explain_failure asks about a pause
                self._answer_ready.set()
            else:  # a paused rank finds the store gone: its host gave up on it
                self._blame(PeerLoss(store_host=self.store_host), since=self._answered_at, mark=False)

    def _peer_failed(self, verdict: PeerLoss) -> None:
        """A failure verdict (module docstring, way 3): nothing while this rank raises too (or wrote it); else
        reported once `failure_grace_s` has passed since it was first read."""
        if verdict.failed == self.board.rank or self._raising.is_set():
            return
        if self._failure_seen_at is None:
            self._failure_seen_at = self.clock()
        elif self.clock() - self._failure_seen_at >= self.failure_grace_s:
            self._report(verdict)

    def _settle(self) -> None:
        """Until SETTLE_S after the main thread asked: a store host that died (its gloo socket failed
        the collective) has closed the idle connection by then, so the guard sees it before a call."""
        settle_until = self._suspected_at + self.settle_s
        while not self._stop.is_set() and self.clock() < settle_until:
            self._stop.wait(settle_until - self.clock())

    def _wait_for_everyone_to_leave(self, loss: Optional[PeerLoss]) -> None:
        """The store's host, before it ends: until every rank but the lost ones has marked its counter
        (bounded), so that none finds the store gone before it has read the verdict or left."""
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
            if gap >= self._pause_s:  # recorded before _awake_at moves, so no reader misses it
                self._last_pause = (gap, woke_at)
            if self.stall_timeout_s <= gap:  # this process did not run for the timeout: say so at once
                self._report(PeerLoss(paused_for_s=gap), mark=False)
                return
            self._awake_at = woke_at
            if self._suspect.is_set():
                continue  # explain_failure judges a silent store itself
            if self.clock() - self._answered_at >= self.stall_timeout_s:
                self._blame(PeerLoss(store_host=self.store_host), since=self._answered_at, mark=False)

    # A rank that was itself stopped (SIGSTOP, a suspended job, a paused VM) and continued must not blame a healthy
    # peer: its peers give up on it after a silence measured from its last beat, which can precede its watchdog's
    # last wake by an interval, and it may be continued the moment they go, so the gap it sees can be up to two
    # intervals short of the timeout. Every blame therefore first asks whether this process had such a gap since the
    # silence it is about to blame began; if so, the pause is the report (`PeerLoss.paused_for_s`).
    def _paused_since(self, since: float) -> Optional[float]:
        """How long this process did not run, when that was at or after `since` (the watchdog, which
        wakes every interval and waits on nothing else, did not wake for `_pause_s`, or has not yet
        woken from such a gap): None when it ran throughout."""
        if self.stall_timeout_s <= 0:
            return None  # no watchdog: nothing measures this process's own gaps
        length, ended_at = self._last_pause
        ongoing = self.clock() - self._awake_at
        if ongoing >= self._pause_s:
            return max(ongoing, length) if ended_at >= since else ongoing
        return length if ended_at >= since else None

    def _own_pause(self, since: float) -> Optional[PeerLoss]:
        paused_for = self._paused_since(since)
        return None if paused_for is None else PeerLoss(paused_for_s=paused_for)

    def _blame(self, loss: PeerLoss, since: float, mark: bool = True) -> None:
        """Report `loss`, a silence that began at `since` (or a verdict read since then), unless this
        process itself did not run in that time: then the report is that, about this rank, and no peer
        or store is blamed. Not marked in the store: its host may be gone by now."""
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
        if mark:  # the store answers: say this rank leaves because of the loss, not as its cause
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
    """Connect a client to the launch's rendezvous store and start this rank's threads."""
    environ = os.environ if environ is None else environ
    agent = environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    # The idle connection first: when rank 0 hosts the store, it accepts this one first, so its end
    # has the lower descriptor there and a killed rank 0 closes it before the client's (see way 4).
    # Under torchrun the agent hosts the store and the order changes nothing.
    connection = StoreConnection(master_addr, master_port)
    store = GuardedStore(connect_store_client(master_addr, master_port, STORE_TIMEOUT_S), connection)
    store_host = (f"the rendezvous store at {master_addr}:{master_port} (torchrun's agent)" if agent
                  else "rank 0 (it hosts the rendezvous store)")
    # The store outlives a run: torchrun's agent keeps it across restarts, and a process that calls
    # init_process_group again (the tests do) gets the same one back. Each run has its own keys: the
    # attempt, and the run's number among those on this store, which every rank's arrival counts.
    attempt = f"zero_gpt/liveness/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    run = (store.add(f"{attempt}arrivals", 1) - 1) // world_size
    prefix = f"{attempt}{run}/"
    return Liveness(store, rank, world_size, prefix=prefix, store_host=store_host,
                    hosts_store=rank == 0 and not agent, stall_timeout_s=stall_timeout_s,
                    on_lost=on_lost).start()
