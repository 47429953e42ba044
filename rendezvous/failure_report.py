"""Who prints an error met after the process group exists: every rank met it, or only some did.

Before the grid every rank reads the same flags and files and meets the same bad input, so rank 0 alone
prints it (base/errors.py). After it, an error may be this rank's alone (a checkpoint slice only TP rank 1
reads; a fault injected on rank 1), and a rank that waits for rank 0 to print it hides it. So each rank
that raised posts its line to the launch's rendezvous store (the one the heartbeats use, parallel/
liveness.py; it answers while other ranks are hung or dead) and waits, at most AGREEMENT_WAIT_S, for the
others' posts:

- every rank posted the same line: the error was everyone's, and rank 0 prints it plainly, as before;
- otherwise the lowest rank of those that posted this same line prints it once, naming them: "rank 1
  (TP 1/2, PP 0/1, DP 0/1, CP 0/1, EP 0/1): ..." for one, "ranks 1, 3: ..." for several.

A rank that cannot reach the store, or whose store does not answer (its host stopped: a call to it blocks,
rendezvous/store_wire.py), prints its own line: a line said twice beats a line said by nobody.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from base.errors import Reporter

# Ranks that met an error every rank meets raise it within one collective of each other; a rank blocked in a
# collective waiting for the failing one never posts, and this is what its silence costs.
AGREEMENT_WAIT_S = 5.0
POLL_S = 0.05
STORE_ANSWER_S = 2.0  # beyond the wait, how long the store's calls may take before this rank speaks alone


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(str(r) for r in ranks)}"


def agree_on_failure(store, prefix: str, rank: int, world_size: int, line: str, place: str, *,
                     wait_s: float = AGREEMENT_WAIT_S, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> Reporter:
    """Post this rank's `line` under `prefix` in `store` and decide who prints it (see the module).
    `place` is this rank's "rank 1 (TP 1/2, ...)". The store is asked from a daemon thread, so that a store
    that never answers costs STORE_ANSWER_S beyond the wait, not the line."""
    decided: list[Optional[Reporter]] = [None]

    def ask() -> None:
        decided[0] = _agree(store, prefix, rank, world_size, line, place, wait_s, clock, sleep)

    asking = threading.Thread(target=ask, name="failure-report", daemon=True)
    asking.start()
    asking.join(wait_s + STORE_ANSWER_S)
    return decided[0] or Reporter(speaks=True, place=place)


def _agree(store, prefix: str, rank: int, world_size: int, line: str, place: str, wait_s: float,
           clock: Callable[[], float], sleep: Callable[[float], None]) -> Reporter:
    keys = [f"{prefix}failure/{r}" for r in range(world_size)]
    try:
        store.set(keys[rank], line)
        deadline = clock() + wait_s
        while not store.check(keys) and clock() < deadline:
            sleep(POLL_S)
        posted = {r: store.multi_get([key])[0].decode() for r, key in enumerate(keys) if store.check([key])}
    except Exception:  # noqa: BLE001 - a store that does not answer: this rank speaks for itself
        return Reporter(speaks=True, place=place)
    same = sorted(r for r, text in posted.items() if text == line)
    if len(same) == world_size:
        return Reporter(speaks=rank == 0, place="")
    return Reporter(speaks=rank == same[0], place=place if same == [rank] else ranks_text(same))
