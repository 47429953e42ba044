"""--tensorboard-dir and --wandb-project (Megatron's flags): TensorBoard's own event reader and the W&B offline run's
history (tests/training/wandb_history.py) hold Megatron-LM's names with the logged values (`lm loss`,
`learning-rate`, `grad-norm`, ..., `lm loss validation`; TensorBoard also `<name> vs samples` at the consumed
samples), every other number of every metrics.jsonl record under `<split>/<key>`, and no collective byte counter that
is 0."""

import json

import pytest

import pretrain_gpt
from tests.training.wandb_history import history
from training.metrics import samples_values, scalar_values

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--train-iters", "4", "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
         "--tokenizer-vocab-size", "300", "--device", "cpu"]


def test_events_and_wandb_hold_megatrons_names_with_the_records_values(tmp_path, corpus_cache_300, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_MODE", "offline")
    metrics, events = tmp_path / "metrics.jsonl", tmp_path / "tb"
    assert pretrain_gpt.main(SMALL + ["--data-cache-dir", corpus_cache_300, "--metrics-file", str(metrics),
                                      "--tensorboard-dir", str(events), "--wandb-project", "ci-test",
                                      "--wandb-save-dir", str(tmp_path)]) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert {r.get("split", "train") for r in records} == {"train", "valid", "test"}
    train = [r for r in records if "split" not in r]
    assert {"loss", "lr", "grad_norm", "comm_bytes"} <= set(train[0])  # metrics.jsonl keeps its keys

    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    written = {tag: {event.step: event.value for event in accumulator.Scalars(tag)}
               for tag in accumulator.Tags()["scalars"]}
    for record in train:
        for key, name in (("loss", "lm loss"), ("lr", "learning-rate"), ("grad_norm", "grad-norm"),
                          ("iter_time_s", "iteration-time"), ("tflops_per_gpu", "throughput"),
                          ("global_batch_size", "batch-size")):
            assert written[name][record["iteration"]] == pytest.approx(record[key], rel=1e-6), name
        assert written["lm loss vs samples"][record["consumed_samples"]] == pytest.approx(record["loss"], rel=1e-6)
    valid = [r for r in records if r.get("split") == "valid"]
    assert {r["iteration"]: r["loss"] for r in valid} == pytest.approx(written["lm loss validation"], rel=1e-6)
    assert {r["iteration"]: r["ppl"] for r in valid} == pytest.approx(written["lm loss validation ppl"], rel=1e-6)
    expected = {}
    for record in records:
        for tag, value in scalar_values(record).items():
            expected.setdefault(tag, {})[record["iteration"]] = value
        for tag, value in samples_values(record).items():
            expected.setdefault(tag, {})[record["consumed_samples"]] = value
    assert {"train/tokens_per_s", "lm loss test"} <= set(expected) and "train/loss" not in expected
    assert set(written) == set(expected)
    for tag, points in expected.items():  # events are float32
        assert written[tag] == pytest.approx(points, rel=1e-6), tag
    # one process sends nothing: no counter of its collectives, all 0, is logged
    assert not [tag for tag in written if "comm_bytes" in tag]

    (wandb_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    rows = [row for row in history(wandb_file) if "lm loss" in row]
    assert [row["_step"] for row in rows] == [r["iteration"] for r in train]
    for row, record in zip(rows, train):
        assert (row["lm loss"], row["learning-rate"], row["grad-norm"]) == pytest.approx(
            (record["loss"], record["lr"], record["grad_norm"]), rel=1e-12)
    # the end-of-run summary: its first max_end_of_run_summary_metrics keys by name (wandb_run.py _footer_summary)
    import wandb

    logged = sorted({key for row in history(wandb_file) for key in row if not key.startswith("_")})
    shown = logged[:wandb.Settings().max_end_of_run_summary_metrics]
    assert {"lm loss", "learning-rate", "grad-norm"} <= set(shown) and not [k for k in shown if k.startswith("train/")]
    validation = {row["_step"]: row["lm loss validation"] for row in history(wandb_file) if "lm loss validation" in row}
    assert validation == pytest.approx({r["iteration"]: r["loss"] for r in valid}, rel=1e-12)


def test_an_unwritable_tensorboard_dir_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("training.prepare.build_data", lambda *args: pytest.fail("data work started"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = pretrain_gpt.main(SMALL + ["--metrics-file", str(tmp_path / "m.jsonl"),
                                      "--tensorboard-dir", str(blocker / "tb")])
    assert code == 2 and "--tensorboard-dir" in capsys.readouterr().err
