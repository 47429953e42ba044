"""The logged gradient norm, and the clipping that follows it, do not depend on how the parameters are split
(issue 77, item 4).

Two layers with 4.2M-element MLP weights (256 x 16384), fp32, clipped at every step: ZeRO 0-3 at DP 2, TP 2 with
sequence parallelism and PP 2 against one rank. Each rank sums its squares in fp64 (zero/grad_norm.py); in fp32
`torch._foreach_norm`'s error grew with the length of each rank's piece, and ZeRO 1 at DP 2 logged an iteration-1
norm 3.3e-4 (relative) from one rank's (7.47284 against 7.47035), before any step. The norms now agree to 1e-6 at every iteration (what is
left is the gradients' own fp32 rounding: DP sums the micro-batches' gradients in another order, TP splits the
matmuls), and so do the losses after the clipped steps."""

from __future__ import annotations

import json

import pytest

import pretrain_gpt
from tests.distributed import free_port, run_distributed
from tests.training.test_moe_training import launch_rank
from zero.grad_norm import NORM_BLOCK, sum_of_squares

# 4.2M-element MLP weights (256 x 16384) beside small attention ones
WIDE = ["--num-layers", "2", "--hidden-size", "256", "--ffn-hidden-size", "16384", "--num-attention-heads", "8",
        "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2",
        "--eval-iters", "0", "--log-interval", "1", "--tokenizer-vocab-size", "300", "--device", "cpu",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "1", "--lr", "1e-3", "--clip-grad", "0.1"]
LAYOUTS = {**{f"zero{stage}-dp2": ["--zero-stage", stage] for stage in "0123"},
           "tp2-sp": ["--zero-stage", "1", "--tensor-model-parallel-size", "2", "--sequence-parallel"],
           "pp2": ["--zero-stage", "1", "--pipeline-model-parallel-size", "2"]}


def logged(path) -> list[tuple[float, float]]:
    return [(r["loss"], r["grad_norm"]) for r in map(json.loads, path.read_text().splitlines())
            if "loss" in r and "split" not in r]


@pytest.mark.slow
def test_every_layout_logs_one_ranks_grad_norm_and_clips_alike(corpus_cache_300, tmp_path):
    common = WIDE + ["--data-cache-dir", corpus_cache_300]
    assert pretrain_gpt.main(common + ["--metrics-file", str(tmp_path / "one.jsonl")]) == 0
    argv = [common + extra + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in LAYOUTS.items()]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in LAYOUTS], timeout=600)
    reference = logged(tmp_path / "one.jsonl")
    assert len(reference) == 2 and all(norm > 0.1 for _, norm in reference), "every step clips"
    for name in LAYOUTS:
        runs = logged(tmp_path / f"{name}.jsonl")
        for iteration, ((loss, norm), (one_loss, one_norm)) in enumerate(zip(runs, reference), start=1):
            assert norm == pytest.approx(one_norm, rel=1e-6, abs=0), f"{name}: grad norm at iteration {iteration}"
            assert loss == pytest.approx(one_loss, rel=1e-6, abs=0), f"{name}: loss at iteration {iteration}"


def test_a_rank_s_sum_of_squares_does_not_depend_on_where_its_pieces_are_cut():
    """One 4.2M-element gradient whole, in two halves (DP 2), in eight parts and cut at unaligned places: the
    sums agree with the exact one (fp64 over fp64 squares) to 1e-12, where fp32 norms differed by 1e-5."""
    import torch

    gradient = torch.randn(4_194_304, generator=torch.Generator().manual_seed(0)) * 1e-3
    exact = torch.dot(gradient.double(), gradient.double()).item()
    cuts = {"whole": [gradient], "halves": list(gradient.chunk(2)), "eighths": list(gradient.chunk(8)),
            "unaligned": list(gradient.split([NORM_BLOCK + 7, 3 * NORM_BLOCK - 1, 1_000_001, 2_145_721]))}
    for name, pieces in cuts.items():
        total = sum_of_squares(pieces, gradient.device)
        assert total.dtype == torch.float64
        assert total.item() == pytest.approx(exact, rel=1e-12, abs=0), name
