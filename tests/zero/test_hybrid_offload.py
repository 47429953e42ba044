"""Megatron-LM's hybrid CPU optimizer (--optimizer-offload-fraction below 1, zero/hybrid_offload.py): where a rank's
partition is cut, and a split step that equals the unsplit one bit for bit.

Megatron-LM (NVIDIA/Megatron-LM at d98e8a64, megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py,
HybridDeviceOptimizer._get_sub_optimizer_param_groups) walks a rank's shard parameters in order and moves each whole
one to the host while fewer than offload_fraction x all elements are moved; the moved ones are stepped by torch's
AdamW on the host, the others on the device, with the same Adam. Here the update is PyTorch's fused AdamW on both
sides of a CPU run (elementwise), the reducer's gradient partition is the one the unsplit run steps from, and the
cut keeps the fused kernel's vector loop on the same elements (zero/offload.py's PIECE_ALIGNMENT), so the losses,
the gradient norms and the master weights must not move by one bit.
"""

import pytest
import torch
from torch import nn

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from tests.zero.test_zero_distributed import SEQ, VOCAB, tiny_gpt2
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig
from zero.flat_buffer import FlatLayout
from zero.hybrid_offload import host_cut
from zero.memory import host_resident_tensors, measure_by_placement
from zero.offload import PIECE_ALIGNMENT
from zero.split_partition import SplitPartition

OPTIMIZER = OptimizerConfig(lr=3e-3, weight_decay=0.1, clip_grad=0.05)  # clipping on: it scales every step here
STEPS = 4


def megatron_offloaded_numel(numels: list[int], fraction: float) -> int:
    """Megatron-LM's selection written as its _get_sub_optimizer_param_groups writes it, over parameters of these
    element counts (all on the GPU): the elements it moves to the host."""
    offload_threshold = sum(numels) * fraction
    offload_params_numel = 0
    for numel in numels:
        if offload_params_numel < offload_threshold:
            offload_params_numel += numel
    return offload_params_numel


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.5, 0.77, 0.99])
def test_the_cut_takes_whole_parameters_as_megatron_then_aligns_within_its_run(fraction):
    """One unit, one part (the whole partition): its fragments are the parameters in partition order. The host part
    holds exactly the parameters Megatron-LM would move, then at most PIECE_ALIGNMENT - 1 elements more, ending at a
    multiple of PIECE_ALIGNMENT from the start of its segment (or at the segment's end)."""
    shapes = [(50, 7), (33,), (129, 5), (64, 64), (17, 3), (200,), (31, 31)]
    params = [nn.Parameter(torch.zeros(shape)) for shape in shapes]
    layout = FlatLayout([params], parts=1, part=0, alignment=64)
    fragments = sorted(layout.fragments(), key=lambda f: f.partition_offset)
    moved = megatron_offloaded_numel([f.numel for f in fragments], fraction)
    # where Megatron's moved parameters end in the partition: they are the first ones in order
    ends = [f.partition_offset + f.numel for f in fragments]
    taken = 0
    for fragment, end in zip(fragments, ends):
        taken += fragment.numel
        if taken == moved:
            megatron_end = end
            break
    cut = host_cut(layout, fraction)
    assert megatron_end <= cut < megatron_end + PIECE_ALIGNMENT
    segment = next((s for s in layout.segments() if s.start < cut < s.end), None)
    if segment is not None:
        assert (cut - segment.start) % PIECE_ALIGNMENT == 0
    else:
        assert cut == megatron_end or any(s.end == cut for s in layout.segments())


def test_a_split_partition_reads_views_within_a_side_and_copies_across_it():
    host, device = torch.arange(10.0), torch.arange(10.0, 16.0)
    split = SplitPartition(host, device)
    assert split.numel() == 16 and split.shape == torch.Size([16]) and split.cut == 10
    within = split[2:5]
    within.add_(100)  # a view: the optimizer's pieces update the sides in place
    assert host[2:5].tolist() == [102.0, 103.0, 104.0]
    assert split[12:14].data_ptr() == device[2:].data_ptr()
    assert split[8:12].tolist() == [8.0, 9.0, 10.0, 11.0]
    split[9:11] = torch.tensor([-1.0, -2.0])  # a write across the cut lands on both sides
    assert host[9].item() == -1.0 and device[0].item() == -2.0
    whole = torch.arange(100.0, 116.0)
    split.copy_(whole)
    assert torch.equal(split.flat(), whole)
    target = torch.zeros(16)
    split.copy_into(target)
    assert torch.equal(target, whole)


def split_and_plain_runs(rank, world_size):
    """Per ZeRO stage 1-3: the plain step and the split one (fraction 0.5) on the same tokens, 4 steps."""
    state = initialize("cpu", 1)
    try:
        tokens = torch.randint(0, VOCAB, (2 * world_size, SEQ), generator=torch.Generator().manual_seed(3))
        mine = tokens.chunk(world_size)[rank]
        outcomes = {}
        for stage in (1, 2, 3):
            for split in (False, True):
                model = tiny_gpt2()
                zero = ZeroHarness(model, OPTIMIZER, ZeroConfig(stage=stage, reduce_bucket_size=3000,
                                                                offload_optimizer=split,
                                                                optimizer_offload_fraction=0.5), state)
                trace = []
                for _ in range(STEPS):
                    zero.zero_grad()
                    loss = model(input_ids=mine, labels=mine).loss
                    zero.backward(loss)
                    trace.append((loss.item(), zero.step().grad_norm))
                sharded = zero.sharded
                master = (sharded.master.flat() if split else sharded.master).tolist()  # plain values cross processes
                outcome = {"trace": trace, "master": master, "kind": type(sharded).__name__,
                           "partition": sharded.layout.partition_numel}
                if split:
                    placed = measure_by_placement(sharded.model_state_tensors(), host_resident_tensors(sharded))
                    outcome.update(cut=sharded.cut, sides=[t.numel() for t in sharded.master.parts],
                                   steps=[int(o.state[o.param_groups[0]["params"][0]]["step"])
                                          for o in sharded._step_optimizers],
                                   host=placed["host"], device=placed["device"],
                                   saved=sharded.sharded_state_dict(model).tensors["exp_avg"].tolist())
                else:
                    outcome["saved"] = sharded.sharded_state_dict(model).tensors["exp_avg"].tolist()
                outcomes[(stage, split)] = outcome
        return outcomes
    finally:
        destroy(state)


def test_the_split_step_equals_the_unsplit_one_bit_for_bit_at_stages_1_to_3():
    """2 gloo ranks, fp32: with half of each rank's partition stepped on the host the losses, the gradient norms and
    the master weights equal the run without offload exactly; each side's AdamW took every step; the host holds the
    master and the moments of [0, cut) (and the gradient copy for its step), the device the rest; a checkpoint
    writes each state whole, as the unsplit run does."""
    for rank, outcomes in enumerate(run_distributed(split_and_plain_runs, 2, timeout=300)):
        for stage in (1, 2, 3):
            plain, split = outcomes[(stage, False)], outcomes[(stage, True)]
            where = f"rank {rank} stage {stage}"
            assert split["kind"] == "HybridDeviceAdamW" and plain["kind"] == "ShardedAdamW", where
            assert split["trace"] == plain["trace"], where
            assert split["master"] == plain["master"] and split["saved"] == plain["saved"], where
            partition, cut = split["partition"], split["cut"]
            assert 0.4 * partition < cut < 0.6 * partition, where
            assert split["sides"] == [cut, partition - cut], where
            assert split["steps"] == [STEPS, STEPS], where
            assert split["host"]["master_weights"] == 4 * cut and split["host"]["optimizer_states"] == 8 * cut, where
            assert split["host"]["buffers"] == 4 * cut and split["host"]["gradients"] == 0, where
            assert split["device"]["master_weights"] == 4 * (partition - cut), where
            assert split["device"]["optimizer_states"] == 8 * (partition - cut), where


def test_the_split_is_chosen_only_between_0_and_1():
    from zero.placement import placement_of

    assert placement_of(ZeroConfig(stage=1, offload_optimizer=True, optimizer_offload_fraction=0.25)).optimizer_split
    whole = placement_of(ZeroConfig(stage=1, offload_optimizer=True))
    assert whole.optimizer_on_host and not whole.optimizer_split
    none = placement_of(ZeroConfig(stage=1, offload_optimizer=True, optimizer_offload_fraction=0.0))
    assert not none.optimizer_on_host and not none.optimizer_split
    assert not placement_of(ZeroConfig(stage=1, optimizer_offload_fraction=0.5)).optimizer_split
