"""Checks every rank runs before any work, ending in an agreement: the first expected error any rank met is raised on
every rank.
"""

from __future__ import annotations

from typing import Callable, Optional

from base.errors import ALWAYS_EXPECTED
from data import DataError
from parallel.state import ParallelState

EXPECTED = ALWAYS_EXPECTED + (DataError,)


def agree(state: ParallelState, error: Optional[BaseException]) -> None:
    """Raise on every rank the first error (in rank order) that any rank met."""
    errors = state.comm.all_gather_object(error)
    for rank, failure in enumerate(errors):
        if failure is not None:
            raise error if rank == state.rank else failure


def attempt(action: Callable[[], object]) -> tuple[object, Optional[BaseException]]:
    """(the action's result, None), or (None, the expected error it raised) to pass to `agree`."""
    try:
        return action(), None
    except EXPECTED as error:
        return None, error
