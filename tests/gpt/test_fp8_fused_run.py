"""--fp8-fused-casts in a training run (issue 87 item 1): a tiny GPT (bf16, 2 micro-batches an iteration, so that the
second reuses each weight's cast, the guard on, each FP8 weight gradient added into its fp32 main gradient in the
backward's epilogue: --gradient-accumulation-fusion, the default) trains 3 iterations with the casts fused (compiled
regions, `on`) to the unfused run's losses and guard counts bit for bit, delayed and tensorwise; the start-up line says
which path ran.
The default on a CPU (auto) is the unfused path."""

import json

import pytest

import pretrain_gpt
from arguments.parser import parse_config
from parallel.fp8.fused import compile_unavailable

TRAIN = ["--device", "cpu", "--num-layers", "1", "--hidden-size", "64", "--num-attention-heads", "2",
         "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "2",
         "--train-iters", "3", "--lr", "3e-3", "--log-interval", "1", "--eval-iters", "0", "--bf16",
         "--attention-dropout", "0", "--hidden-dropout", "0", "--fp8-format", "hybrid"]
GUARD_FIELDS = ("fp8_cast_values", "fp8_saturated", "fp8_flushed", "fp8_worst_saturated_fraction", "fp8_amax_max")


def _records(tmp_path, corpus_cache, name, *extra):
    metrics = tmp_path / f"{name}.jsonl"
    assert pretrain_gpt.main([*TRAIN, "--data-cache-dir", corpus_cache, "--metrics-file", str(metrics), *extra]) == 0
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r and "split" not in r]


def test_the_switch_and_its_default():
    assert parse_config([]).model.fp8.fused_casts == "auto"
    assert parse_config(["--fp8-fused-casts", "on"]).model.fp8.fused_casts == "on"


@pytest.mark.slow
@pytest.mark.skipif(compile_unavailable("cpu") is not None, reason="inductor cannot compile here")
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fused_casts_train_to_the_unfused_runs_bits(tmp_path, corpus_cache, capsys, recipe):
    into_main_gradient = "4 tensor-parallel linears add their weight gradient into the fp32 main gradient inside the " \
        "GEMM, 4 FP8"
    unfused = _records(tmp_path, corpus_cache, "off", "--fp8-recipe", recipe, "--fp8-fused-casts", "off")
    out = capsys.readouterr().out
    assert "casts unfused (--fp8-fused-casts off)" in out and into_main_gradient in out
    fused = _records(tmp_path, corpus_cache, "on", "--fp8-recipe", recipe, "--fp8-fused-casts", "on")
    out = capsys.readouterr().out
    assert "casts fused: each cast" in out and into_main_gradient in out
    assert len(fused) == len(unfused) == 3
    for mine, theirs in zip(fused, unfused):
        assert mine["loss"] == theirs["loss"]
        for field in GUARD_FIELDS:
            assert mine[field] == theirs[field], field
    assert unfused[-1]["loss"] != unfused[0]["loss"]  # it trained


def test_auto_runs_the_unfused_path_on_a_cpu_and_says_why(tmp_path, corpus_cache, capsys):
    _records(tmp_path, corpus_cache, "auto", "--fp8-recipe", "tensorwise", "--train-iters", "1")
    assert "casts unfused (--fp8-fused-casts auto on cpu" in capsys.readouterr().out


def test_the_path_taken_is_named_with_its_reason(monkeypatch):
    """resolve_fused_casts (parallel/fp8/fused.py) per device and mode, inductor compiling or not; the start-up line's
    GPU clause about eager FP8's speed stays with the unfused path only."""
    import torch

    from gpt.fp8 import startup_line
    from parallel.fp8 import fused
    from parallel.fp8.recipes import Fp8Recipe

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(fused, "compile_unavailable", lambda device_type: None)
    assert fused.resolve_fused_casts("auto", cuda)[0] and fused.resolve_fused_casts("on", cpu)[0]
    assert not fused.resolve_fused_casts("auto", cpu)[0] and not fused.resolve_fused_casts("off", cuda)[0]
    monkeypatch.setattr(fused, "compile_unavailable", lambda device_type: "no Triton for inductor's CUDA kernels")
    assert fused.resolve_fused_casts("auto", cuda) == \
        (False, "casts unfused: no Triton for inductor's CUDA kernels (--fp8-fused-casts auto)")

    def line(fusion):
        return startup_line(Fp8Recipe(recipe="tensorwise"), cuda, None, ["x"], [], [], [], False, False, 0.05, False,
                            [], False, fusion=fusion)
    assert "unfused eager FP8 slower than bf16 on a GPU" in line(fused.resolve_fused_casts("auto", cuda))
    assert "slower than bf16" not in line((True, "casts fused: ..."))
