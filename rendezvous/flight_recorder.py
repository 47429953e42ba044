"""A hang traced to its collective: each rank's ring of collectives and its threads' stacks are dumped to
--flight-recorder-dump-path when a lost peer or failed collective ends the run, and one analysis names where each
group's ranks disagree. PyTorch's Flight Recorder variables are exported as Megatron-LM does.

python -m rendezvous.flight_recorder DUMP_PATH   # prints the analysis again"""

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

DIRECTORY_PREFIX = "_dump_"
# How long a reporting rank waits for the other live ranks' summaries.
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
    """The per-rank file prefix: `<dir>/_dump_` for a directory, else the path itself (TORCH_FR_DUMP_TEMP_FILE)."""
    if dump_path.endswith(os.sep):
        os.makedirs(dump_path, exist_ok=True)
    if os.path.isdir(dump_path):
        return os.path.join(dump_path, DIRECTORY_PREFIX)
    return dump_path


DUMP_PATH_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def with_environment_path(settings: FlightRecorderSettings, environ) -> tuple[FlightRecorderSettings, list[str]]:
    """Without the flag, the dump path comes from TORCH_FR_DUMP_TEMP_FILE or TORCH_NCCL_DEBUG_INFO_TEMP_FILE, as in
    Megatron-LM; said in one line."""
    if settings.on:
        return settings, []
    for name in DUMP_PATH_VARIABLES:
        if environ.get(name):
            return dataclasses.replace(settings, dump_path=environ[name]), [
                f"flight recorder: on, its dumps prefixed {environ[name]} from {name} in the environment, as Megatron-LM "
                f"takes it without --flight-recorder-dump-path"]
    return settings, []


def check_dump_path(dump_path: str) -> None:
    """Before any work: the dumps' directory exists and is writable, so a hang hours later does not find it missing."""
    directory = os.path.dirname(dump_prefix(dump_path)) or "."
    if not (os.path.isdir(directory) and os.access(directory, os.W_OK)):
        raise NotADirectoryError(f"--flight-recorder-dump-path {dump_path}: {directory} is not a writable directory "
                                 f"(end the path with / to have it made)")


def torch_environment(settings: FlightRecorderSettings, environ: dict) -> list[str]:
    """Export PyTorch's Flight Recorder variables (a variable already set wins); the names of those kept."""
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
    return {"rank": rank, "iteration": iteration, "members": {name: list(ranks) for name, ranks in log.members.items()},
            "groups": log.last_per_group(), "waiting_p2p": log.waiting_p2p()[-2:]}


def write_dump(log: CollectiveLog, settings: FlightRecorderSettings, rank: int, world_size: int,
               iteration: Optional[int], reason: str) -> str:
    """This rank's ring (JSON) and its threads' stacks; the JSON file's path."""
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
    """One line: per group, where its ranks stand; a rank with no summary is placed by what its peers completed (a
    collective completes only once every member entered it). Groups all at the same completed collective are left
    out."""
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
    for rank, record in sorted(summaries.items()):
        for message in record.get("waiting_p2p", []):
            parts.append(f"rank {rank} waits in {message['kind']} #{message['seq']} of the {message['group']} "
                         f"group ({message['site']})")
    silent_part = f"{_span(silent)} silent (no record)" if silent else ""
    # alive but shared nothing: stuck outside any collective, where only its stacks can tell
    quiet_part = f"{_span(quiet)} alive but shared no record (stuck outside a collective? see its stacks)" if quiet \
        else ""
    return "; ".join(part for part in [silent_part, quiet_part, *parts] if part) \
        or "every rank completed the same collectives"


def own_position(record: dict, world_size: int) -> str:
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
        return ""  # the ranks agree and none waits: a missing rank holds nothing up here
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
    """One rank's recorder: the Communicator's log, the stack watch, and the report made when a rank is lost or a
    collective fails."""

    def __init__(self, settings: FlightRecorderSettings, log: CollectiveLog, rank: int, world_size: int,
                 stack_watch: Optional["StackWatch"] = None) -> None:
        self.settings, self.log, self.rank, self.world_size = settings, log, rank, world_size
        self.stack_watch = stack_watch
        self._reported = threading.Lock()

    def report(self, reason: str, iteration: Optional[int], silent: Sequence[int] = (), exited: Sequence[int] = (),
               store=None, key_prefix: str = "") -> str:
        """Dump, share this rank's summary through the store, wait briefly for the others', and return the analysis (''
        when another thread reported already)."""
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
        if store is None:
            return "flight recorder: " + own_position(mine, self.world_size) + dumped
        summaries = {self.rank: mine}
        # a rank that exited on its own error shared its record when it came out of a collective
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
                pass

    def in_collective(self) -> bool:
        """Whether this rank's newest collective never completed (a timeout with every peer alive)."""
        entries = self.log.entries()
        return bool(entries) and entries[-1][COMPLETED] is None

    def report_failed_collective(self, iteration: Optional[int], store, key_prefix: str) -> str:
        """Every peer is alive and this rank's collective timed out: the same dump and analysis over every rank."""
        return self.report("a collective failed with every peer alive (its timeout)", iteration, (), (), store,
                           key_prefix)

    def stop(self) -> None:
        if self.stack_watch is not None:
            self.stack_watch.stop()


def _exchange(store, key_prefix: str, rank: int, mine: dict, others: Sequence[int]) -> dict[int, dict]:
    """Publish this rank's summary and read the others' for up to GATHER_WAIT_S; a failing store leaves what was
    read."""
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
    """Re-arms faulthandler's watch every second (a C thread needing no GIL), so a process whose Python stalls for
    `timeout_s` still writes every thread's stack."""

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
