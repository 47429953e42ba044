"""Megatron-LM's tracker file, `latest_checkpointed_iteration.txt`, beside our `latest`.

Megatron-LM (megatron/training/checkpointing.py): get_checkpoint_tracker_filename is
`<save>/latest_checkpointed_iteration.txt`; save_checkpoint writes the iteration number into it once a
save is complete; load reads it with read_metadata (the stripped text as an int, or "release") and
loads `iter_{iteration:07d}`. Its functional tests' ckpt-resume phase
(tests/functional_tests/shell_test_utils/run_ci_test.sh, at 0980313c) then runs:

    rm -rf "$CHECKPOINT_LOAD_PATH/iter_$(printf "%07d\\n" "$TRAIN_ITERS")"
    echo $((TRAIN_ITERS / 2)) >$CHECKPOINT_LOAD_PATH/latest_checkpointed_iteration.txt
    run_training_phase   # the same MODEL_ARGS, --load the save directory

Here both files are written at each save (the tracker first), and where they disagree the one written
last wins (the tracker on a tie), said in one line; the winner naming no complete checkpoint is an
error, not a fallback to the other.
"""

import os
import shutil
from pathlib import Path

import pytest

import pretrain_gpt
from base.errors import CheckpointError
from checkpoint.format import LATEST_FILE, METADATA_FILE, TRACKER_FILE, prune, resolve_checkpoint
from checkpoint.start_decision import decide_start
from tests.reliability_helpers import metrics_records

TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's name, written out: not taken from the code under test
TRAIN_ITERS = 4
ARGV = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--max-position-embeddings", "16", "--tokenizer-vocab-size", "300", "--device", "cpu", "--seed", "5",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", str(TRAIN_ITERS),
        "--lr-warmup-samples", "0", "--log-interval", "1", "--eval-iters", "0", "--save-interval", "2"]


def fake_checkpoint(save_dir: Path, iteration: int) -> Path:
    """An iteration directory as resolve_checkpoint sees a complete one (its metadata.json exists)."""
    path = save_dir / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    (path / METADATA_FILE).write_text("{}")
    return path


def test_the_tracker_file_has_megatrons_name():
    assert TRACKER_FILE == TRACKER


def test_a_directory_with_only_megatrons_tracker_resolves_to_the_iteration_it_names(tmp_path):
    """Before: "no checkpoint here (neither a 'latest' file nor metadata.json)"."""
    fake_checkpoint(tmp_path, 2)
    wanted = fake_checkpoint(tmp_path, 4)
    (tmp_path / TRACKER).write_text("4\n")
    assert resolve_checkpoint(tmp_path) == wanted
    decision = decide_start(str(tmp_path), None)
    assert decision.resume_from == wanted and decision.note is None


@pytest.mark.parametrize("latest_at, tracker_at, loaded, why", [
    (100, 200, 2, "the tracker was written after 'latest'"),  # Megatron's ckpt-resume phase, a user's edit
    (200, 100, 4, "'latest' was written after the tracker"),   # a user of ours pointing `latest` back
    (100, 100, 2, "both were written at once and Megatron-LM reads the tracker"),  # a coarse clock
])
def test_where_latest_and_the_tracker_disagree_the_one_written_last_wins_and_says_so(tmp_path, latest_at, tracker_at,
                                                                                     loaded, why):
    """Before: `latest` was read and the tracker ignored, so Megatron's resume test failed on the
    checkpoint it had deleted, or loaded another one than the tracker named."""
    checkpoints = {2: fake_checkpoint(tmp_path, 2), 4: fake_checkpoint(tmp_path, 4)}
    (tmp_path / LATEST_FILE).write_text("iter_0000004\n")
    (tmp_path / TRACKER).write_text("2\n")
    os.utime(tmp_path / LATEST_FILE, ns=(latest_at * 10**9, latest_at * 10**9))
    os.utime(tmp_path / TRACKER, ns=(tracker_at * 10**9, tracker_at * 10**9))
    assert resolve_checkpoint(tmp_path) == checkpoints[loaded]
    decision = decide_start(str(tmp_path), str(tmp_path))
    assert decision.resume_from == checkpoints[loaded]
    assert decision.note == (f"> {tmp_path}: {TRACKER} names iteration 2 and 'latest' names iter_0000004: loading "
                             f"iter_{loaded:07d}, as {why}")


@pytest.mark.parametrize("text, words", [
    ("6\n", f"{TRACKER} names 'iter_0000006', which is not a complete checkpoint"),
    ("release\n", "names Megatron-LM's release checkpoint"),
    ("-1\n", "holds '-1', not an iteration number"),
    ("iter_0000004\n", "holds 'iter_0000004', not an iteration number"),
])
def test_a_tracker_naming_no_checkpoint_is_an_error_never_a_fallback_to_latest(tmp_path, text, words):
    fake_checkpoint(tmp_path, 4)
    (tmp_path / LATEST_FILE).write_text("iter_0000004\n")
    (tmp_path / TRACKER).write_text(text)
    os.utime(tmp_path / LATEST_FILE, ns=(10**9, 10**9))  # the tracker written after it
    with pytest.raises(CheckpointError, match=words.replace("(", r"\(").replace(")", r"\)")) as error:
        resolve_checkpoint(tmp_path)
    assert "\n" not in str(error.value)


def test_pruning_keeps_the_checkpoint_the_tracker_names(tmp_path):
    """--keep-last-checkpoints never deletes what a load would take: before, iter_0000002 went too."""
    run_id = "a" * 32
    two, four, six = (fake_checkpoint(tmp_path, i) for i in (2, 4, 6))
    for path in (two, four, six):
        (path / METADATA_FILE).write_text(f'{{"run_id": "{run_id}"}}')
    (tmp_path / LATEST_FILE).write_text("iter_0000006\n")
    (tmp_path / TRACKER).write_text("2\n")
    assert prune(tmp_path, 1, run_id) == [four]
    assert two.exists() and six.exists()


def training_losses(metrics_file: Path) -> dict[int, float]:
    return {record["iteration"]: record["loss"] for record in metrics_records(metrics_file)
            if "loss" in record and "split" not in record}


def test_megatrons_ckpt_resume_phase_resumes_from_the_tracker(tmp_path, capsys, monkeypatch):
    """The run_ci_test.sh sequence above, with --save and --load one directory: train, delete the last
    checkpoint, write TRAIN_ITERS / 2 into the tracker, run the same command again. Before: the second
    run failed on `latest` naming the deleted iter_0000004. Now it loads iter_0000002 and retrains 3-4
    bitwise as the first run did."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    save = tmp_path / "ckpt"
    argv = ARGV + ["--data-cache-dir", str(tmp_path / "cache"), "--save", str(save), "--load", str(save)]
    assert pretrain_gpt.main(argv + ["--metrics-file", str(tmp_path / "run1.jsonl")]) == 0
    assert (save / TRACKER).read_text() == f"{TRAIN_ITERS}\n"  # written at each save, beside `latest`
    assert (save / LATEST_FILE).read_text() == "iter_0000004\n"
    shutil.rmtree(save / f"iter_{TRAIN_ITERS:07d}")
    (save / TRACKER).write_text(f"{TRAIN_ITERS // 2}\n")
    capsys.readouterr()
    assert pretrain_gpt.main(argv + ["--metrics-file", str(tmp_path / "run2.jsonl")]) == 0
    out = capsys.readouterr().out
    assert f"{TRACKER} names iteration 2 and 'latest' names iter_0000004: loading iter_0000002, as the tracker was " \
        f"written after 'latest'" in out
    first, second = training_losses(tmp_path / "run1.jsonl"), training_losses(tmp_path / "run2.jsonl")
    assert sorted(second) == [3, 4]
    assert [second[i] for i in (3, 4)] == [first[i] for i in (3, 4)]
    assert (save / TRACKER).read_text() == "4\n" and (save / LATEST_FILE).read_text() == "iter_0000004\n"
