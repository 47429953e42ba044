"""ZeRO-Offload under pipeline stages with a tied word embedding (found by scripts/tools/layout_fuzz.py, issue 77): the
first and last stages' copies of the embedding have their gradients summed after the data-parallel reduction
(zero/pipeline_grads.py), and under --offload-optimizer that sum must reach the host partition the step reads. It
reached only the device buffer at ZeRO 0-1: iteration 1's grad norm read 1.7268 for the one rank's 1.8081 (the
last stage's part of the embedding's gradient missing) and the losses parted from iteration 2."""

from __future__ import annotations

import pytest

from scripts.tools.layout_fuzz import COMMON
from tests.forked_runs import forked_launch as launch  # the ranks forked: a fresh interpreter a rank took most of it

MODEL = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8"]


@pytest.mark.slow
def test_pipeline_stages_with_a_tied_embedding_and_offload_train_as_one_rank(tmp_path):
    staged = launch([*COMMON, *MODEL, "--pipeline-model-parallel-size", "2", "--zero-stage", "1",
                     "--offload-optimizer"], 2, tmp_path)
    one_rank = launch([*COMMON, *MODEL], 1, tmp_path)
    assert staged.returncode == 0 and one_rank.returncode == 0, (staged.last_error, one_rank.last_error)
    assert len(staged.records) == len(one_rank.records) == 3
    for ours, one in zip(staged.records, one_rank.records):
        # fp32 over stages sums the embedding's two parts once, not per micro-batch: ~1e-7 (tests/training/test_pipeline_training.py)
        assert ours["loss"] == pytest.approx(one["loss"], rel=1e-6)
        assert ours["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-6)
