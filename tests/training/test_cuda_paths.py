"""The `cuda` tier (issue 88 item 1): every CUDA-only path trained end to end on one GPU, a few iterations of a small
GPT, its losses against the same run on the GPU without that path. Collected always, skipped without CUDA, so CI on
its CPUs is unchanged; on a GPU: `python -m pytest -m cuda tests/training/test_cuda_paths.py -n 0`.

Bitwise where the path moves no math (CUDA graphs, activations kept in host memory, parameters kept in host memory,
the background save, the side streams on one rank, CUDA_LAUNCH_BLOCKING); a stated tolerance where it changes the
kernels (the optimizer on the CPU, inductor, FP8's compiled casts, the grouped expert GEMM). Multi-rank paths are not
here: NCCL refuses two ranks on one device and the project's CUDA runs take NCCL (the backend follows the device), so
the overlapped reduction's cross-rank work waits for a machine of two GPUs; on one rank its streams still run.

CUDA_TIER_DEVICE=cpu runs the tests that have a CPU path on the CPU: a check of the command lines, not of CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pretrain_gpt

DEVICE = os.environ.get("CUDA_TIER_DEVICE", "cuda")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                 reason="no CUDA device: the cuda tier runs on a GPU (docs/testing.md)")]
on_cuda_only = pytest.mark.skipif(DEVICE != "cuda", reason="a CUDA-only path")

SMALL = ["--device", DEVICE, "--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "128", "--max-position-embeddings", "128", "--micro-batch-size", "2",
         "--global-batch-size", "4", "--train-iters", "8", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0",
         "--attention-dropout", "0", "--hidden-dropout", "0", "--seed", "1234"]


def train(tmp_path: Path, cache: str, name: str, *extra: str) -> list[dict]:
    """One in-process run of pretrain_gpt.py; its training records (loss, grad norm) in order."""
    metrics = tmp_path / f"{name}.jsonl"
    assert pretrain_gpt.main([*SMALL, "--data-cache-dir", cache, "--metrics-file", str(metrics), *extra]) == 0, name
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r and "split" not in r]


def losses(records: list[dict]) -> list[float]:
    return [record["loss"] for record in records]


def assert_close(got: list[float], want: list[float], relative: float, what: str) -> None:
    assert len(got) == len(want) > 0, what
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
    print(f"{what}: worst relative loss difference {worst:.3g} (bitwise: {got == want})")
    assert worst <= relative, f"{what}: {got} vs {want}"
    assert want[-1] < want[0], f"{what}: did not train ({want})"


@on_cuda_only
def test_cuda_graphs_local_train_to_the_eager_losses(tmp_path, corpus_cache, capsys):
    """Not bitwise: on an H200 (torch 2.11) the replayed iterations' losses were 3.6e-6 apart from eager's from the
    first replay on, not growing (cause not established: the captured kernels' choice or their reduction order)."""
    eager = losses(train(tmp_path, corpus_cache, "eager", "--bf16"))
    graphed = losses(train(tmp_path, corpus_cache, "graphs", "--bf16", "--cuda-graph-impl", "local"))
    assert "captured" in capsys.readouterr().out
    assert_close(graphed, eager, 1e-5, "--cuda-graph-impl local")


@pytest.mark.parametrize("fp8_format, recipe", [("hybrid", "tensorwise"), ("hybrid", "delayed"),
                                               ("hybrid", "blockwise"), ("e4m3", "blockwise")])
def test_fp8_fused_casts_train_to_the_unfused_losses(tmp_path, corpus_cache, capsys, fp8_format, recipe):
    """The fused cast regions (inductor's kernels on CUDA; auto fuses there) against the unfused casts, and both
    within 2% of bf16. 2e-3 between the two: a scale one ulp apart moves a few values across an FP8 rounding step
    (on the CPU the two are bitwise, tests/gpt/test_fp8_fused_run.py). Blockwise e4m3 runs all three GEMMs on torch's
    native block-scaled kernel on sm90; hybrid its forward only."""
    fp8 = ("--bf16", "--fp8-format", fp8_format, "--fp8-recipe", recipe)
    bf16 = losses(train(tmp_path, corpus_cache, "bf16", "--bf16"))
    unfused_records = train(tmp_path, corpus_cache, "unfused", *fp8, "--fp8-fused-casts", "off")
    fused_records = train(tmp_path, corpus_cache, "fused", *fp8, "--fp8-fused-casts",
                          "auto" if DEVICE == "cuda" else "on")
    out = capsys.readouterr().out
    assert "casts fused" in out, out[-2000:]
    # The guard's figures, and no layer in high precision: a scale from its own cast's amax (or, delayed, a healthy
    # history) saturates no more than an ulp's worth of values, far under the 5% that sends a layer to high precision.
    # (The second H200 lease saw every layer's GEMMs in high precision with the casts fused: the fp32 GEMMs of its
    # backward in the profile.)
    for name, records in (("unfused", unfused_records), ("fused", fused_records)):
        print(f"{name}: " + "; ".join(f"{field} {[record.get(field) for record in records]}" for field in
                                      ("fp8_saturated", "fp8_flushed", "fp8_worst_saturated_fraction",
                                       "fp8_high_precision_layers")))
    assert [line for line in out.splitlines() if "FP8 guard:" in line] == []
    unfused, fused = losses(unfused_records), losses(fused_records)
    assert_close(fused, unfused, 2e-3, f"FP8 {fp8_format} {recipe} fused against unfused")
    assert_close(fused, bf16, 2e-2, f"FP8 {fp8_format} {recipe} against bf16")


def test_compile_trains_to_the_eager_losses(tmp_path, corpus_cache):
    """fp32, so that the tolerance is inductor's reordering alone (1e-4 over 8 iterations)."""
    eager = losses(train(tmp_path, corpus_cache, "eager"))
    compiled = losses(train(tmp_path, corpus_cache, "compiled", "--compile"))
    assert_close(compiled, eager, 1e-4, "--compile (fp32)")


def test_optimizer_in_host_memory(tmp_path, corpus_cache):
    """ZeRO-Offload with pinned buffers, and Megatron's hybrid CPU optimizer (half the states on the host), against
    the optimizer on the GPU: fp32, the CPU's Adam against CUDA's (1e-5)."""
    on_device = losses(train(tmp_path, corpus_cache, "device", "--zero-stage", "2"))
    offloaded = losses(train(tmp_path, corpus_cache, "offload", "--zero-stage", "2", "--offload-optimizer",
                             "--offload-pin-memory"))
    assert_close(offloaded, on_device, 1e-5, "--offload-optimizer --offload-pin-memory")
    megatron = ("--use-distributed-optimizer", "--use-precision-aware-optimizer")
    device_states = losses(train(tmp_path, corpus_cache, "megatron", *megatron))
    hybrid = losses(train(tmp_path, corpus_cache, "hybrid", *megatron, "--optimizer-cpu-offload",
                          "--optimizer-offload-fraction", "0.5"))
    assert_close(hybrid, device_states, 1e-5, "--optimizer-cpu-offload --optimizer-offload-fraction 0.5")


def test_parameters_in_host_memory_move_no_math(tmp_path, corpus_cache):
    stage3 = ("--bf16", "--zero-stage", "3", "--offload-optimizer", "--offload-pin-memory")
    plain = losses(train(tmp_path, corpus_cache, "plain", *stage3))
    offloaded = losses(train(tmp_path, corpus_cache, "param", *stage3, "--offload-param"))
    assert_close(offloaded, plain, 0.0, "--offload-param (ZeRO 3, pinned)")


def test_activations_in_host_memory_move_no_math(tmp_path, corpus_cache):
    recompute = ("--bf16", "--checkpoint-activations")
    plain = losses(train(tmp_path, corpus_cache, "plain", *recompute))
    host = losses(train(tmp_path, corpus_cache, "host", *recompute, "--partition-activations", "--cpu-checkpointing"))
    assert_close(host, plain, 0.0, "P_a+cpu (--cpu-checkpointing)")


def test_side_streams_on_one_rank_move_no_math(tmp_path, corpus_cache):
    plain = losses(train(tmp_path, corpus_cache, "plain", "--bf16", "--zero-stage", "2"))
    overlapped = losses(train(tmp_path, corpus_cache, "overlap", "--bf16", "--zero-stage", "2",
                              "--overlap-grad-reduce", "--overlap-param-gather"))
    assert_close(overlapped, plain, 0.0, "--overlap-grad-reduce --overlap-param-gather (one rank)")


def test_grouped_expert_gemm(tmp_path, corpus_cache):
    """fp32: one grouped GEMM against a GEMM per expert (1e-5: another summation order)."""
    moe = ("--num-experts", "4", "--moe-router-topk", "2")
    per_expert = losses(train(tmp_path, corpus_cache, "per-expert", *moe))
    grouped = losses(train(tmp_path, corpus_cache, "grouped", *moe, "--moe-grouped-gemm"))
    assert_close(grouped, per_expert, 1e-5, "--moe-grouped-gemm")


def test_a_background_save_resumes_to_the_straight_run(tmp_path, corpus_cache):
    """--async-save's device-to-host copies: 8 iterations straight against 4, a background save at exit, a resume."""
    straight = losses(train(tmp_path, corpus_cache, "straight", "--bf16"))
    checkpoint = str(tmp_path / "checkpoint")
    first = losses(train(tmp_path, corpus_cache, "first", "--bf16", "--async-save", "--save", checkpoint,
                         "--exit-interval", "4"))
    second = losses(train(tmp_path, corpus_cache, "second", "--bf16", "--async-save", "--save", checkpoint,
                          "--load", checkpoint))
    assert_close(first + second, straight, 0.0, "--async-save, exit at 4, resume")


@on_cuda_only
def test_launch_blocking_gives_the_same_losses(tmp_path, corpus_cache):
    """The streamed paths together (pinned optimizer offload, host activations, overlap) in a process with
    CUDA_LAUNCH_BLOCKING=1 against this process: an unsynchronised stream would show as a difference."""
    streamed = ["--bf16", "--zero-stage", "2", "--offload-optimizer", "--offload-pin-memory", "--overlap-grad-reduce",
                "--overlap-param-gather", "--checkpoint-activations", "--partition-activations", "--cpu-checkpointing"]
    here = losses(train(tmp_path, corpus_cache, "here", *streamed))
    metrics = tmp_path / "blocking.jsonl"
    done = subprocess.run([sys.executable, str(ROOT / "pretrain_gpt.py"), *SMALL, *streamed, "--data-cache-dir",
                           corpus_cache, "--metrics-file", str(metrics)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "CUDA_LAUNCH_BLOCKING": "1", "WANDB_MODE": "disabled"}, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    blocking = [r["loss"] for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r and "split" not in r]
    assert_close(blocking, here, 0.0, "CUDA_LAUNCH_BLOCKING=1")


@on_cuda_only
def test_the_planner_predicts_the_peak(tmp_path, corpus_cache):
    """A model whose activations and states dwarf the CUDA context's workspaces, in a process of its own (this one's
    earlier runs leave cached kernels and graph pools behind): the start-up check's line, the planner's predicted peak
    over CUDA's max_memory_allocated, within 0.9-1.05 (the issue's bound)."""
    argv = [*SMALL, "--bf16", "--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16",
            "--seq-length", "1024", "--max-position-embeddings", "1024", "--micro-batch-size", "4",
            "--global-batch-size", "8", "--train-iters", "3", "--data-cache-dir", corpus_cache]
    done = subprocess.run([sys.executable, str(ROOT / "pretrain_gpt.py"), *argv], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "WANDB_MODE": "disabled"}, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = next(line for line in done.stdout.splitlines() if "memory after iteration" in line)
    print(line)
    predicted = float(line.split("predicted peak ")[1].split(" MiB")[0])
    measured = float(line.split("measured ")[1].split(" MiB")[0])
    assert 0.9 <= predicted / measured <= 1.05, line
