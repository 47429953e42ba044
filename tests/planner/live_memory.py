"""What the planner's live memory tests share (tests/planner/test_plan_*_live.py): launch pretrain_gpt.py on every
rank, read rank 0's line after iteration 1 (training/memory_report.py FirstIterationMemory, training/metrics.py
MemoryCheck) and the measured/predicted ratio it gives over all ranks."""

from __future__ import annotations

import contextlib
import io
import re

from tests.distributed import run_distributed


def launch_rank(rank, world_size, argv):
    import pretrain_gpt

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = pretrain_gpt.main(argv)
    assert status == 0, f"rank {rank}: exit {status}: {err.getvalue()[-2000:]}"  # the run's own line says why
    return out.getvalue()


def measured_over_predicted(world: int, argv: list[str]) -> tuple[str, float, float]:
    """(the line, the lowest and the highest measured/predicted over the `world` ranks) of a live run of `argv`."""
    outputs = run_distributed(launch_rank, world, argv, timeout=600)
    line = next(line for line in outputs[0].splitlines() if "memory after iteration 1" in line)
    ratios = re.search(rf"over all {world} ranks measured .*?, measured/predicted (\d+\.\d+)-(\d+\.\d+)" if world > 1
                       else r"measured/predicted (\d+\.\d+)()", line)
    assert ratios, line  # a prediction for every rank, and a ratio (not a difference in MiB)
    low = float(ratios.group(1))
    return line, low, float(ratios.group(2) or low)
