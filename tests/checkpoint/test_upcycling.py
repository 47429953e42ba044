"""--moe-use-upcycling (checkpoint/upcycling.py) as Megatron-Core's upcycling_utils makes the MoE model, and what
Megatron-Core's own test checks (tests/unit_tests/transformer/moe/test_upcycling.py @ core_v0.19.0: the MoE model's
output is the dense model's, there within 1e-1 in bf16): the first trained iteration's fp32 loss is the dense model's on
the same batch. Megatron-LM's training.py setup_model_and_optimizer saves the upcycled model as iteration 1, then trains
from iteration 0 again (its --load branch skipped) on the batch the dense run would train next (load_checkpoint kept
consumed_train_samples).

Exact where the math is: at granularity 1 every selected expert is the dense MLP and the top-k probabilities sum to 1;
at granularity G a top-k of whole tied groups (topk a multiple of G) gives each slice 1/G of an output scaled by G,
which squared ReLU (homogeneous of degree 2, weights x G^(1/3)) returns exactly. SiLU is not homogeneous, so SwiGLU at
G > 1 is the dense output to first order only (Megatron-Core's scaling, arXiv 2410.07524)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from base.errors import ConfigError
from tests.checkpoint.test_megatron_checkpoint import FIXTURES, data_workdir, our_flags
from tests.reliability_helpers import metrics_records, run_main

UPCYCLE_8 = ["--moe-use-upcycling", "--moe-upcycling-granularity", "8", "--ffn-hidden-size", "4"]


def _losses(tmp_path: Path, name: str, flags: list) -> tuple[dict[int, float], str]:
    import pretrain_gpt

    metrics = tmp_path / f"{name}.jsonl"
    outcome = run_main(pretrain_gpt.main, [*flags, "--device", "cpu", "--log-interval", "1", "--data-cache-dir",
                                           tmp_path / "cache", "--metrics-file", metrics])
    assert outcome.code == 0, outcome.err[-3000:]
    return {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}, outcome.out


def megatron_llama_flags(tmp_path: Path) -> list:
    """Megatron-LM 0.16.1's Llama-shaped save at iteration 2 of 4 (8 samples; SwiGLU FFN 32, RMSNorm, no biases)."""
    return our_flags("megatron_llama") + ["--load",
                                          shutil.copytree(FIXTURES / "megatron_llama", tmp_path / "megatron_llama")]


@pytest.mark.parametrize("granularity", [1, 8])
def test_a_megatron_dense_checkpoint_upcycles_to_the_dense_models_next_loss(tmp_path, monkeypatch, granularity):
    """The dense save resumed trains iteration 3 on samples 8-11; the upcycled run trains iteration 1 on them, and on
    to 4 (samples 8-23, past the 16 of --train-iters 4's batches, as Megatron-LM reads on). Measured: the dense loss 4.866609573364258 (the fixture's Megatron-LM iteration 3); upcycled
    at G 1 bitwise, at G 8 (SwiGLU, first order only: the module docstring) 4.866612434387207, 5.9e-7 off: the 1e-6
    is fp32's sums plus that remainder, which this fixture's small pre-activations keep small (it grows as
    silu(2a)/2 - silu(a) with them)."""
    monkeypatch.chdir(data_workdir(tmp_path))
    flags = megatron_llama_flags(tmp_path)
    dense, _ = _losses(tmp_path, "dense", flags)
    moe = ["--num-experts", "8", "--moe-router-topk", "8"] + (UPCYCLE_8 if granularity == 8 else
                                                              ["--moe-use-upcycling"])
    if granularity == 8:  # saved in this project's format: the dense run's (Megatron-Core's) sample order is kept
        at = flags.index("--ckpt-format")
        flags = flags[:at] + flags[at + 2:]
    upcycled, out = _losses(tmp_path, "upcycled", flags + moe + ["--save", tmp_path / "moe"])
    assert f"each MLP into 8 experts at granularity {granularity}" in out and "iteration 1 at sample 8 " in out
    assert sorted(dense) == [3, 4] and sorted(upcycled) == [1, 2, 3, 4]
    if granularity == 1:
        assert upcycled[1] == dense[3]
    else:
        assert upcycled[1] == pytest.approx(dense[3], rel=1e-6, abs=0)
        assert upcycled[1] != dense[3]  # Megatron's split and scaling ran: not a plain copy
    assert (tmp_path / "moe" / "iter_0000001").is_dir() and (tmp_path / "moe" / "iter_0000004").is_dir()


def test_the_upcycled_run_trains_the_dense_runs_next_batch_and_its_iteration_1_save_resumes_without_the_flag(
        tmp_path, monkeypatch):
    """Megatron-LM's order: the dense run's iteration 3 and the upcycled run's first (1) read the same batch (samples
    8-11) and weights; the iteration-1 save (fresh optimizer, schedule at step 0, 8 samples) resumed without
    --moe-use-upcycling trains iterations 2 and 3 as the upcycling run trained 1 and 2, as Megatron-LM's resume of it
    does. Both read past the 12 samples of --train-iters 3's batches. Squared ReLU at G 8 is exact (module docstring).
    """
    monkeypatch.chdir(data_workdir(tmp_path))
    flags = _squared_relu_flags() + ["--train-iters", "3"]
    dense, _ = _losses(tmp_path, "dense", flags + ["--ffn-hidden-size", "32", "--save", tmp_path / "dense",
                                                   "--save-interval", "2"])
    moe = flags + ["--num-experts", "8", "--moe-router-topk", "8", "--ffn-hidden-size", "4"]
    upcycled, out = _losses(tmp_path, "upcycled", moe + UPCYCLE_8 + ["--load", tmp_path / "dense" / "iter_0000002",
                                                                     "--save", tmp_path / "moe"])
    assert "saved as iteration 1; training runs from iteration 1 at sample 8 " in out
    assert sorted(upcycled) == [1, 2, 3]
    assert upcycled[1] == pytest.approx(dense[3], rel=1e-6, abs=0)
    # the dense run's samples continue; the schedule is built, not loaded: it starts at step 0 (warmup's lr 0)
    logged = {name: [(r["consumed_samples"], r["lr"]) for r in metrics_records(tmp_path / f"{name}.jsonl")
                     if "loss" in r] for name in ("dense", "upcycled")}
    assert logged["upcycled"] == [(8 + consumed, lr) for consumed, lr in logged["dense"]]
    assert logged["dense"][:2] == [(4, 0.0), (8, 0.001)]
    resumed, out = _losses(tmp_path, "resumed", moe + ["--load", tmp_path / "moe" / "iter_0000001"])
    assert "resuming after iteration 1 (8 samples consumed)" in out
    assert resumed == {2: upcycled[1], 3: upcycled[2]}


def test_refusals_are_megatrons_in_one_line(tmp_path):
    from arguments.parser import parse_arguments

    base = our_flags("megatron_llama") + ["--num-experts", "8", "--moe-use-upcycling"]
    cases = [([], "needs --save DIR"), (["--save", "s"], "needs --load CHECKPOINT"),
             (["--save", "s", "--load", "l", "--moe-upcycling-granularity", "3"], "not divisible by"),
             (["--save", "s", "--load", "l", "--moe-layer-freq", "2"], "all MoE layers"),
             (["--save", "s", "--load", "l", "--moe-ffn-hidden-size", "8"], "--moe-ffn-hidden-size 8 differs"),
             (["--save", "s", "--load", "l", "--moe-shared-expert-intermediate-size", "8"], "routed experts alone")]
    for extra, said in cases:
        with pytest.raises(ConfigError) as error:
            parse_arguments(base + extra)
        assert said in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("case", ["taken save", "no dense checkpoint"])
def test_a_save_directory_holding_a_checkpoint_or_a_load_without_one_is_refused_in_one_line(tmp_path, monkeypatch,
                                                                                             case):
    """Megatron-LM's setup_model_and_optimizer: "The upcycling destination directory already exists"; and a --load
    with nothing to upcycle (Megatron-LM would upcycle random weights) is no fresh start either."""
    import pretrain_gpt

    monkeypatch.chdir(data_workdir(tmp_path))
    flags = megatron_llama_flags(tmp_path) + ["--num-experts", "8", "--moe-use-upcycling"]
    if case == "taken save":
        flags += ["--save", shutil.copytree(FIXTURES / "megatron_llama", tmp_path / "taken")]
        said = "already holds a checkpoint: --moe-use-upcycling converts"
    else:
        flags += ["--save", tmp_path / "moe", "--load", tmp_path / "nothing"]
        said = "holds no checkpoint: --moe-use-upcycling needs the dense model's"
    outcome = run_main(pretrain_gpt.main, flags + ["--device", "cpu", "--data-cache-dir", tmp_path / "cache"])
    assert outcome.code == 2 and said in outcome.err
    assert len(outcome.err.strip().splitlines()) == 1


def _squared_relu_flags() -> list:
    """The fixtures' data and sizes, squared ReLU (FFN 32), saved in this project's format."""
    flags = [flag for flag in our_flags("megatron_llama") if flag not in ("--swiglu", "--ckpt-format", "torch_dist")]
    flags[flags.index("--train-iters") + 1] = "2"
    return flags + ["--squared-relu"]


def upcycle_at_pp2_ep2(rank: int, world_size: int, flags: list, workdir: str) -> None:
    import os

    import pretrain_gpt

    os.chdir(workdir)  # the flags' --data-path, relative (data_workdir)
    assert pretrain_gpt.main([str(flag) for flag in flags]) == 0


def test_this_projects_dense_checkpoint_upcycles_at_pp2_ep2_granularity_8_to_the_dense_next_loss(tmp_path,
                                                                                                   monkeypatch):
    """The issue's launch shrunk in size only: PP 2 x EP 2 (DP 2), 16 experts: two tied groups of the dense FFN split 8 ways, top 8.
    The dense save at iteration 1 resumed trains iteration 2 on the batch the upcycled run's iteration 1 trains. Squared ReLU
    makes it exact (module docstring): measured bitwise (4.845691204071045); 1e-6 leaves fp32's sums room to round otherwise."""
    from tests.distributed import run_distributed

    workdir = data_workdir(tmp_path)
    monkeypatch.chdir(workdir)
    flags = _squared_relu_flags()
    _losses(tmp_path, "dense", flags + ["--ffn-hidden-size", "32", "--exit-interval", "1", "--save", tmp_path / "dense"])
    dense, _ = _losses(tmp_path, "dense_again", flags + ["--ffn-hidden-size", "32", "--load", tmp_path / "dense"])
    metrics = tmp_path / "upcycled.jsonl"
    moe = flags + UPCYCLE_8 + ["--num-experts", "16", "--moe-router-topk", "8", "--pipeline-model-parallel-size", "2",
                               "--expert-model-parallel-size", "2", "--load", tmp_path / "dense", "--save",
                               tmp_path / "moe", "--device", "cpu", "--log-interval", "1", "--data-cache-dir",
                               tmp_path / "cache", "--metrics-file", metrics]
    run_distributed(upcycle_at_pp2_ep2, 4, moe, str(workdir), timeout=300)
    upcycled = {r["iteration"]: r["loss"] for r in metrics_records(metrics) if "loss" in r}
    assert sorted(dense) == [2] and sorted(upcycled) == [1, 2]
    assert (tmp_path / "moe" / "iter_0000001").is_dir() and (tmp_path / "moe" / "iter_0000002").is_dir()
    assert upcycled[1] == pytest.approx(dense[2], rel=1e-6, abs=0)
