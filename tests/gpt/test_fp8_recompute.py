"""Delayed scaling under activation recomputation (issue 65): the recomputed forward casts with the original
forward's scales and no amax history is updated twice, as TransformerEngine's checkpoint keeps it
(copy_forward_fp8_meta_tensors_for_recompute / get_old_fp8_meta_tensors_for_recompute / restore_fp8_meta_tensors,
parallel/fp8/recompute.py), so --recompute-granularity full gives the run without recomputation bit for bit.
Megatron's selective recompute checkpoints nothing here (the core attention's scores are never stored), so it has
no FP8 linear to recompute."""

import json

import pytest
import torch

import pretrain_gpt
from parallel.fp8.delayed_updates import FORWARD, update_delayed_scales
from parallel.fp8.recipes import INPUT, WEIGHT, DelayedScaling, Fp8Recipe
from parallel.fp8.recompute import recomputing, stash_for_recompute
from tests.zero.test_zero_training import COMMON

# 2 micro-batches per step (the stash is a FIFO, one entry per checkpointed forward), a history of 4 with 'max'
DELAYED = ["--train-iters", "3", "--num-attention-heads", "2", "--global-batch-size", "4", "--micro-batch-size", "2",
           "--fp8-format", "hybrid", "--fp8-recipe", "delayed", "--fp8-amax-history-len", "4",
           "--fp8-amax-compute-algo", "max"]


def _losses(tmp_path, corpus_cache, name, *extra):
    metrics = tmp_path / f"{name}.jsonl"
    argv = COMMON + ["--data-cache-dir", corpus_cache, "--metrics-file", str(metrics), *DELAYED, *extra]
    assert pretrain_gpt.main(argv) == 0
    return [r["loss"] for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r and "split" not in r]


@pytest.mark.slow
def test_delayed_scaling_with_full_recompute_equals_no_recompute_bitwise(tmp_path, corpus_cache):
    plain = _losses(tmp_path, corpus_cache, "plain")
    recomputed = _losses(tmp_path, corpus_cache, "recomputed", "--recompute-granularity", "full",
                         "--recompute-method", "uniform", "--recompute-num-layers", "1")
    assert len(plain) == 3 and recomputed == plain
    # Megatron's block method: the first layer recomputed, the other run once, each casting with its own scales
    block = _losses(tmp_path, corpus_cache, "block", "--recompute-granularity", "full", "--recompute-method", "block",
                    "--recompute-num-layers", "1")
    assert block == plain


def test_a_recomputed_cast_uses_the_stashed_scale_and_leaves_the_state_as_the_forward_left_it():
    scaling = DelayedScaling(Fp8Recipe(amax_history_len=2))
    x = torch.full((16, 16), 3.0)
    stash_for_recompute([scaling])
    first, _ = scaling.quantize(x, INPUT, torch.float8_e4m3fn)  # the original forward: scale 1
    update_delayed_scales([scaling], FORWARD)  # then its pass's update
    after_forward = (scaling.amax_history.clone(), scaling.scale.clone())
    assert scaling.scale[INPUT] != 1.0
    with recomputing([scaling]):
        again, _ = scaling.quantize(x * 2, INPUT, torch.float8_e4m3fn)  # cast with the stashed scale 1
        scaling.record_amax(WEIGHT, torch.tensor(5.0))  # a weight gathered in FP8: recorded, then put back too
    assert torch.equal(again.float(), (x * 2).to(torch.float8_e4m3fn).float())
    assert torch.equal(scaling.amax_history, after_forward[0]) and torch.equal(scaling.scale, after_forward[1])
    assert len(scaling._recompute_stash) == 0
