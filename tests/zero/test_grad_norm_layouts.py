"""The logged gradient norm does not depend on how the parameters are split (issue 77, item 4): each rank sums its
squares in fp64 (zero/grad_norm.py), where in fp32 `torch._foreach_norm`'s error grew with the length of each rank's
piece (ZeRO 1 at DP 2 logged an iteration-1 norm 3.3e-4 relative from one rank's, 7.47284 against 7.47035). The
launches at ZeRO 0-3, TP 2 + SP and PP 2 against one rank are the combination table's "wide" rows
(tests/training/combinations.py)."""

from __future__ import annotations

import pytest

from zero.grad_norm import NORM_BLOCK, sum_of_squares


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
