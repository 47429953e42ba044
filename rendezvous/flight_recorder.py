"""A hang traced to its collective: each rank's ring of collectives (rendezvous/collective_log.py) and all its
threads' Python stacks, written to --flight-recorder-dump-path when the heartbeat watch or a failed collective
ends the run, and the one analysis that names where the ranks of each group disagree.

Megatron-LM's flags (megatron/training/initialize.py, _initialize_distributed) only export PyTorch's Flight
Recorder variables for NCCL: TORCH_FR_DUMP_TEMP_FILE (the dump path; a directory gets the per-rank prefix
`<dir>/_dump_`), TORCH_NCCL_TRACE_BUFFER_SIZE (--flight-recorder-trace-buffer-size; exported here under
torch 2.13's name for it, TORCH_FR_BUFFER_SIZE, since the old one warns on every rank), TORCH_NCCL_DUMP_ON_TIMEOUT,
TORCH_INCLUDE_STACK_TRACE, TORCH_INCLUDE_ONLY_ACTIVE, TORCH_NCCL_EXTRA_DUMP_ON_EXEC. The same variables are
exported here (for a CUDA run's NCCL), and the same record is kept for every backend, gloo included, by the
Communicator: one JSON file per rank, `<prefix><rank>.json`, and its stacks, `<prefix><rank>.stacks`.

Stacks come from faulthandler, which writes from C: `dump_traceback(all_threads=True)` at the dump, and a
watch armed again every second by a thread (`StackWatch`): when this process's Python does not run for the
heartbeat timeout (a thread holding the GIL), faulthandler's own C thread writes every thread's stack anyway.

    python -m rendezvous.flight_recorder DUMP_PATH      # re-reads the dumps and prints the analysis
"""

from __future__ import annotations

import dataclasses
import faulthandler
import glob
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from rendezvous.collective_log import COMPLETED, CollectiveLog

DIRECTORY_PREFIX = "_dump_"  # Megatron-LM's per-rank prefix inside a directory dump path
# How long a rank that reports a loss waits for the other live ranks' summaries in the store.
GATHER_WAIT_S = 5.0


@dataclass(frozen=True)
class FlightRecorderSettings:
    """Megatron-LM's --flight-recorder-* flags (megatron/training/arguments.py)."""
    dump_path: Optional[str] = None
    trace_buffer_size: int = 2000
    dump_on_timeout: bool = True
    include_stack_trace: bool = False
    include_only_active: bool = True
    extra_dump_on_exec: bool = True

    @property
    def on(self) -> bool:
        return self.dump_path is not None


def dump_prefix(dump_path: str) -> str:
    """The per-rank file prefix: Megatron's `<dir>/_dump_` for a directory (made when the path ends in a
    separator), else the path itself as the prefix (PyTorch's TORCH_FR_DUMP_TEMP_FILE)."""
    if dump_path.endswith(os.sep):
        os.makedirs(dump_path, exist_ok=True)
    if os.path.isdir(dump_path):
        return os.path.join(dump_path, DIRECTORY_PREFIX)
    return dump_path


DUMP_PATH_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def with_environment_path(settings: FlightRecorderSettings, environ) -> tuple[FlightRecorderSettings, list[str]]:
    """Megatron-LM takes the dump path from the flag or, without it, from PyTorch's variables
    (megatron/training/initialize.py: `args.flight_recorder_dump_path or os.environ.get('TORCH_FR_DUMP_TEMP_FILE')
    or os.environ.get('TORCH_NCCL_DEBUG_INFO_TEMP_FILE')`); the recorder is then on, said in one line."""
    if settings.on:
        return settings, []
    for name in DUMP_PATH_VARIABLES:
        if environ.get(name):
            return dataclasses.replace(settings, dump_path=environ[name]), [
                f"flight recorder: on, its dumps prefixed {environ[name]} from {name} in the environment, as Megatron-LM "
                f"takes it without --flight-recorder-dump-path"]
    return settings, []


def check_dump_path(dump_path: str) -> None:
    """Before any work: the dumps' directory exists (a path ending in a separator is made) and is writable,
    so that a hang hours later does not find it missing."""
    directory = os.path.dirname(dump_prefix(dump_path)) or "."
    if not (os.path.isdir(directory) and os.access(directory, os.W_OK)):
        raise NotADirectoryError(f"--flight-recorder-dump-path {dump_path}: {directory} is not a writable directory "
                                 f"(end the path with / to have it made)")


def torch_environment(settings: FlightRecorderSettings, environ: dict) -> list[str]:
    """Export PyTorch's Flight Recorder variables as Megatron-LM does (a variable already set wins); the
    names of those it kept from the environment."""
    if not settings.on:
        return []
    prefix = dump_prefix(settings.dump_path)
    values = {"TORCH_FR_DUMP_TEMP_FILE": prefix, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
              "TORCH_FR_BUFFER_SIZE": str(settings.trace_buffer_size),
              "TORCH_NCCL_DUMP_ON_TIMEOUT": str(int(settings.dump_on_timeout)),
              "TORCH_INCLUDE_STACK_TRACE": str(int(settings.include_stack_trace)),
              "TORCH_INCLUDE_ONLY_ACTIVE": str(int(settings.include_only_active)),
              "TORCH_NCCL_EXTRA_DUMP_ON_EXEC": str(int(settings.extra_dump_on_exec))}
    kept = [name for name in values if name in environ]
    for name, value in values.items():
        environ.setdefault(name, value)
    return kept


def summary(log: CollectiveLog, rank: int, iteration: Optional[int]) -> dict:
    """What one rank says of itself in the analysis: per group, its members and its newest collective."""
    return {"rank": rank, "iteration": iteration, "members": {name: list(ranks) for name, ranks in log.members.items()},
            "groups": log.last_per_group(), "waiting_p2p": log.waiting_p2p()[-2:]}


def write_dump(log: CollectiveLog, settings: FlightRecorderSettings, rank: int, world_size: int,
               iteration: Optional[int], reason: str) -> str:
    """This rank's ring (JSON) and all its threads' stacks; the JSON file's path."""
    prefix = dump_prefix(settings.dump_path)
    path = f"{prefix}{rank}.json"
    record = {**summary(log, rank, iteration), "world_size": world_size, "reason": reason, "time": time.time(),
              "entries": log.to_records(only_active=settings.include_only_active), "recorded": log.count}
    with open(path + ".tmp", "w") as file:
        json.dump(record, file)
    os.replace(path + ".tmp", path)
    with open(f"{prefix}{rank}.stacks", "a") as file:
        file.write(f"--- rank {rank}: {reason} ---\n")
        file.flush()
        faulthandler.dump_traceback(file=file, all_threads=True)
    return path


def read_dumps(dump_path: str) -> dict[int, dict]:
    prefix = dump_prefix(dump_path)
    dumps = {}
    for path in glob.glob(glob.escape(prefix) + "*.json"):
        if re.fullmatch(r"\d+", path[len(prefix):-len(".json")]):
            with open(path) as file:
                record = json.load(file)
            dumps[record["rank"]] = record
    return dumps


def _span(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ",".join(map(str, ranks))


def analyze(summaries: dict[int, dict], world_size: int, silent: Sequence[int] = (), quiet: Sequence[int] = ()) -> str:
    """One line: per group, where its ranks stand ('ep group (0-3): ranks 0-2 wait in all_to_all #411
    (gpt/moe/dispatch.py:88 in dispatch), rank 3 last completed #410 or later'); a rank with no summary (silent,
    stopped, dead) is placed by what its peers completed: a collective completes on a rank only once every
    member entered it (a broadcast's source excepted). Groups where every rank with a record stands at the same completed collective are left out."""
    parts = []
    for group in sorted({name for record in summaries.values() for name in record["groups"]}):
        instances: dict[tuple[int, ...], list[int]] = {}
        for rank, record in summaries.items():
            if group in record["groups"]:
                members = tuple(record["members"].get(group) or range(world_size))
                instances.setdefault(members, []).append(rank)
        for members, reporting in sorted(instances.items()):
            part = _group_line(group, members, {rank: summaries[rank]["groups"][group] for rank in reporting})
            if part:
                parts.append(part)
    for rank, record in sorted(summaries.items()):  # a pipeline stage blocked on its neighbour
        for message in record.get("waiting_p2p", []):
            parts.append(f"rank {rank} waits in {message['kind']} #{message['seq']} of the {message['group']} "
                         f"group ({message['site']})")
    silent_part = f"{_span(silent)} silent (no record)" if silent else ""
    # alive (beating) but it shared nothing: stuck outside any collective, where only its stacks can tell
    quiet_part = f"{_span(quiet)} alive but shared no record (stuck outside a collective? see its stacks)" if quiet \
        else ""
    return "; ".join(part for part in [silent_part, quiet_part, *parts] if part) \
        or "every rank completed the same collectives"


def own_position(record: dict, world_size: int) -> str:
    """This rank's newest collective in each group, with nothing to compare it with."""
    parts = []
    for group, state in sorted(record["groups"].items()):
        members = _span(record["members"].get(group) or range(world_size)).split(" ", 1)[1]
        last = state["last"]
        doing = (f"in {last['kind']} #{last['seq']} ({last['site']})" if last["state"] == "started"
                 else f"last completed {last['kind']} #{last['seq']}")
        parts.append(f"{group} group ({members}): this rank {doing}")
    for message in record.get("waiting_p2p", []):
        parts.append(f"this rank waits in {message['kind']} #{message['seq']} of the {message['group']} group "
                     f"({message['site']})")
    return "; ".join(parts) or "no collective recorded"


def _group_line(group: str, members: tuple[int, ...], states: dict[int, dict]) -> str:
    where: dict[tuple, list[int]] = {}
    for rank, state in states.items():
        last = state["last"]
        key = (last["state"], last["seq"], last["kind"], last["site"] if last["state"] == "started" else "")
        where.setdefault(key, []).append(rank)
    missing = [rank for rank in members if rank not in states]
    if len(where) == 1 and next(iter(where))[0] == "completed":
        return ""  # the ranks that speak agree and none waits: nothing a missing rank could hold up here
    pieces = []
    for (state, seq, kind, site), ranks in sorted(where.items(), key=lambda item: (item[0][1], item[0][0])):
        verb = "wait" if len(ranks) > 1 else "waits"
        if state == "started":
            pieces.append(f"{_span(ranks)} {verb} in {kind} #{seq} ({site})")
        else:
            pieces.append(f"{_span(ranks)} last completed {kind} #{seq}")
    if missing:
        reached = max(state["completed"] for state in states.values())
        pieces.append(f"{_span(missing)} last completed #{reached} or later (its peers completed it; no record "
                      f"of its own)" if reached else f"{_span(missing)}: no record")
    return f"{group} group ({_span(members).split(' ', 1)[1]}): " + ", ".join(pieces)


class FlightRecorder:
    """One rank's recorder in a run: the log the Communicator fills, the stack watch, and the report made
    when a rank is lost or a collective fails."""

    def __init__(self, settings: FlightRecorderSettings, log: CollectiveLog, rank: int, world_size: int,
                 stack_watch: Optional["StackWatch"] = None) -> None:
        self.settings, self.log, self.rank, self.world_size = settings, log, rank, world_size
        self.stack_watch = stack_watch
        self._reported = threading.Lock()

    def report(self, reason: str, iteration: Optional[int], silent: Sequence[int] = (), exited: Sequence[int] = (),
               store=None, key_prefix: str = "") -> str:
        """Dump (unless --no-flight-recorder-dump-on-timeout), share this rank's summary through the
        rendezvous store, wait briefly for the other live ranks' summaries, and return the analysis for
        the line ('' when another thread of this rank reported already)."""
        if not self._reported.acquire(blocking=False):
            return ""
        dumped = ""
        if self.settings.dump_on_timeout:
            try:
                write_dump(self.log, self.settings, self.rank, self.world_size, iteration, reason)
                dumped = f" (dumps: {dump_prefix(self.settings.dump_path)}<rank>.json and .stacks)"
            except OSError as error:
                dumped = f" (no dump: {error.strerror or error})"
        mine = summary(self.log, self.rank, iteration)
        if store is None:  # nobody to compare with (this rank was stopped, or the store went): where it stands
            return "flight recorder: " + own_position(mine, self.world_size) + dumped
        summaries = {self.rank: mine}
        # a rank that exited on its own error shared its record first when it came out of a collective
        others = [r for r in range(self.world_size) if r != self.rank and r not in silent]
        summaries.update(_exchange(store, key_prefix, self.rank, mine, others))
        quiet = [r for r in others if r not in summaries and r not in exited]
        return "flight recorder: " + analyze(summaries, self.world_size, sorted(silent), quiet) + dumped

    def dump_on_error(self, iteration: Optional[int]) -> None:
        """--flight-recorder-extra-dump-on-exec: this rank failed on an error of its own."""
        if self.settings.extra_dump_on_exec and self._reported.acquire(blocking=False):
            try:
                write_dump(self.log, self.settings, self.rank, self.world_size, iteration, "an error of this rank's own")
            except OSError:
                pass  # the error itself is what the rank reports

    def in_collective(self) -> bool:
        """Whether this rank's newest collective never completed: an error now came out of it (a collective
        timeout, with every peer alive: a peer stuck elsewhere, or the ranks in different collectives)."""
        entries = self.log.entries()
        return bool(entries) and entries[-1][COMPLETED] is None

    def report_failed_collective(self, iteration: Optional[int], store, key_prefix: str) -> str:
        """Every peer is alive and this rank's collective failed (its timeout): the same dump, exchange and
        analysis as for a lost rank, over every rank; a rank that shares nothing within GATHER_WAIT_S is
        named as alive but silent about its collectives."""
        return self.report("a collective failed with every peer alive (its timeout)", iteration, (), (), store,
                           key_prefix)

    def stop(self) -> None:
        if self.stack_watch is not None:
            self.stack_watch.stop()


def _exchange(store, key_prefix: str, rank: int, mine: dict, others: Sequence[int]) -> dict[int, dict]:
    """Publish this rank's summary; read the others' as they arrive, for up to GATHER_WAIT_S. A store
    that fails (its host is the lost rank) leaves only what was read."""
    found: dict[int, dict] = {}
    try:
        store.set(f"{key_prefix}flight/{rank}", json.dumps(mine))
        deadline = time.monotonic() + GATHER_WAIT_S
        while len(found) < len(others) and time.monotonic() < deadline:
            for other in others:
                key = f"{key_prefix}flight/{other}"
                if other not in found and store.check([key]):
                    found[other] = json.loads(store.multi_get([key])[0])
            time.sleep(0.1)
    except Exception:  # noqa: BLE001 - the analysis goes on with the summaries it has
        pass
    return found


def start_flight_recorder(settings: FlightRecorderSettings, comm, rank: int, world_size: int,
                          stack_timeout_s: float) -> FlightRecorder:
    """Give the Communicator its ring and start the stack watch (when the heartbeat watch is on and dumps are
    written)."""
    check_dump_path(settings.dump_path)
    log = comm.log if comm.log is not None else CollectiveLog(settings.trace_buffer_size)
    log.capacity = settings.trace_buffer_size
    log.ring = [None] * settings.trace_buffer_size
    comm.log = log
    watch = None
    if stack_timeout_s > 0 and settings.dump_on_timeout:
        watch = StackWatch(f"{dump_prefix(settings.dump_path)}{rank}.stacks", stack_timeout_s).start()
    return FlightRecorder(settings, log, rank, world_size, watch)


class StackWatch:
    """Every second re-arms faulthandler's watch (`dump_traceback_later`, a C thread that needs no GIL):
    if this process's Python does not run for `timeout_s` -- a thread holding the GIL -- every thread's
    stack is written to the rank's .stacks file anyway. A file left empty is removed at the end."""

    def __init__(self, path: str, timeout_s: float, interval_s: float = 1.0) -> None:
        self.path, self.timeout_s, self.interval_s = path, timeout_s, interval_s
        self.file = open(path, "a")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flight-recorder-stack-watch", daemon=True)

    def start(self) -> "StackWatch":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self.file, exit=False)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 1)
        faulthandler.cancel_dump_traceback_later()
        self.file.close()
        try:
            if os.path.getsize(self.path) == 0:
                os.remove(self.path)
        except OSError:
            pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m rendezvous.flight_recorder DUMP_PATH (a --flight-recorder-dump-path)", file=sys.stderr)
        return 2
    dumps = read_dumps(argv[0])
    if not dumps:
        print(f"rendezvous.flight_recorder: error: no rank dumps under {argv[0]}", file=sys.stderr)
        return 2
    world_size = max(record["world_size"] for record in dumps.values())
    absent = [rank for rank in range(world_size) if rank not in dumps]
    print(f"flight recorder: {len(dumps)} of {world_size} ranks dumped ({', '.join(sorted({r['reason'] for r in dumps.values()}))})")
    print(analyze(dumps, world_size, absent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
