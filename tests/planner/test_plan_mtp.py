"""The dry run plans multi-token prediction's layers (--mtp-num-layers, gpt/mtp.py): each MTP layer's block, its
enorm/hnorm and 2h -> h eh_proj, and its own logits and loss (Megatron-LM's
megatron/core/transformer/multi_token_prediction.py MultiTokenPredictionLayer and process_mtp_loss). The measure is
--report-memory's saved-for-backward peak of a real CPU run (zero/activations.py SavedTensorMeter), as
tests/planner/test_plan_gqa_attention.py reads it."""

from __future__ import annotations

import pytest

import pretrain_gpt
from tests.planner.test_plan_gqa_attention import _measured, _plan

MODEL = ["--hidden-size", "64", "--num-attention-heads", "4", "--num-layers", "1", "--seq-length", "128",
         "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters",
         "1", "--seed", "1", "--log-interval", "1", "--eval-iters", "0", "--tokenizer-vocab-size", "512", "--device",
         "cpu", "--zero-stage", "1", "--attention-dropout", "0", "--hidden-dropout", "0", "--report-memory"]


@pytest.mark.parametrize("mtp,extra", [(1, ()), (2, ()), (2, ("--checkpoint-activations",))])
def test_an_mtp_plan_saves_what_the_mtp_run_saves(tmp_path, corpus_cache, mtp, extra):
    """The dry run runs the real step on meta (planner/dry_run.py), MTP layers included: their saved tensors are in
    the plan as measured (this held before the loss-softmax line's change too; it guards the MTP layers' blocks,
    eh_proj and logits staying in the dry run). The MTP layers are not checkpointed (gpt/mtp.py), so under
    --checkpoint-activations they keep their tensors beside the decoder's checkpoints."""
    metrics = tmp_path / "metrics.jsonl"
    argv = [*MODEL, "--mtp-num-layers", str(mtp), *extra, "--data-cache-dir", corpus_cache,
            "--metrics-file", str(metrics)]
    assert pretrain_gpt.main(argv) == 0
    saved = _measured(argv)
    plan = _plan(argv)
    planned = plan.saved_activation_bytes["device"] + plan.saved_activation_bytes["host"]
    assert abs(planned / saved - 1) < 0.01, (planned, saved)


@pytest.mark.parametrize("mtp", [1, 2])
def test_the_loss_softmax_line_counts_each_mtp_layers_loss(tmp_path, corpus_cache, mtp):
    """Each MTP layer computes its own logits and vocab-parallel cross entropy (Megatron-LM's process_mtp_loss;
    gpt/mtp.py attach_mtp_loss calls model.output per layer), each keeping an fp32 softmax for backward until the
    backward reaches it: the plan's "of which the loss's fp32 softmax" (and the performance model's loss time, which
    reads it) is 1 + mtp of them; it counted the main loss's only. Vocabulary 512 (padded to 512), fp32."""
    argv = [*MODEL, "--mtp-num-layers", str(mtp), "--data-cache-dir", corpus_cache,
            "--metrics-file", str(tmp_path / "m.jsonl")]
    plan = _plan(argv)
    assert plan.loss_softmax_bytes == (1 + mtp) * 2 * 128 * 512 * 4
    assert plan.loss_softmax_bytes < plan.saved_activation_bytes["device"]
