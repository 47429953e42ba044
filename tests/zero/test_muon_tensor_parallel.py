"""--optimizer muon under tensor parallelism: --muon-tp-mode (zero/muon.py, scaled_orthogonalize).

NVIDIA/Megatron-LM (main), megatron/core/optimizer/emerging_optimizers.py `TensorParallelMuon`: `orthogonalize` takes
partition_dim from the parameter (None under blockwise), splits the QKV weight per query group of this rank's rows and
calls `scaled_orthogonalize_fn`, which multiplies size[partition_dim] by the TP size (the whole shape, for the scale)
and calls NVIDIA-NeMo/Emerging-Optimizers muon_utils.py `newton_schulz_tp`: partition_dim None -> newton_schulz of the
shard; "duplicated" -> all_gather over TP, torch.cat along partition_dim, newton_schulz, chunk(tp)[rank];
"distributed" -> newton_schulz(transpose=partition_dim == 0, tp_group) with `distributed_normalize_p2` (the squared
norm all-reduced) and each `newton_schulz_step`'s A = X X^T all-reduced over TP.
"""

from __future__ import annotations

import pytest
import torch

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from zero.muon import MuonMatrix, MuonTensorParallel, muon_step

STEPS, LR, DECAY = 3, 0.02, 0.1
# 4 query groups of 4 query, 2 key and 2 value rows (--muon-split-qkv), 16 columns; cut by rows, 2 groups a rank
SPLIT = (4, 2, 2)


def whole_problem(rows: int = 32, cols: int = 16):
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(rows, cols, generator=generator)
    return weight, [torch.randn(rows, cols, generator=generator) for _ in range(STEPS)]


def config_of(mode: str, bf16: bool) -> OptimizerConfig:
    return OptimizerConfig.of(optimizer="muon", muon_tp_mode=mode, muon_fp32_matmul_prec="medium" if bf16 else "high")


def run_steps(weight, grads, config, split=None, tp_dim=None, tp=None, part=lambda t: t):
    """Muon's steps on `part` of the matrix (this rank's shard), as ShardedAdamW.update calls them."""
    mine = part(weight).contiguous()
    matrix = MuonMatrix(mine.shape, split, True, (0, 0, mine.numel()), tp_dim)
    master, momentum = mine.clone().view(-1), torch.zeros(mine.numel())
    for grad in grads:
        muon_step([matrix], master, momentum, part(grad).contiguous().view(-1), LR, DECAY, config.algorithms, lambda t: None,
                  tp)
    return master.view(mine.shape)


def tp_shards(mode, tp_dim, split, bf16) -> list[torch.Tensor]:
    return [torch.from_numpy(shard) for shard in run_distributed(shard_steps, 2, mode, tp_dim, split, bf16,
                                                                 timeout=120)]


def shard_steps(rank, world_size, mode, tp_dim, split, bf16):
    """This TP rank's shard after the steps, its collectives over the TP group as ShardedAdamW builds them."""
    state = initialize("cpu", tensor_parallel_size=world_size)
    try:
        group = state.tensor_parallel_group
        tp = MuonTensorParallel(mode, world_size, rank,
                                lambda output, shard: state.comm.all_gather(output, shard, group, "tp"),
                                lambda tensor: state.comm.all_reduce(tensor, group, "tp"))
        weight, grads = whole_problem()
        return run_steps(weight, grads, config_of(mode, bf16), split, tp_dim, tp,
                         lambda t: t.chunk(world_size, tp_dim)[rank]).numpy()  # by value, not shared memory
    finally:
        destroy(state)


CASES = [(0, None, True), (1, None, True), (0, SPLIT, True), (0, SPLIT, False), (1, None, False)]


@pytest.mark.parametrize("tp_dim,split,bf16", CASES)
def test_duplicated_at_tp_2_is_one_ranks_update_bit_for_bit(tp_dim, split, bf16):
    """Column-parallel (rows cut) and row-parallel (columns cut) matrices, the QKV weight split per block, NS in bf16
    and in fp32: each rank's shard after three steps is exactly its slice of the whole matrix stepped on one rank."""
    weight, grads = whole_problem()
    one_rank = run_steps(weight, grads, config_of("duplicated", bf16), split)
    shards = tp_shards("duplicated", tp_dim, split, bf16)
    assert torch.equal(torch.cat(shards, dim=tp_dim), one_rank)
    # not each shard alone (that is blockwise): the gather matters
    alone = run_steps(weight, grads, config_of("duplicated", bf16), split, part=lambda t: t.chunk(2, tp_dim)[0])
    assert not torch.allclose(shards[0], alone, atol=1e-4)


@pytest.mark.parametrize("tp_dim,split,bf16", CASES[:3])
def test_blockwise_at_tp_2_orthogonalizes_each_shard_alone(tp_dim, split, bf16):
    """Oracle: on one rank, each TP shard stepped as a matrix of its own (NS on it, scaled by its own shape; with the
    QKV split, its own query groups' blocks): equal bit for bit; and not the whole matrix's update."""
    weight, grads = whole_problem()
    config = config_of("blockwise", bf16)
    oracle = [run_steps(weight, grads, config, split, part=lambda t, r=r: t.chunk(2, tp_dim)[r]) for r in range(2)]
    shards = tp_shards("blockwise", tp_dim, split, bf16)
    for shard, expected in zip(shards, oracle):
        assert torch.equal(shard, expected)
    assert not torch.allclose(torch.cat(shards, dim=tp_dim), run_steps(weight, grads, config, split), atol=1e-4)


@pytest.mark.parametrize("tp_dim,split", [(0, None), (1, None), (0, SPLIT)])
def test_distributed_at_tp_2_is_the_whole_matrix_update_within_fp32_rounding(tp_dim, split):
    """In fp32, the shards' X X^T summed over TP is the whole matrix's up to the order of the sums (two partial
    products added), and with rows cut NS runs on the transposed orientation, which one rank need not: measured
    differences ~1e-7 of weights ~1; tolerance 1e-6. Against the one-rank run in the same orientation and
    normalization (tp_dim kept, a TP group of one), the same."""
    weight, grads = whole_problem()
    config = config_of("distributed", False)
    shards = torch.cat(tp_shards("distributed", tp_dim, split, False), dim=tp_dim)
    one = MuonTensorParallel("distributed", 1, 0, lambda output, shard: output.copy_(shard),
                             lambda tensor: None)
    same_path = run_steps(weight, grads, config, split, tp_dim, one)
    duplicated = run_steps(weight, grads, config_of("duplicated", False), split)
    torch.testing.assert_close(shards, same_path, rtol=0, atol=1e-6)
    torch.testing.assert_close(shards, duplicated, rtol=0, atol=1e-6)
    assert not torch.equal(shards, weight)
