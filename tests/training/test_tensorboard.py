"""--tensorboard-dir (Megatron's flag): TensorBoard's own event reader finds every number of every
metrics.jsonl record, under the record's key, at the record's iteration."""

import json

import pytest

import pretrain_gpt
from training.metrics import scalar_values

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--train-iters", "4", "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
         "--tokenizer-vocab-size", "300", "--device", "cpu"]


def test_events_hold_the_metrics_records(tmp_path, corpus_cache_300):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics, events = tmp_path / "metrics.jsonl", tmp_path / "tb"
    assert pretrain_gpt.main(SMALL + ["--data-cache-dir", corpus_cache_300, "--metrics-file", str(metrics),
                                      "--tensorboard-dir", str(events)]) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert {r.get("split", "train") for r in records} == {"train", "valid", "test"}
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    written = {tag: {event.step: event.value for event in accumulator.Scalars(tag)}
               for tag in accumulator.Tags()["scalars"]}
    expected = {}
    for record in records:
        for tag, value in scalar_values(record).items():
            expected.setdefault(tag, {})[record["iteration"]] = value
    assert {"train/loss", "train/lr", "train/tokens_per_s", "train/tflops_per_gpu", "valid/loss", "valid/ppl",
            "test/loss", "train/comm_bytes/dp/all_reduce"} <= set(expected)
    for record in records:  # every key of every record is there, under its split
        for key, value in record.items():
            if key not in ("iteration", "split") and isinstance(value, (int, float)):
                assert f"{record.get('split', 'train')}/{key}" in written, key
    assert set(written) == set(expected)
    for tag, points in expected.items():  # events are float32
        assert written[tag] == pytest.approx(points, rel=1e-6), tag


def test_an_unwritable_tensorboard_dir_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("training.prepare.build_data", lambda *args: pytest.fail("data work started"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = pretrain_gpt.main(SMALL + ["--metrics-file", str(tmp_path / "m.jsonl"),
                                      "--tensorboard-dir", str(blocker / "tb")])
    assert code == 2 and "--tensorboard-dir" in capsys.readouterr().err
