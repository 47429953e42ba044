"""--fp8-param-gather under ZeRO 1-3 (issue 65): the FP8 linears' weights cast to e4m3 from the fp32 master shards
after each step and all-gathered as FP8 bytes, against ZeRO 0 with the forward casting the weights.

Bitwise, per Megatron-Core's quantize_param_shard (megatron/core/fp8_utils.py) and TE's cast_master_weights_to_fp8:
each shard is cast with the whole weight's scale (tensorwise: the shards' amaxes max all-reduced, then TE's
compute_scale_from_amax, the forward's own formula; delayed: the weight's current scale, its amax written to the
history and the scale updated at the next forward), so every e4m3 byte is the byte ZeRO 0's forward casts, and the
GEMMs are the same calls. One micro-batch per step and rank: with several, delayed scaling's weight is cast once per
step with the flag, once per micro-batch without it (TE's FP8 parameters; said at start-up).
"""

import pytest
import torch

from tests.zero.test_zero_training import COMMON, Runs, losses_of

ITERS = 3
FP8 = ["--train-iters", str(ITERS), "--num-attention-heads", "2", "--global-batch-size", "2", "--micro-batch-size",
       "1", "--clip-grad", "0", "--fp8-format", "hybrid"]
GATHER = ["--zero-stage", "3", "--fp8-param-gather"]


def _elements_of_fp8_weights():
    """The FP8 linears' weight elements of COMMON's model on one TP rank: per block the fused QKV (3h x h), the
    attention projection (h x h), and the MLP's two (4h x h each)."""
    hidden = int(COMMON[COMMON.index("--hidden-size") + 1])
    layers = int(COMMON[COMMON.index("--num-layers") + 1])
    return layers * (3 + 1 + 4 + 4) * hidden * hidden


@pytest.mark.slow
def test_fp8_param_gather_equals_zero0_and_gathers_one_byte_per_weight(tmp_path, corpus_cache):
    runs = Runs(tmp_path, corpus_cache)
    for recipe in ("tensorwise", "delayed"):
        runs.add(f"{recipe}-zero0", *FP8, "--fp8-recipe", recipe)
        runs.add(f"{recipe}-zero3-gather", *FP8, "--fp8-recipe", recipe, *GATHER)
    runs.add("tensorwise-zero3", *FP8, "--fp8-recipe", "tensorwise", "--zero-stage", "3")
    # ZeRO 1 (Megatron's distributed optimizer) and 2: the FP8 weights' buckets gathered as bytes at the step
    runs.add("delayed-zero1-gather", *FP8, "--fp8-recipe", "delayed", "--use-distributed-optimizer",
             "--fp8-param-gather")
    runs.add("delayed-zero1", *FP8, "--fp8-recipe", "delayed", "--use-distributed-optimizer")
    runs.add("tensorwise-zero2-gather", *FP8, "--fp8-recipe", "tensorwise", "--zero-stage", "2", "--fp8-param-gather")
    # delayed ZeRO 3 with the flag saved at iteration 2 and resumed: the histories are restored before the master is
    # published, so the weights are cast with the saved scales
    save = str(tmp_path / "ckpt")
    runs.add("delayed-saved", *FP8, "--fp8-recipe", "delayed", *GATHER, "--save", save, "--exit-interval", "2")
    runs.add("delayed-resumed", *FP8, "--fp8-recipe", "delayed", *GATHER, "--save", save, "--load", save)
    launched = runs.launch(2, 1)
    resumed = [(r["iteration"], r["loss"]) for r in launched["delayed-resumed"] if "loss" in r]
    assert resumed == [(3, losses_of(launched["delayed-zero0"])[2])]
    for recipe in ("tensorwise", "delayed"):
        reference = losses_of(launched[f"{recipe}-zero0"])
        assert len(reference) == ITERS
        assert losses_of(launched[f"{recipe}-zero3-gather"]) == reference, recipe
    assert losses_of(launched["delayed-zero1-gather"]) == losses_of(launched["delayed-zero0"])
    assert losses_of(launched["tensorwise-zero2-gather"]) == losses_of(launched["tensorwise-zero0"])
    # The bytes: every iteration gathers each chunk twice (forward and backward; the blocks are not persistent at
    # --stage3-param-persistence-threshold 0), and a rank sends half of what one gather moves (2 ranks). The FP8
    # weights' chunks move 1 byte per element where the fp32 run moves 4: 3 bytes fewer per element, per gather.
    def gathered(name):
        return [r["comm_bytes"]["dp"]["all_gather"] for r in launched[name] if "loss" in r]
    plain, fp8 = gathered("tensorwise-zero3"), gathered("tensorwise-zero3-gather")
    assert losses_of(launched["tensorwise-zero3"]) == losses_of(launched["tensorwise-zero0"])
    saved_per_gather = 3 * _elements_of_fp8_weights() // 2
    for before, after in zip(plain, fp8):
        assert before - after == 2 * saved_per_gather, (before, after)
    # ZeRO 1 publishes (gathers) every parameter once per step: 3 bytes fewer per FP8 weight element, once. Not
    # exactly: the FP8 weights' own buckets re-cut the other buckets, each padded to 2 ranks x 64 elements; measured
    # 512 bytes (128 fp32 elements of padding a rank sends) above the 147,456 saved.
    padding = 4 * 2 * 64 * 4 // 2  # at most 4 buckets' padding more, fp32, half sent by each of the 2 ranks
    for before, after in zip(gathered("delayed-zero1"), gathered("delayed-zero1-gather")):
        assert 0 <= before - after - saved_per_gather <= padding, (before, after)


def test_blockwise_shards_cast_to_the_whole_weights_blocks():
    """TE's _cast_master_weights_to_fp8_blockwise_scaling (transformer_engine/pytorch/tensor/utils.py, TE 2.4 on):
    each shard's per-block amax of the fp32 master, max-reduced, the power-of-two scales, each element cast with its
    block's: shards cut anywhere (mid-row, mid-block) give quantize_blocks_2d's bytes and scales of the fp32 master,
    the forward's own cast in an fp32 run. The master is cast from fp32, not first to the model's dtype (the
    forward's cast of a bf16 weight), which the start-up line names for 16-bit runs."""
    from parallel.fp8.block_scaling import quantize_blocks_2d
    from parallel.fp8.kernel import E4M3
    from parallel.fp8.param_gather import (
        Fp8Weight,
        block_amax,
        block_index,
        block_scale,
        cast_block_shard,
        dequantized,
        scale_shape,
    )

    generator = torch.Generator().manual_seed(0)
    master = torch.randn(300, 200, generator=generator) * torch.rand(300, 1, generator=generator) * 4
    shape, flat = master.shape, master.reshape(-1)
    blocks = scale_shape("blockwise", shape)
    assert blocks == (3, 2) and scale_shape("tensorwise", shape) == ()
    cuts = [0, 12_345, 12_346, 40_001, flat.numel()]  # three shards, one of a single element
    pieces = [(start, flat[start:end], block_index(start, end - start, shape, master.device))
              for start, end in zip(cuts, cuts[1:])]
    amax = torch.stack([block_amax(piece, index, 6) for _, piece, index in pieces]).amax(dim=0)
    scale = block_scale(amax).reshape(blocks)
    data = torch.cat([cast_block_shard(piece, index, scale) for _, piece, index in pieces]).view(E4M3).view(shape)
    want_data, want_scale_inv = quantize_blocks_2d(master, E4M3)
    assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8))
    assert torch.equal(torch.reciprocal(scale), want_scale_inv)
    back = dequantized(Fp8Weight(data, torch.reciprocal(scale)))
    assert torch.equal(back, want_data.float() * want_scale_inv.repeat_interleave(128, 0)[:300].repeat_interleave(
        128, 1)[:, :200])
    # a bf16 run's forward casts the bf16 weight: the master's own cast differs from it somewhere (double rounding)
    bf16_data, _ = quantize_blocks_2d(master.bfloat16(), E4M3)
    assert not torch.equal(data.view(torch.uint8), bf16_data.view(torch.uint8))


@pytest.mark.slow
def test_blockwise_fp8_param_gather_equals_zero0(tmp_path, corpus_cache):
    """--fp8-recipe blockwise with --fp8-param-gather at ZeRO 3 and ZeRO 1 (2 gloo ranks, fp32, 3 iterations): the
    weights' 128x128 blocks cast from the master shards (a shard ends mid-block here: 64-wide weights of 64 to 256
    rows cut in two) give ZeRO 0's losses bit for bit, and ZeRO 3 gathers 3 bytes fewer per FP8 weight element."""
    runs = Runs(tmp_path, corpus_cache)
    blockwise = [*FP8, "--fp8-recipe", "blockwise"]
    runs.add("zero0", *blockwise)
    runs.add("zero3", *blockwise, "--zero-stage", "3")
    runs.add("zero3-gather", *blockwise, *GATHER)
    runs.add("zero1-gather", *blockwise, "--use-distributed-optimizer", "--fp8-param-gather")
    launched = runs.launch(2, 1)
    reference = losses_of(launched["zero0"])
    assert len(reference) == ITERS
    for name in ("zero3", "zero3-gather", "zero1-gather"):
        assert losses_of(launched[name]) == reference, name
    plain, fp8 = ([r["comm_bytes"]["dp"]["all_gather"] for r in launched[name] if "loss" in r]
                  for name in ("zero3", "zero3-gather"))
    for before, after in zip(plain, fp8):
        assert before - after == 2 * (3 * _elements_of_fp8_weights() // 2), (before, after)


def test_the_start_up_line_names_the_blockwise_cast():
    """The blockwise difference is said at the start, and MXFP8's two casts; the per-tensor recipes' words stay
    theirs."""
    from gpt.fp8 import startup_line
    from parallel.fp8.recipes import Fp8Recipe

    def line(recipe):
        return startup_line(Fp8Recipe(fp8_format="hybrid", recipe=recipe), torch.device("cpu"), None, ["x"], [], [],
                            [], False, False, 0.0, False, [], True)

    assert "each 128x128 block's scale" in line("blockwise") and "in 16-bit runs a byte" in line("blockwise")
    assert "scale from the whole weight's amax" in line("tensorwise") and "128x128" not in line("tensorwise")
    assert "each 1x32 block's E8M0 scale" in line("mxfp8") and "gathers 2 bytes per element" in line("mxfp8")
    assert "gathers 1 byte per element" in line("tensorwise")


def test_mxfp8_shards_cast_to_the_forwards_both_ways():
    """MXFP8's cast from the master (parallel/fp8/param_gather.py): shards cut anywhere (mid-row, mid-block, a
    single element) give each 1x32 block's amax along the rows and along the columns, max-reduced, and both casts:
    block_scaling.quantize_mx's bytes and E8M0 scales of W and of W^T, the forward's own casts, in fp32 and in bf16
    (the master is first cast to the model's dtype, as the forward casts the weight)."""
    from parallel.fp8.block_scaling import quantize_mx
    from parallel.fp8.kernel import E4M3
    from parallel.fp8.param_gather import (
        Fp8Weight,
        block_amax,
        cast_mx_shard,
        dequantized,
        mx_block_index,
        mx_dequantizing_scales,
        mx_exponents,
        mx_scale_shapes,
    )

    generator = torch.Generator().manual_seed(0)
    master = torch.randn(96, 64, generator=generator) * torch.rand(96, 1, generator=generator) * 4
    master[5, :32] = 0  # a block of zeros: E8M0 exponent 0, as the forward's
    shape, flat = master.shape, master.reshape(-1)
    assert mx_scale_shapes(shape) == ((96, 2), (64, 3))
    cuts = [0, 1000, 1001, 4099, flat.numel()]
    for dtype in (torch.float32, torch.bfloat16):
        pieces = [(flat[start:end].to(dtype).float(), mx_block_index(start, end - start, shape, master.device))
                  for start, end in zip(cuts, cuts[1:])]
        amax = torch.stack([block_amax(values.repeat(2), index.reshape(-1), 96 * 2 + 64 * 3)
                            for values, index in pieces]).amax(dim=0)
        exponent = mx_exponents(amax)
        casts = [cast_mx_shard(values, index, exponent) for values, index in pieces]
        rows, cols = (torch.cat([cast[direction] for cast in casts]).view(shape) for direction in (0, 1))
        rows_scale, cols_scale = mx_dequantizing_scales(exponent, shape)
        want_rows, want_rows_scale = quantize_mx(master.to(dtype), E4M3)
        want_cols, want_cols_scale = quantize_mx(master.to(dtype).t(), E4M3)
        assert torch.equal(rows, want_rows.view(torch.uint8)) and torch.equal(rows_scale, want_rows_scale), dtype
        assert torch.equal(cols.t(), want_cols.view(torch.uint8)) and torch.equal(cols_scale, want_cols_scale), dtype
        back = dequantized(Fp8Weight(rows.view(E4M3), rows_scale, cols.view(E4M3), cols_scale))
        assert torch.equal(back, want_rows.float() * want_rows_scale.repeat_interleave(32, 1)), dtype


@pytest.mark.slow
def test_mxfp8_fp8_param_gather_equals_zero0(tmp_path, corpus_cache):
    """--fp8-recipe mxfp8 with --fp8-param-gather at ZeRO 3 and at ZeRO 1 (with Megatron-LM's
    --reuse-grad-buf-for-mxfp8-param-ag, memory only) on 2 gloo ranks, fp32, 3 iterations: the rowwise and columnwise
    casts made from the master shards (weights of 64 to 256 rows cut in two, mid-block for the columns' 32-row
    blocks) give ZeRO 0's losses bit for bit, and ZeRO 3 gathers 2 bytes fewer per FP8 weight element (2 of them,
    the two casts, where fp32 moves 4). In bf16 too (the master cast to bf16 first, as the forward's weight): ZeRO 3
    with the flag gives bf16 ZeRO 0's losses bit for bit."""
    runs = Runs(tmp_path, corpus_cache)
    mxfp8 = [*FP8, "--fp8-recipe", "mxfp8"]
    runs.add("zero0", *mxfp8)
    runs.add("zero3", *mxfp8, "--zero-stage", "3")
    runs.add("zero3-gather", *mxfp8, *GATHER)
    runs.add("zero1-gather", *mxfp8, "--use-distributed-optimizer", "--fp8-param-gather",
             "--reuse-grad-buf-for-mxfp8-param-ag")
    runs.add("bf16-zero0", *mxfp8, "--bf16")
    runs.add("bf16-zero3-gather", *mxfp8, "--bf16", *GATHER)
    launched = runs.launch(2, 1)
    reference = losses_of(launched["zero0"])
    assert len(reference) == ITERS
    for name in ("zero3", "zero3-gather", "zero1-gather"):
        assert losses_of(launched[name]) == reference, name
    bf16 = losses_of(launched["bf16-zero0"])
    assert len(bf16) == ITERS and bf16 != reference
    assert losses_of(launched["bf16-zero3-gather"]) == bf16
    plain, fp8 = ([r["comm_bytes"]["dp"]["all_gather"] for r in launched[name] if "loss" in r]
                  for name in ("zero3", "zero3-gather"))
    for before, after in zip(plain, fp8):
        assert before - after == 2 * (2 * _elements_of_fp8_weights() // 2), (before, after)
