"""The MoE families' blocks under every parallel dimension (issue 63), fp32 on 2 gloo ranks, 5 iterations from the
same tiny transformers folder (tests/checkpoint/moe_family_folders.py, --init-from-hf), losses and gradient norms
equal to <= 1e-6 relative (not bitwise: the sums over ranks come in another order):

- GPT-OSS's features - attention sinks (--softmax-type learnable), quick-GeGLU experts with their clamp and +1
  offset and biases, the router's bias, YaRN positions, the sliding window on every other layer - at TP 2 with
  sequence parallelism, PP 2, and ZeRO 1, 2 and 3 over 2 data-parallel ranks, each equal to ZeRO 0 over the same 2;
- expert parallelism 2 equal to 1 for the DeepSeek-V3-, GPT-OSS- and Qwen3-MoE-shaped folders (MLA with the sigmoid
  router, its groups, scaling and correction bias; GPT-OSS's; a dense first layer and softmax routing);
- GLM-4.5's blocks - the sigmoid router with its groups, scaling and correction bias, a shared expert, a dense first
  layer, partial rotary, q/k/v biases, per-head q/k norms, 6 heads of 16 over a hidden size of 64 - at TP 2 with
  sequence parallelism equal to TP 1 over the same 2 ranks."""

from __future__ import annotations

import json

import pytest

from tests.checkpoint.moe_family_folders import family_folder
from tests.distributed import free_port, run_distributed
from tests.training.test_moe_training import launch_rank

RUN = ["--train-iters", "5", "--eval-iters", "0", "--micro-batch-size", "2", "--global-batch-size", "4",
       "--log-interval", "1", "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0",
       "--tokenizer-vocab-size", "300", "--lr", "1e-3", "--lr-warmup-iters", "0", "--seed", "5"]


def logged(path):
    return [(record["loss"], record["grad_norm"]) for record in map(json.loads, path.read_text().splitlines())
            if "loss" in record and "split" not in record]


def run_variants(tmp_path, folder, corpus, variants):
    argv = [["--init-from-hf", str(folder), *RUN, "--data-cache-dir", corpus, *extra,
             "--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in variants.items()]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in variants], timeout=900)
    return {name: logged(tmp_path / f"{name}.jsonl") for name in variants}


def assert_equal_runs(runs, reference):
    expected = [value for record in runs[reference] for value in record]
    assert len(runs[reference]) == 5
    for name, records in runs.items():
        assert [value for record in records for value in record] == pytest.approx(expected, rel=1e-6, abs=0), name


@pytest.mark.slow
def test_gpt_oss_blocks_at_tp2_pp2_and_zero_1_2_3_train_as_zero_0(tmp_path, corpus_cache_300):
    folder = family_folder("gpt_oss", tmp_path / "gpt_oss")
    runs = run_variants(tmp_path, folder, corpus_cache_300, {
        "zero0": [], "zero1": ["--zero-stage", "1"], "zero2": ["--zero-stage", "2"], "zero3": ["--zero-stage", "3"],
        "tp2_sp": ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
        "pp2": ["--pipeline-model-parallel-size", "2"]})
    assert_equal_runs(runs, "zero0")


@pytest.mark.slow
def test_expert_parallel_2_trains_the_deepseek_gpt_oss_and_qwen3_moe_folders_as_1(tmp_path, corpus_cache_300):
    variants = {}
    for family in ("deepseek_v3", "gpt_oss", "qwen3_moe"):
        folder = family_folder(family, tmp_path / family)
        variants[f"{family}_ep1"] = ["--init-from-hf", str(folder)]
        variants[f"{family}_ep2"] = ["--init-from-hf", str(folder), "--expert-model-parallel-size", "2"]
    argv = [[*extra, *RUN, "--data-cache-dir", corpus_cache_300, "--metrics-file", str(tmp_path / f"{name}.jsonl")]
            for name, extra in variants.items()]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in variants], timeout=900)
    for family in ("deepseek_v3", "gpt_oss", "qwen3_moe"):
        assert_equal_runs({name: logged(tmp_path / f"{name}.jsonl") for name in (f"{family}_ep1", f"{family}_ep2")},
                          f"{family}_ep1")


@pytest.mark.slow
def test_glm_4_5_blocks_at_tp2_train_as_tp1(tmp_path, corpus_cache_300):
    folder = family_folder("glm4_moe", tmp_path / "glm4_moe")
    runs = run_variants(tmp_path, folder, corpus_cache_300, {
        "tp1": [], "tp2_sp": ["--tensor-model-parallel-size", "2", "--sequence-parallel"]})
    assert_equal_runs(runs, "tp1")
