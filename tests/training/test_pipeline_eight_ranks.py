"""Issue 38's acceptance at its largest grids, 8 ranks (fp32 on gloo): PP 2 x TP 2 x DP 2 (1F1B, ZeRO 1),
PP 2 interleaved (2 chunks a stage) x TP 2 x DP 2 (ZeRO 2) and PP 4 x TP 2 (ZeRO 1) train with the one-stage run's
losses and gradient norms over 5 iterations of >= 4 micro-batches per rank, in ONE 8-rank launch that runs the
grids in turn. test_pipeline_training.py holds the 4-rank grids and the machinery reused here.

Rank order is Megatron's, TP fastest, then DP, then PP (parallel_state.py initialize_model_parallel's default
order="tp-cp-ep-dp-pp"; parallel/mesh.py builds the same): with TP 2 x DP 2 x PP 2 ranks 0-3 are the first stage and
4-7 the last, the tied embedding's gradient all-reduced between r and r + 4, the ZeRO groups {0, 2}, {1, 3}, {4, 6},
{5, 7}, every one exercised at once. Interleaving needs a multiple of PP micro-batches (parallel/pipeline_schedules.py
check_interleaving, after Megatron-Core's older assert; schedules.py now asks microbatch_group_size_per_vp_stage, PP
by default, to lie in [PP, micro-batches]): 16 samples / (MB 2 x DP 2) = 4 per rank. Every rank's point-to-point
bytes ("pp") are the schedule's messages, as in the 4-rank test. Not bitwise (the tied embedding's two gradient
halves and the norm's per-stage squares are summed in another order); the bound is the issue's 1e-6 relative."""

from __future__ import annotations

import pytest

from tests.distributed import free_port, run_distributed
from tests.training.test_pipeline_training import (
    GLOBAL_BATCH,
    MICRO_BATCH,
    expected_point_to_point,
    one_stage_reference,
    point_to_point,
    train_configurations,
)

# name: (flags, tensor-parallel size); the rest of the 8 ranks is PP x DP
EIGHT_RANK_CONFIGS = {
    "pp2-tp2-dp2-1f1b-zero1": (["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                                "--zero-stage", "1"], 2),
    "pp2-tp2-dp2-interleaved-zero2": (["--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                                       "--num-layers-per-virtual-pipeline-stage", "1", "--zero-stage", "2"], 2),
    "pp4-tp2-zero1": (["--pipeline-model-parallel-size", "4", "--tensor-model-parallel-size", "2",
                       "--zero-stage", "1"], 2),
}
WORLD_SIZE = 8


def _max_relative_difference(values: list[float], reference: list[float]) -> float:
    return max(abs(value - expected) / abs(expected) for value, expected in zip(values, reference))


@pytest.mark.slow
def test_eight_rank_pipeline_grids_train_with_the_one_stage_losses_and_norms():
    # >= 4 micro-batches on every rank of every grid: DP is at most 2
    assert GLOBAL_BATCH // (MICRO_BATCH * 2) >= 4
    single = one_stage_reference()
    assert single[-1][0] < single[0][0]  # it trains
    per_rank = run_distributed(train_configurations, WORLD_SIZE, EIGHT_RANK_CONFIGS,
                               [free_port() for _ in EIGHT_RANK_CONFIGS], timeout=600)
    for name in EIGHT_RANK_CONFIGS:
        # every rank records the same loss and norm (the loss from the last stage, the norm over all stages)
        assert all(rank_results[name].outcomes == per_rank[0][name].outcomes for rank_results in per_rank), name
        losses, norms = zip(*per_rank[0][name].outcomes)
        reference_losses, reference_norms = zip(*single)
        print(f"{name}: max relative difference, loss {_max_relative_difference(losses, reference_losses):.2e}, "
              f"grad norm {_max_relative_difference(norms, reference_norms):.2e}")
        assert list(losses) == pytest.approx(list(reference_losses), rel=1e-6, abs=0), name
        assert list(norms) == pytest.approx(list(reference_norms), rel=1e-6, abs=0), name
        # every rank counts the bytes its stage's messages carry (test_pipeline_training.py's formula)
        flags, tp = EIGHT_RANK_CONFIGS[name]
        for rank, rank_results in enumerate(per_rank):
            expected = expected_point_to_point(flags, tp, WORLD_SIZE, rank)
            assert all(point_to_point(counted) == expected for counted in rank_results[name].comm_bytes), (name, rank)
