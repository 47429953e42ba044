"""Who prints an error met after the process group exists: each rank that raised posts its line to the rendezvous store;
if every rank posted the same line rank 0 prints it plainly, else the lowest such rank prints it once, naming the ranks.
A rank the store cannot answer prints its own line."""

from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from base.errors import Reporter

# A rank blocked in a collective waiting for the failing one never posts; this is what its silence costs.
AGREEMENT_WAIT_S = 5.0
POLL_S = 0.05
STORE_ANSWER_S = 2.0


def ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(str(r) for r in ranks)}"


def agree_on_failure(store, prefix: str, rank: int, world_size: int, line: str, place: str, *,
                     wait_s: float = AGREEMENT_WAIT_S, clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> Reporter:
    """Post this rank's `line` and decide who prints it. The store is asked from a daemon thread, so a store that never
    answers costs STORE_ANSWER_S beyond the wait."""
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
