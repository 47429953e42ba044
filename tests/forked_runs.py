"""pretrain_gpt.py runs on gloo ranks forked from tests/distributed.py's server, for the tests that compare a layout's
logged iterations with another's (the layout fuzz's properties, scripts/layout_fuzz.py's COMMON flags).

scripts/timed_launch.py's `launch`, which those tests used, starts a launcher and a fresh interpreter a rank: importing
torch and the project took ~2.5 s of CPU a process, most of such a test's time on the 2-core CI machine. Here each run
gets fresh processes too (a run_distributed of its own: nothing of one run is left in the next), forked from a server
that imported them once. What comes back is what `launch` kept: the metrics records of the iterations (those with a
step time); a run that does not exit 0 fails the test with its ranks' tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

from tests.distributed import run_distributed


def _train(rank: int, world_size: int, argv: list[str]) -> None:
    import pretrain_gpt

    assert pretrain_gpt.main(argv) == 0


def logged_iterations(workdir: Path, name: str, argv: list[str], ranks: int, timeout: float = 600) -> list[dict]:
    """pretrain_gpt.py's `argv` on `ranks` ranks, its metrics in workdir/<name>.jsonl: the iterations' records."""
    metrics = Path(workdir) / f"{name}.jsonl"
    run_distributed(_train, ranks, [*map(str, argv), "--metrics-file", str(metrics)], timeout=timeout)
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line]
    return [record for record in records if "iter_time_s" in record]
