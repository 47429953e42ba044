"""Issue 38's acceptance: the planner's per-stage peak against the live run's measured peak, 0.9-1.1 on every rank
of a PP 2 x DP 2 CPU run (4 gloo ranks). The live run prints one line after its first iteration (training/
memory_report.py's FirstIterationMemory, training/metrics.py's MemoryCheck): this rank's planned peak (a dry run of
its own rank, planner/launch.py) and, over every rank, the measured peak RSS growth since before the build (less the
file pages mapped since: code, whose count depends on the page cache) divided by that rank's prediction. Before the planner planned stages, the dry run refused PP > 1 and the line had no
prediction at all.

The model (8 x 256, sequence 128, micro batch 2: about 100 MiB planned a rank, above MemoryCheck's
RATIO_FROM_BYTES, where the CPU's fixed few MiB of first-iteration cost would dominate a ratio) keeps the
activations' blocks ([2, 128, 256] fp32, 256 KiB) at the malloc threshold the run sets (zero/host_memory.py: the
smallest weight matrix, 256 x 256 fp32), so freed activations go back to the system and the peak RSS follows what
is live. With smaller blocks glibc's heap keeps them: measured on 8 x 384 at sequence 64, the last stage's RSS
after its forward and backward stayed 30 MiB above its model states until malloc_trim(0) returned them, and its
ratio read 1.05-1.11 (the planner lists the allocator's slack as unknown to it). The measurement covers a whole
iteration of four micro-batches through the 1F1B schedule and the optimizer step, not only the build. Measured
here: stage 0 0.99 (94 of 95 MiB), stage 1 0.96 (69 of 72 MiB). CI failed this test at 1.24-1.32 while the file
pages were counted (35 MiB of them a rank there, 11 here), and at 0.89 (stage 1) while the plan of iteration 1
counted the constant buffers (6 MiB: reduce buckets, scatter outputs), which appear at its last backward's reduction,
after the schedule's peak: each rank's peak RSS grew by 9 MiB in iteration 2. Gradient accumulation fusion took a
weight gradient (1 MiB) off the measured peak and the plan's (planner/dry_run.py's largest unfused gradient).
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
