"""Megatron-LM's --ckpt-step N (arguments/megatron/ckpt_step.py): --load DIR's iteration N instead of the one its
tracker file names (megatron/training/checkpointing.py @ d98e8a64: `if getattr(args, 'ckpt_step', None): iteration
= args.ckpt_step`), so the run resumes at N with the losses a resume from DIR/iter_000000N logs."""

from __future__ import annotations

from tests.reliability_helpers import metrics_records, snapshot, train


def test_a_resume_from_the_named_iteration_logs_what_loading_its_directory_logs(tmp_path, corpus_cache):
    save = tmp_path / "ckpt"
    assert train(corpus_cache, tmp_path / "first", "--train-iters", "4", "--save", save, "--save-interval",
                 "2").code == 0
    assert (save / "iter_0000002").is_dir() and (save / "iter_0000004").is_dir()
    runs = {}
    for name, load in (("step", ["--load", save, "--ckpt-step", "2"]), ("dir", ["--load", save / "iter_0000002"])):
        (tmp_path / name).mkdir()
        outcome = train(corpus_cache, tmp_path / name, "--train-iters", "4", *load)
        assert outcome.code == 0, outcome.err[-2000:]
        runs[name] = [(record["iteration"], record["loss"])
                      for record in metrics_records(tmp_path / name / "metrics.jsonl") if "loss" in record]
    assert [iteration for iteration, _ in runs["step"]] == [3, 4]
    assert runs["step"] == runs["dir"]
    # an iteration the folder does not hold: one line listing those it does, nothing trained (Megatron-LM fails too)
    (tmp_path / "missing").mkdir()
    outcome = train(corpus_cache, tmp_path / "missing", "--train-iters", "4", "--load", save, "--ckpt-step", "3")
    assert outcome.code == 2 and "--ckpt-step 3:" in outcome.err and "(it holds 2, 4)" in outcome.err, outcome.err
    assert "Traceback" not in outcome.err and not (tmp_path / "missing" / "metrics.jsonl").exists()
    # a folder holding no iteration, or none at all: the same (before, a fresh model trained, exit 0)
    for name, load in (("empty", tmp_path / "empty-ckpt"), ("absent", tmp_path / "no-such-ckpt")):
        if name == "empty":
            load.mkdir()
        (tmp_path / name).mkdir()
        outcome = train(corpus_cache, tmp_path / name, "--train-iters", "4", "--load", load, "--ckpt-step", "3")
        holds = "(it holds none)" if name == "empty" else "(it does not exist)"
        assert outcome.code == 2 and f"holds no iteration 3 {holds}" in outcome.err, outcome.err
        assert not (tmp_path / name / "metrics.jsonl").exists()


def test_a_resume_from_an_older_iteration_of_its_save_directory_replaces_nothing_without_overwrite_save(
        tmp_path, corpus_cache):
    """--ckpt-step 2 --save CK where CK holds iteration 4: the continued run's saves would replace iteration 4 (before,
    silently). Refused before any work, in one line naming the later iteration and the fixes; --overwrite-save
    allows it."""
    save = tmp_path / "ckpt"
    assert train(corpus_cache, tmp_path, "--train-iters", "4", "--save", save, "--save-interval", "2").code == 0
    before = snapshot(save)
    (tmp_path / "older").mkdir()
    outcome = train(corpus_cache, tmp_path / "older", "--train-iters", "4", "--load", save, "--ckpt-step", "2",
                    "--save", save)
    last = outcome.err.strip().splitlines()[-1]
    assert outcome.code == 2 and "holds iteration(s) 4, later than the iteration 2" in last, outcome.err[-2000:]
    assert "Drop --ckpt-step" in last and "--overwrite-save" in last
    assert "Traceback" not in outcome.err and not (tmp_path / "older" / "metrics.jsonl").exists()
    assert snapshot(save) == before
    # --overwrite-save goes on (and --load DIR/iter_N, which names the rewind itself: tests/training/test_reliability.py)
    (tmp_path / "overwrite").mkdir()
    outcome = train(corpus_cache, tmp_path / "overwrite", "--train-iters", "4", "--load", save, "--ckpt-step", "2",
                    "--save", save, "--overwrite-save")
    assert outcome.code == 0, outcome.err[-2000:]
