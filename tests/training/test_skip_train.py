"""Megatron-LM's --skip-train (megatron/training/training.py pretrain @ d98e8a64: `if not
cfg_container.validation.skip_train: ... train(...)`, else `iteration = args.iteration`; then `if args.do_valid:
evaluate_and_print_results(...)` and `if args.do_test: ...` at that iteration): no step, no save, the loaded model's
valid and test losses."""

from __future__ import annotations

import pretrain_gpt
from tests.reliability_helpers import metrics_records, run_main, snapshot, train


def test_it_evaluates_the_loaded_iteration_on_valid_and_test_and_trains_nothing(tmp_path, corpus_cache):
    save = tmp_path / "ckpt"
    evaluated = ["--eval-iters", "2", "--eval-interval", "2", "--split", "80,10,10"]
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    assert train(corpus_cache, first, "--train-iters", "2", "--save", save, *evaluated).code == 0
    before = snapshot(save)
    outcome = train(corpus_cache, second, "--train-iters", "2", "--load", save, "--save", save, "--skip-train",
                    *evaluated)
    assert outcome.code == 0, outcome.err[-2000:]
    assert "--skip-train: evaluating iteration 2, training nothing" in outcome.out
    trained = metrics_records(first / "metrics.jsonl")
    records = metrics_records(second / "metrics.jsonl")
    assert not [record for record in records if "split" not in record and "loss" in record]  # no training record
    evaluations = {record["split"]: record for record in records if "split" in record}
    assert set(evaluations) == {"valid", "test"} and {r["iteration"] for r in evaluations.values()} == {2}
    # the same weights over the same held-out batches: the losses the training run logged at iteration 2
    logged = {record["split"]: record["loss"] for record in trained if "split" in record and record["iteration"] == 2}
    assert evaluations["valid"]["loss"] == logged["valid"] and evaluations["test"]["loss"] == logged["test"]
    assert snapshot(save) == before  # nothing saved
    # Issue 94 item 6g: evaluating needs only the model's flags and --load. Before, a resume's checks asked for the
    # checkpoint's --global-batch-size, then --use-checkpoint-opt_param-scheduler, though nothing trains.
    model_only = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
                  "--max-position-embeddings", "16", "--tokenizer-vocab-size", "300", "--device", "cpu"]
    third = tmp_path / "third.jsonl"
    evaluated_alone = run_main(pretrain_gpt.main, [*model_only, "--data-cache-dir", corpus_cache, "--load", save,
                                                   "--skip-train", "--metrics-file", third])
    assert evaluated_alone.code == 0, evaluated_alone.err[-2000:]
    assert {record["split"] for record in metrics_records(third)} == {"valid", "test"}
