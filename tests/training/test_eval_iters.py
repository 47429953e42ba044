"""--eval-iters 0 or less runs no validation and no test, as Megatron-LM (core_v0.16.1 megatron/training/training.py
build_train_valid_test_data_loaders: `do_valid` and `do_test` need `args.eval_iters > 0`; the flag is `type=int`
with no bound in arguments.py), where ROCm's examples and the Megatron-Core MoE team's configs pass -1."""

from __future__ import annotations

from tests.reliability_helpers import metrics_records, train

EVALUATED = ["--train-iters", "4", "--eval-interval", "2", "--split", "80,10,10"]


def test_eval_iters_minus_one_trains_the_same_losses_with_no_validation_or_test(corpus_cache, tmp_path):
    (tmp_path / "none").mkdir()
    (tmp_path / "two").mkdir()
    none = train(corpus_cache, tmp_path / "none", *EVALUATED, "--eval-iters", "-1")
    two = train(corpus_cache, tmp_path / "two", *EVALUATED, "--eval-iters", "2")
    assert none.code == 0 and two.code == 0, (none.err[-2000:], two.err[-2000:])
    records = {name: metrics_records(tmp_path / name / "metrics.jsonl") for name in ("none", "two")}
    splits = {name: {record["split"] for record in found if "split" in record} for name, found in records.items()}
    assert splits == {"none": set(), "two": {"valid", "test"}}
    losses = {name: [record["loss"] for record in found if "split" not in record and "loss" in record]
              for name, found in records.items()}
    assert len(losses["none"]) == 4 and losses["none"] == losses["two"]  # evaluating changes no training loss
    said = [line for line in (none.out + none.err).splitlines() if "--eval-iters -1" in line]
    assert said == ["> --eval-iters -1: no validation or test, as Megatron-LM runs none where --eval-iters <= 0"]
