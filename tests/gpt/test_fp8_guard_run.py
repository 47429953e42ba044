"""--fp8-guard in a training run (issue 65's acceptance for item 4): a saturating cast injected into one layer
at one iteration; the iteration runs again with the layer in high precision, the run goes on finite, the layer is
named in the log, and the losses stay within 1% of the same run without the injection (and closer to it than the
injected run without the guard).

The injection (a test-only hook on the train step): before iteration 3, blocks.1.mlp.dense_h_to_4h's delayed
scaling input scale is multiplied by 1e6, as if its amax history had recorded an input 1e6 times smaller (the
amax spike that leaves delayed scaling's scale stale). Its first micro-batch's input cast then clips almost
every value. "Without the injection": the same command, seed and data, the guard on, no hook."""

import json

import pytest
import torch

import pretrain_gpt
from arguments.parser import parse_config
from parallel.fp8.recipes import INPUT
from parallel.state import destroy, initialize
from tests.host_syncs import HostSyncCounter, SyncCountingObserver
from training.build import build
from training.run_settings import resolve_run_settings
from training.train_step import DataParallelTrainStep

TRAIN = ["--device", "cpu", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
         "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "2",
         "--train-iters", "5", "--lr", "3e-3", "--log-interval", "1", "--eval-iters", "0", "--bf16",
         "--attention-dropout", "0", "--hidden-dropout", "0", "--fp8-format", "hybrid", "--fp8-recipe", "delayed"]
LAYER, AT_ITERATION = "blocks.1.mlp.dense_h_to_4h", 3
DOWNSTREAM = "blocks.1.mlp.dense_4h_to_h"


def _records(tmp_path, corpus_cache, name, *extra):
    metrics = tmp_path / f"{name}.jsonl"
    assert pretrain_gpt.main([*TRAIN, "--data-cache-dir", corpus_cache, "--metrics-file", str(metrics), *extra]) == 0
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "loss" in r and "split" not in r]


def _inject_at(monkeypatch):
    step = DataParallelTrainStep.__call__

    def injecting(self, iteration, *args, **kwargs):
        if iteration == AT_ITERATION:
            linear = dict(self.model.named_modules())[LAYER]
            linear.fp8_state.delayed.forward_scale[INPUT] *= 1e6
        return step(self, iteration, *args, **kwargs)

    monkeypatch.setattr(DataParallelTrainStep, "__call__", injecting)


def _losses(records):
    return torch.tensor([record["loss"] for record in records])


def test_a_saturating_layer_falls_back_and_the_run_stays_within_1_percent(tmp_path, corpus_cache, capsys,
                                                                          monkeypatch):
    plain = _records(tmp_path, corpus_cache, "plain")
    start = capsys.readouterr().out
    assert "guard on: a layer whose FP8 output could be non-finite or one of whose casts saturates more than 0.05" \
        in start
    assert "FP8 guard:" not in start  # the plain run never falls back
    assert all(not record["fp8_high_precision_layers"] for record in plain)

    _inject_at(monkeypatch)
    injected = _records(tmp_path, corpus_cache, "injected")
    out = capsys.readouterr().out
    assert f"FP8 guard: {LAYER} runs in high precision from iteration {AT_ITERATION}: a forward cast saturated" in out
    # iteration 3 ran again with the layer in high precision; its first micro-batch's check failed again (the replay
    # casts as the first run did), iteration 4's passed: back in FP8 from iteration 5
    assert f"FP8 guard: {LAYER} back in FP8 from iteration {AT_ITERATION + 2}: its forward check passed at " \
           f"iteration {AT_ITERATION + 1}" in out
    # the next layer's input, the saturated layer's FP8 output, saturated its cast in the first run too: it ran that
    # iteration in high precision as well, and its check passed in the replay. 97.9% since each weight is cast once an
    # iteration (parallel/fp8/weight_cache.py: the second micro-batch reuses the first's cast, as TransformerEngine
    # does) and the weight gradients go into the fp32 main gradient unrounded (--gradient-accumulation-fusion); 98%
    # with bf16 weight gradients, 97.7% when besides every micro-batch cast it again with the scale the previous one's
    # update gave
    lines = [line for line in out.splitlines() if "FP8 guard:" in line and LAYER not in line]
    assert lines == [f" FP8 guard: {DOWNSTREAM} runs in high precision from iteration {AT_ITERATION}: a forward cast "
                     f"saturated 97.9% of its values (threshold 5%); the iteration runs again with its GEMMs in high "
                     f"precision",
                     f" FP8 guard: {DOWNSTREAM} back in FP8 from iteration {AT_ITERATION + 1}: its forward check "
                     f"passed at iteration {AT_ITERATION}"]
    assert injected[AT_ITERATION - 1]["fp8_high_precision_layers"] == sorted([LAYER, DOWNSTREAM])
    assert injected[AT_ITERATION]["fp8_high_precision_layers"] == [LAYER]
    assert injected[AT_ITERATION - 1]["fp8_worst_layer"] == LAYER
    assert injected[AT_ITERATION - 1]["fp8_worst_saturated_fraction"] > 0.5
    assert not injected[AT_ITERATION + 1]["fp8_high_precision_layers"]
    losses, plain_losses = _losses(injected), _losses(plain)
    assert torch.isfinite(losses).all()
    assert torch.equal(losses[:AT_ITERATION - 1], plain_losses[:AT_ITERATION - 1])
    guarded_off = ((losses - plain_losses).abs() / plain_losses).max()
    assert guarded_off < 0.01

    # the same injection without the guard: the saturated micro-batch trains on, and the losses move further
    unguarded = _losses(_records(tmp_path, corpus_cache, "unguarded", "--no-fp8-guard"))
    assert ((unguarded - plain_losses).abs() / plain_losses).max() > guarded_off


def test_without_the_guard_the_start_up_line_says_so_and_nothing_is_counted(tmp_path, corpus_cache, capsys):
    records = _records(tmp_path, corpus_cache, "off", "--no-fp8-guard", "--train-iters", "1")
    assert "guard off (--no-fp8-guard)" in capsys.readouterr().out
    assert "fp8_saturated" not in records[0]


SYNC_RUN = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2", "--seq-length", "32",
            "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "2",
            "--tokenizer-vocab-size", "512", "--hidden-dropout", "0", "--attention-dropout", "0", "--bf16",
            "--fp8-format", "hybrid"]


def _batches(generator):
    while True:
        yield {"tokens": torch.randint(0, 512, (1, 33), generator=generator)}


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_the_guard_reads_nothing_inside_a_micro_batch_and_once_an_iteration(recipe):
    """tests/host_syncs.py's count over two iterations of two micro-batches: nothing inside a micro-batch would make
    the host wait for a GPU (forward, backward, delayed scaling's updates, the guard's counts), and the guard reads its
    verdict once an iteration, after the micro-batches. (A CPU run's copy of its batch to the device is counted as a
    copy to the CPU: on a GPU it is a host-to-device copy, no read.)"""
    state = initialize("cpu", 1)
    try:
        settings = resolve_run_settings(parse_config([*SYNC_RUN, "--fp8-recipe", recipe]), 512, 1, 1, "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=False)
        counter = HostSyncCounter()
        step = DataParallelTrainStep(built.model, built.zero, _batches(torch.Generator().manual_seed(0)), settings,
                                     state, built.activations, observer=SyncCountingObserver(counter), rng=built.rng)
        with counter.watching():
            counter.active = True
            for iteration in (1, 2):
                step(iteration, 2 * (iteration - 1), measure_activations=False)
    finally:
        destroy(state)
    inside = {(what, site): count for (what, site), count in counter.in_windows("micro_batch").items()
              if not (what == "Tensor.to(cpu)" and site.startswith("training/evaluation.py"))}
    assert inside == {}
    guard_reads = {site: count for (what, site), count in counter.in_windows("outside").items()
                   if site.startswith("parallel/fp8/")}
    assert list(guard_reads.values()) == [2]  # one read an iteration
