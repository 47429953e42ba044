"""scripts/bench/benchmark_gpu.py: its CPU smoke mode runs (so the GPU benchmark never rots), and the figures
it derives (tokens/s, TFLOP/s, MFU, ours/hf) agree with an independent computation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arguments.config import ConfigError, ModelConfig
from training.metrics import device_peak_tflops

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
import benchmark_gpu  # noqa: E402


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100-PCIE-40GB", 312.0), ("Tesla V100-SXM2-32GB", 125.0),
    ("Tesla V100-PCIE-32GB", 112.0), ("Some Future GPU", None)])
def test_device_peak_by_name(name, peak):
    assert device_peak_tflops(name) == peak


def megatron_closed_form(batch, seq, layers, hidden, vocab):
    """Narayanan et al. (2021), eq. 3 without recompute: 72 B s l h^2 (1 + s/(6h) + V/(12 l h))."""
    return 72 * batch * seq * layers * hidden ** 2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


def test_throughput_figures_match_the_closed_form():
    config = ModelConfig.of(num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=128,
                         max_position_embeddings=128, vocab_size=benchmark_gpu.GPT2_VOCAB)
    base = {"micro_batch_size": 3, "accumulation_steps": 2, "seq_length": 128}
    results = [{**base, "impl": "ours", "compiled": False, "step_times_s": [0.5, 0.25, 0.4]},
               {**base, "impl": "hf", "compiled": False, "step_times_s": [0.6, 0.5]}]
    benchmark_gpu.add_throughput(results, config, peak=100.0)
    ours, hf = results
    assert ours["best_step_s"] == 0.25
    assert ours["tokens_per_s"] == pytest.approx(6 * 128 / 0.25)
    flops = megatron_closed_form(6, 128, 4, 256, config.padded_vocab_size())
    assert ours["tflops"] == pytest.approx(flops / 0.25 / 1e12)
    assert ours["mfu"] == pytest.approx(flops / 0.25 / 1e12 / 100.0)
    # transformers' model has the unpadded vocabulary.
    assert hf["tflops"] == pytest.approx(megatron_closed_form(6, 128, 4, 256, 50257) / 0.5 / 1e12)
    assert ours["ours_over_hf"] == pytest.approx(0.5 / 0.25)


@pytest.mark.slow
def test_smoke_mode_runs_both_models(tmp_path):
    out = tmp_path / "bench.json"
    completed = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "benchmark_gpu.py"), "--smoke",
                                "--gradient-accumulation-steps", "2", "--json", str(out)],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.strip().splitlines()
    assert lines[-1].startswith("verdict: smoke ours (eager)")
    assert any(line.startswith("| smoke | ours | off | 2 x 2 |") for line in lines)
    assert any(line.startswith("| smoke | hf | off | 2 x 2 |") for line in lines)
    rows = json.loads(out.read_text())["rows"]
    assert [(row["impl"], row["compiled"]) for row in rows] == [("ours", False), ("hf", False)]
    for row in rows:
        assert len(row["step_times_s"]) == 2 and all(t > 0 for t in row["step_times_s"])
        assert row["tokens_per_s"] == pytest.approx(2 * 2 * 32 / min(row["step_times_s"]))
        assert all(loss == loss and 5 < loss < 15 for loss in row["losses"])  # finite, near ln(50257)
    assert rows[0]["ours_over_hf"] == pytest.approx(rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"])


def test_mfu_in_metrics_uses_model_flops_without_recompute(tmp_path):
    """Every training record carries `mfu` when a peak is known (here --peak-tflops on the CPU): the
    model FLOPs without recompute, over time x ranks x the peak, even with checkpointing on."""
    import pretrain_gpt

    metrics = tmp_path / "metrics.jsonl"
    argv = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", "2", "--log-interval", "1", "--eval-iters", "0", "--tokenizer-vocab-size", "512",
            "--device", "cpu", "--data-cache-dir", str(tmp_path / "cache"), "--metrics-file", str(metrics),
            "--checkpoint-activations", "--peak-tflops", "0.5"]
    assert pretrain_gpt.main(argv) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    train = [r for r in records if "loss" in r and "split" not in r]
    padded = 512  # the BPE is trained to at most --tokenizer-vocab-size 512 ids, padded to a multiple of 128
    for record in train:
        model = megatron_closed_form(4, 32, 2, 64, padded)
        assert record["mfu"] == pytest.approx(model / (record["iter_time_s"] * 1e12) / 0.5, rel=1e-9)
        # TFLOP/s counts the recompute (96 instead of 72 x ...): hardware FLOPs, higher than the model's.
        assert record["tflops_per_gpu"] > record["mfu"] * 0.5
    argv_no_peak = [a for a in argv if a not in ("--peak-tflops", "0.5")]
    metrics.unlink()
    assert pretrain_gpt.main(argv_no_peak + ["--metrics-file", str(metrics)]) == 0
    assert all("mfu" not in json.loads(line) for line in metrics.read_text().splitlines())


def test_the_autocast_ablation_trains_the_same_losses_as_ours_in_fp32():
    """`--impls ours,ours-autocast`: on the CPU's fp32 the two must be the same model and the same steps
    (autocast is a no-op there), so any difference in what they compute is a bug in the ablation."""
    spec = {"name": "t", "model": dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32,
                                       max_position_embeddings=32, vocab_size=benchmark_gpu.GPT2_VOCAB,
                                       hidden_dropout=0.0, attention_dropout=0.0),
            "device": "cpu", "dtype": "float32", "micro_batch_size": 2, "accumulation_steps": 2,
            "compile_modes": [False], "rounds": 2, "steps": 2, "warmup_steps": 1, "seed": 7, "profile": False,
            "impls": ["ours", "ours-autocast"]}
    ours, ablation = benchmark_gpu.worker(spec)
    assert (ours["impl"], ablation["impl"]) == ("ours", "ours-autocast")
    assert ours["losses"] == ablation["losses"]


def test_an_unknown_implementation_is_one_line():
    with pytest.raises(ConfigError, match="unknown theirs: choose from ours, hf, ours-autocast"):
        benchmark_gpu.parse_args(["--impls", "ours,theirs"])
