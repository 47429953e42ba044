"""--fp8-guard in a training run (issue 65's acceptance for item 4): a saturating cast injected into one layer
at one iteration; the run goes on finite, the layer falls back to high precision and is named in the log, and
the losses stay within 1% of the same run without the injection.

The injection (a test-only hook on the train step): before iteration 3, blocks.1.mlp.dense_h_to_4h's delayed
scaling input scale is multiplied by 1e6, as if its amax history had recorded an input 1e6 times smaller (the
amax spike that leaves delayed scaling's scale stale). Its first micro-batch's input cast then clips almost
every value. "Without the injection": the same command, seed and data, the guard on, no hook."""

import json

import torch

import pretrain_gpt
from parallel.fp8.recipes import INPUT
from training.train_step import DataParallelTrainStep

TRAIN = ["--device", "cpu", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
         "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "2",
         "--train-iters", "5", "--lr", "3e-3", "--log-interval", "1", "--eval-iters", "0", "--bf16",
         "--attention-dropout", "0", "--hidden-dropout", "0", "--fp8-format", "hybrid", "--fp8-recipe", "delayed"]
LAYER, AT_ITERATION = "blocks.1.mlp.dense_h_to_4h", 3


def _records(tmp_path, corpus_cache, name, *extra):
    metrics = tmp_path / f"{name}.jsonl"
    assert pretrain_gpt.main([*TRAIN, "--data-cache-dir", corpus_cache, "--metrics-file", str(metrics), *extra]) == 0
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r and "split" not in r]


def _inject_at(monkeypatch):
    step = DataParallelTrainStep.__call__

    def injecting(self, iteration, *args, **kwargs):
        if iteration == AT_ITERATION:
            linear = dict(self.model.named_modules())[LAYER]
            linear.fp8_state.delayed.scale[INPUT] *= 1e6
        return step(self, iteration, *args, **kwargs)

    monkeypatch.setattr(DataParallelTrainStep, "__call__", injecting)


def test_a_saturating_layer_falls_back_and_the_run_stays_within_1_percent(tmp_path, corpus_cache, capsys,
                                                                          monkeypatch):
    plain = _records(tmp_path, corpus_cache, "plain")
    start = capsys.readouterr().out
    assert "guard on: a layer whose FP8 output is not finite or one of whose casts saturates more than 0.05" in start
    assert "FP8 guard:" not in start  # the plain run never falls back
    assert all(not record["fp8_high_precision_layers"] for record in plain)

    _inject_at(monkeypatch)
    injected = _records(tmp_path, corpus_cache, "injected")
    out = capsys.readouterr().out
    assert f"FP8 guard: {LAYER} runs in high precision from iteration {AT_ITERATION}: a forward cast saturated" in out
    assert f"FP8 guard: {LAYER} back in FP8 at iteration {AT_ITERATION}" in out  # the next micro-batch's check
    assert injected[AT_ITERATION - 1]["fp8_high_precision_layers"] == [LAYER]
    assert injected[AT_ITERATION - 1]["fp8_worst_layer"] == LAYER
    assert injected[AT_ITERATION - 1]["fp8_worst_saturated_fraction"] > 0.5
    losses = torch.tensor([record["loss"] for record in injected])
    plain_losses = torch.tensor([record["loss"] for record in plain])
    assert torch.isfinite(losses).all()
    assert torch.equal(losses[:AT_ITERATION - 1], plain_losses[:AT_ITERATION - 1])
    assert ((losses - plain_losses).abs() / plain_losses).max() < 0.01


def test_without_the_guard_the_start_up_line_says_so_and_nothing_is_counted(tmp_path, corpus_cache, capsys):
    records = _records(tmp_path, corpus_cache, "off", "--no-fp8-guard", "--train-iters", "1")
    assert "guard off (--no-fp8-guard)" in capsys.readouterr().out
    assert "fp8_saturated" not in records[0]
