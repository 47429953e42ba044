"""ZeRO-Offload's optimizer half (zero/offload.py): the host step equals the device step bit for bit.

DeepSpeed's ZeRO-Offload keeps the fp32 partition and the moments on the host and steps them there
(deepspeedai/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py @edaa722, lines 492-497 and 2321-2341);
the update is the same AdamW, so with the same kernel on both sides (PyTorch's fused CPU AdamW, which
is elementwise) the losses and gradient norms must not move by one bit.

The reduced gradient partition goes to the host as each unit's reduction completes, and the host step
reads it there (zero/grad_reducer.py), as DeepSpeed's `copy_grads_in_partition` does (stage_1_and_2.py
@edaa722, 1650-1670: at stage 1 once, at the accumulation boundary; at stages 2-3 every micro-batch,
accumulated, 1516-1560; stage3.py `partition_grads`, 1886-1933). Accumulating on the host performs
the same fp32 additions in the same order as the device partition without offload (stages 2-3), and
stage 1 copies the same reduced values, so with 4 accumulated micro-batches the norms, the fp16
overflow skips and clipping must still be those of the run without offload, bit for bit.
"""

import pytest
import torch

from arguments.config import OptimizerConfig
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from tests.zero.test_zero_distributed import SEQ, VOCAB, tiny_gpt2
from tests.zero_harness import ZeroHarness
from zero.config import ZeroConfig
from zero.loss_scaler import DynamicLossScaler
from zero.memory import host_resident_tensors, measure_by_placement
from zero.offload import HostOffloadedAdamW, StepPiece, cut_segment, pack_sub_groups

# clip_grad 0.05 clips every step here, so clipping is exercised on both sides.
OPTIMIZER = OptimizerConfig(lr=3e-3, weight_decay=0.1, clip_grad=0.05)
ITERATIONS, ACCUMULATION, MICRO_BATCH = 5, 4, 2
# Not a multiple of 64 on purpose: pieces must still be cut at aligned offsets (zero/offload.py's
# PIECE_ALIGNMENT; cut at 997, the fused kernel's scalar tail moves and one bit changes in stage 2).
SUB_GROUP = 997


def micro_batches(world_size, iteration):
    generator = torch.Generator().manual_seed(100 + iteration)
    tokens = torch.randint(0, VOCAB, (ACCUMULATION, MICRO_BATCH * world_size, SEQ), generator=generator)
    return list(tokens)


def train(state, stage, offload, fp16=False, offload_param=False):
    """5 iterations of 4 accumulated micro-batches on tiny GPT-2; returns (global losses, per step (grad
    norm, skipped, loss scale) with fp16 or the grad norm, the optimizer)."""
    model = tiny_gpt2()
    config = ZeroConfig(stage=stage, reduce_bucket_size=3000, offload_optimizer=offload, sub_group_size=SUB_GROUP,
                        offload_param=offload_param)
    # fp16: a scale so high the first steps overflow, so the run skips some steps and takes others.
    extra = {"dtype": torch.float16, "loss_scaler": DynamicLossScaler(scale=2.0 ** 20, growth_interval=1000,
                                                                       hysteresis=1)} if fp16 else {}
    zero = ZeroHarness(model, OPTIMIZER, config, state, **extra)
    losses, norms = [], []
    for iteration in range(ITERATIONS):
        zero.zero_grad()
        total = torch.zeros(1)
        batches = micro_batches(state.data_parallel_size, iteration)
        for index, tokens in enumerate(batches):
            mine = tokens.chunk(state.data_parallel_size)[state.data_parallel_rank]
            loss = model(input_ids=mine, labels=mine).loss / ACCUMULATION
            zero.backward(loss, last_micro_batch=index == len(batches) - 1)
            total += loss.detach()
        state.comm.all_reduce(total, state.data_parallel_group, "dp")
        losses.append(total.item())
        result = zero.step()
        norms.append((repr(result.grad_norm), result.skipped, result.loss_scale) if fp16 else result.grad_norm)
    return losses, norms, zero.sharded


def offloaded_and_plain(rank, world_size):
    """Per stage 1-3, both runs' losses and norms, and what the offloaded optimizer held."""
    state = initialize("cpu", 1)
    try:
        results = {}
        for stage in (1, 2, 3):
            plain_losses, plain_norms, _ = train(state, stage, offload=False)
            losses, norms, optimizer = train(state, stage, offload=True)
            partition = optimizer.layout.partition_numel
            reducer = optimizer.gradients
            placed = measure_by_placement(optimizer.model_state_tensors(), host_resident_tensors(optimizer))
            results[stage] = {
                # Where the gradients were: the host partition is what the step reads, in place.
                "step_reads_host_partition": reducer.partition_gradients().data_ptr() == reducer.host_partition.data_ptr(),
                "host_gradient_bytes": placed["host"]["gradients"],
                "device_gradient_bytes": placed["device"]["gradients"],
                "full_buffer_bytes": reducer.buffer.numel() * 4 if stage == 1 else 0,
                "plain": (plain_losses, plain_norms), "offloaded": (losses, norms),
                "type": type(optimizer).__name__, "sub_groups": optimizer.num_sub_groups,
                "host_buffer_bytes": optimizer.host_working_bytes(), "partition": partition,
                "adam_step": optimizer.adam_step,
                # AdamW's tensors are views of the host master: none is larger than a window.
                "largest_piece": max(p.numel() for p in optimizer.optimizer.param_groups[0]["params"])}
        # ZeRO-3 Offload: parameters and optimizer states on the host, as the tutorial's JSON asks.
        losses, norms, optimizer = train(state, 3, offload=True, offload_param=True)
        results["offload_param"] = {"offloaded": (losses, norms), "plain": results[3]["plain"],
                                    "shard_device": optimizer.parameters.shard.device.type,
                                    "fetched_left": len(optimizer.parameters.gatherer._fetched)}
        results["fp16"] = {"plain": train(state, 2, offload=False, fp16=True)[:2],
                           "offloaded": train(state, 2, offload=True, fp16=True)[:2]}
        return results
    finally:
        destroy(state)


@pytest.mark.slow
def test_optimizer_and_parameter_offload_equal_the_run_without_bit_for_bit():
    per_rank = run_distributed(offloaded_and_plain, 2, timeout=600)
    for rank, results in enumerate(per_rank):
        # fp16 at stage 2: the overflow check, the skips and the scale's course are the device step's.
        params = results.pop("offload_param")
        assert params["offloaded"] == params["plain"], (rank, params)
        assert params["shard_device"] == "cpu" and params["fetched_left"] == 0
        fp16 = results.pop("fp16")
        skipped = [step[1] for step in fp16["plain"][1]]
        assert any(skipped) and not all(skipped), fp16["plain"]
        assert fp16["offloaded"] == fp16["plain"], (rank, fp16)
        for stage, result in results.items():
            assert result["type"] == HostOffloadedAdamW.__name__
            plain_losses, plain_norms = result["plain"]
            losses, norms = result["offloaded"]
            assert plain_losses[-1] < plain_losses[0], "the run must learn, or equal losses prove nothing"
            assert all(norm > OPTIMIZER.clip_grad for norm in plain_norms), "every step must clip"
            assert losses == plain_losses, f"rank {rank} stage {stage}: losses {losses} vs {plain_losses}"
            assert norms == plain_norms, f"rank {rank} stage {stage}: norms {norms} vs {plain_norms}"
            # The gradient partition is a host fp32 tensor; the device keeps none (stage 1: only the full
            # buffer the micro-batches accumulate in before the one reduction, as DeepSpeed's stage 1).
            assert result["step_reads_host_partition"]
            assert result["host_gradient_bytes"] == 4 * result["partition"]
            assert result["device_gradient_bytes"] == result["full_buffer_bytes"]
            # The sub-grouped path really ran: several windows, no host temporary, one step each.
            assert result["sub_groups"] > 3
            assert result["host_buffer_bytes"] == 0
            assert result["largest_piece"] <= SUB_GROUP
            assert result["adam_step"] == ITERATIONS


def test_sub_groups_are_bounded_and_cover_the_partition_in_order():
    assert cut_segment(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert cut_segment(5, 9, 10) == [(5, 9)]
    pieces = [StepPiece(0, 3, True), StepPiece(3, 7, False), StepPiece(7, 9, True), StepPiece(9, 20, True)]
    groups = pack_sub_groups(pieces, 8)
    assert [[(p.start, p.end) for p in group] for group in groups] == [[(0, 3), (3, 7)], [(7, 9)], [(9, 20)]]


def test_offload_outside_its_stages_is_refused_in_one_line():
    from base.errors import ConfigError
    with pytest.raises(ConfigError, match=r"^--offload-optimizer needs --zero-stage 1, 2 or 3 .*add --zero-stage 1"):
        ZeroConfig(stage=0, offload_optimizer=True).validate()
    with pytest.raises(ConfigError, match=r"^--offload-param needs --zero-stage 3 .*got --zero-stage 2"):
        ZeroConfig(stage=2, offload_param=True).validate()
    with pytest.raises(ConfigError, match=r"^--sub-group-size must be at least 1"):
        ZeroConfig(stage=2, offload_optimizer=True, sub_group_size=0).validate()
    ZeroConfig(stage=3, offload_optimizer=True, offload_param=True).validate()
