"""--compile: each transformer block under torch.compile trains to the eager losses, with TP and every
ZeRO stage, activation checkpointing included."""

import pytest

from tests.zero.test_zero_training import BATCH, ITERS, Runs, assert_close, losses_of, single_process_losses


@pytest.mark.slow
def test_compiled_blocks_train_to_the_eager_losses_with_tp_and_every_stage(tmp_path, corpus_cache,
                                                                           single_process_reference):
    """Single process (stage 3 with checkpointing) and TP=2 x DP=2 (stages 1 and 3): the fp32 losses of
    compiled blocks equal the eager single-process run within 1e-5 relative (inductor may fuse and
    reorder floating-point work)."""
    (tmp_path / "compiled").mkdir()
    reference = single_process_reference
    compiled_single = single_process_losses(tmp_path / "compiled", corpus_cache, "--compile", "--zero-stage", "3",
                                            "--checkpoint-activations")
    assert_close(compiled_single, reference, 1e-5, "single process, stage 3, checkpointing, compiled")
    grid = Runs(tmp_path, corpus_cache)
    for stage in ("1", "3"):
        grid.add(f"tp2xdp2-stage{stage}-compiled", *BATCH, "--micro-batch-size", "2", "--zero-stage", stage,
                 "--tensor-model-parallel-size", "2", "--compile")
    for name, metrics in grid.launch(4, 2).items():
        assert_close(losses_of(metrics), reference, 1e-5, name)
    assert len(reference) == ITERS
