"""The planner's per-rank peak against a plain data-parallel run's measured peak (DP 2, no dropout), 0.9-1.1 on every
rank, as tests/planner/test_plan_context_parallel_live.py reads it for CP 2 (its docstring: the malloc threshold,
why a ratio). Same model: 8 x 256, sequence 256, micro batch 2, ZeRO 1, 2 gloo ranks.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tests.distributed import run_distributed

LIVE = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "256",
        "--max-position-embeddings", "256", "--micro-batch-size", "2", "--global-batch-size", "4",
        "--train-iters", "1", "--seed", "1", "--log-interval", "1", "--eval-iters", "0",
        "--tokenizer-vocab-size", "512", "--device", "cpu", "--zero-stage", "1",
        "--attention-dropout", "0", "--hidden-dropout", "0"]

CASES = {
    "dp2": [],
    "dp2-recompute": ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
                      "--micro-batch-size", "8", "--global-batch-size", "16", "--seq-length", "512",
                      "--max-position-embeddings", "512"],
}


def launch_rank(rank, world_size, argv):
    import pretrain_gpt

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert pretrain_gpt.main(argv) == 0
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_planned_peak_matches_every_data_parallel_ranks_measured_peak(case, corpus_cache, tmp_path):
    outputs = run_distributed(launch_rank, 2, [*LIVE, *CASES[case], "--data-cache-dir", corpus_cache,
                                               "--metrics-file", str(tmp_path / "metrics.jsonl")], timeout=600)
    line = next(line for line in outputs[0].splitlines() if "memory after iteration 1" in line)
    ratios = re.search(r"over all 2 ranks measured .*?, measured/predicted (\d+\.\d+)-(\d+\.\d+)", line)
    assert ratios, line  # a prediction for each rank, and a ratio (not a difference in MiB)
    low, high = map(float, ratios.groups())
    print(case, line)
    assert 0.9 <= low <= high <= 1.1, line
