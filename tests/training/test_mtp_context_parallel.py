"""Multi-token prediction under context parallelism gives one rank's losses and gradients (issue 89 item 2, after
Megatron-LM PR #7498: "A rank with no original LM targets can receive a shifted MTP target and discard its gradient
because the current per-token normalization multiplies by its zero local count. Even an all-ones mask gives different
weights after CP partitioning").

Here each MTP roll runs over the whole sequence (parallel/context_parallel.py roll_left_across_chunks, Megatron-Core's
roll_tensor with its cp_group: a chunk's last position takes its successor's first token, wherever that chunk lives)
and each MTP loss is this rank's masked sum x CP over the count summed over the CP group (gpt/mtp.py), as the main
loss is (training/evaluation.py). CP 2 (gloo, fp32) against one rank, same global batch of 2 micro-batches: depth 1
without a mask, depth 3 with --eod-mask-loss, depth 3 with a goldfish mask and --calculate-per-token-loss; the losses
(LM and every mtp_k), the grad norms within the layout fuzz's tolerances (1e-5, 1e-4; measured 2.1e-7 at most)."""

from __future__ import annotations

import pytest
import torch

from parallel.context_parallel import roll_left_across_chunks, take_local_chunks
from scripts.tools.layout_fuzz import COMMON, GRAD_NORM_TOLERANCE, LOSS_TOLERANCE
from tests.forked_runs import logged_iterations

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
         "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--position-embedding-type", "rope"]


class _Gathered:
    """A CP group's all-gather, every rank's input known up front (a unit test of one rank's view)."""

    def __init__(self, inputs: list[torch.Tensor]) -> None:
        self.inputs = inputs

    def all_gather(self, output, input, group, name):
        output.copy_(torch.cat(self.inputs))


@pytest.mark.parametrize("cp", [2, 4])
def test_a_roll_across_chunks_is_the_whole_sequences_roll_on_each_rank(cp):
    from types import SimpleNamespace

    whole = torch.arange(1, 2 * 32 + 1).reshape(2, 32)
    want = torch.roll(whole, -1, -1)
    want[..., -1] = 0  # Megatron's roll_tensor: the sequence's last position filled with 0
    local = [take_local_chunks(whole, cp, rank) for rank in range(cp)]
    firsts = [torch.stack([half[..., 0] for half in chunks.chunk(2, dim=-1)]) for chunks in local]
    for rank in range(cp):
        state = SimpleNamespace(context_parallel_size=cp, context_parallel_rank=rank, comm=_Gathered(firsts),
                                context_parallel_group=None)
        assert torch.equal(roll_left_across_chunks(local[rank], state), take_local_chunks(want, cp, rank)), rank


def _records(tmp_path, name: str, flags: list[str], ranks: int) -> list[dict]:
    """The run's iterations' records, on forked ranks (tests/forked_runs.py: a fresh launch's interpreters spent most
    of this test's time importing torch)."""
    return logged_iterations(tmp_path, name, [*COMMON, *MODEL, *flags], ranks)


@pytest.mark.slow
def test_mtp_at_cp_2_trains_to_one_ranks_losses_and_norms(tmp_path):
    cases = {"depth 1": ["--mtp-num-layers", "1"],
             "depth 3, eod mask": ["--mtp-num-layers", "3", "--eod-mask-loss"],
             "depth 3, goldfish, per token": ["--mtp-num-layers", "3", "--goldfish-loss", "--goldfish-k", "3",
                                              "--calculate-per-token-loss"]}
    for name, flags in cases.items():
        one = _records(tmp_path, f"{name}-one", flags, 1)
        two = _records(tmp_path, f"{name}-cp2", [*flags, "--context-parallel-size", "2"], 2)
        depth = int(flags[1])
        keys = ["loss", *[f"mtp_{k} loss" for k in range(1, depth + 1)]]
        assert len(one) == len(two) > 0, name
        for mine, theirs in zip(two, one):
            for key in keys:
                assert abs(mine[key] - theirs[key]) <= LOSS_TOLERANCE * abs(theirs[key]), (name, key, mine, theirs)
            assert abs(mine["grad_norm"] - theirs["grad_norm"]) <= GRAD_NORM_TOLERANCE * theirs["grad_norm"], \
                (name, mine, theirs)
