"""Issue 38's acceptance: the planner's per-stage peak against the live run's measured peak, 0.9-1.1 on every rank
of a PP 2 x DP 2 CPU run (4 gloo ranks), read from the line after iteration 1 (training/metrics.py's MemoryCheck:
peak RSS growth since before the build, less the file pages mapped since, over that rank's dry-run prediction).

The model (8 x 256, sequence 128, micro batch 2: about 100 MiB a rank, above RATIO_FROM_BYTES) keeps the activations'
blocks at the malloc threshold the run sets (zero/host_memory.py), so freed activations go back to the system and the
peak RSS follows what is live (with smaller blocks glibc's heap kept 30 MiB and the ratio read 1.05-1.11). Measured
here: stage 0 0.99 (94 of 95 MiB), stage 1 0.96 (69 of 72 MiB). CI failed it at 1.24-1.32 while file pages were
counted, and at 0.89 while the plan of iteration 1 counted the constant buffers (6 MiB), which appear after the
schedule's peak (each rank's peak RSS grew by 9 MiB in iteration 2).
"""

from __future__ import annotations

import pytest

from tests.planner.live_memory import measured_over_predicted

LIVE = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
        "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "16",
        "--train-iters", "2", "--seed", "1", "--log-interval", "1", "--eval-iters", "0",
        "--tokenizer-vocab-size", "512", "--device", "cpu", "--pipeline-model-parallel-size", "2",
        "--zero-stage", "1"]


@pytest.mark.slow
def test_the_planned_stage_peak_matches_every_ranks_measured_peak(corpus_cache):
    line, low, high = measured_over_predicted(4, [*LIVE, "--data-cache-dir", corpus_cache])
    print(line)
    assert 0.9 <= low <= high <= 1.1, line
