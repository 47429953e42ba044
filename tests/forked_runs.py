"""pretrain_gpt.py runs on gloo ranks forked from tests/distributed.py's server, for the tests that compare a layout's
logged iterations with another's (the layout fuzz's properties, scripts/tools/layout_fuzz.py's COMMON flags).

scripts/timed_launch.py's `launch`, which those tests used, starts a launcher and a fresh interpreter a rank: importing
torch and the project took ~2.5 s of CPU a process, most of such a test's time on the 2-core CI machine. Here each run
gets fresh processes too (a run_distributed of its own: nothing of one run is left in the next), forked from a server
that imported them once. What comes back is what `launch` kept: the metrics records of the iterations (those with a
step time); a run that does not exit 0 fails the test with its ranks' tracebacks. `forked_launch` is `launch` itself
on forked ranks (its exit status and last stderr line too), for a test that runs a script taking `launch`."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Optional, Sequence

from scripts.timed_launch import Launched, step_records
from tests.distributed import run_distributed


def _train(rank: int, world_size: int, argv: list[str]) -> None:
    import pretrain_gpt

    assert pretrain_gpt.main(argv) == 0


def logged_iterations(workdir: Path, name: str, argv: list[str], ranks: int, timeout: float = 600) -> list[dict]:
    """pretrain_gpt.py's `argv` on `ranks` ranks, its metrics in workdir/<name>.jsonl: the iterations' records."""
    metrics = Path(workdir) / f"{name}.jsonl"
    run_distributed(_train, ranks, [*map(str, argv), "--metrics-file", str(metrics)], timeout=timeout)
    return step_records(metrics)


def _exit_status(rank: int, world_size: int, argv: list[str]) -> tuple[int, str]:
    import pretrain_gpt

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = pretrain_gpt.main(argv)
    lines = err.getvalue().strip().splitlines()
    return code, lines[-1] if lines else ""


def forked_launch(argv: Sequence[str], ranks: int, scratch: Path, one_thread: bool = True,
                  timeout_s: Optional[float] = None):
    """scripts/timed_launch.py's `launch` (its arguments, its Launched) with the ranks forked: the first nonzero exit
    status of a rank, and that rank's last stderr line. Each rank runs on one thread (tests/distributed.py), as
    `one_thread` asks; a rank that raises, or a launch past `timeout_s`, fails the test."""
    metrics = Path(scratch) / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    statuses = run_distributed(_exit_status, ranks, [*map(str, argv), "--metrics-file", str(metrics)],
                               timeout=timeout_s or 600)
    code, last = next(((code, last) for code, last in statuses if code), (0, statuses[0][1]))
    return Launched(code, step_records(metrics), last or "(no output)")
