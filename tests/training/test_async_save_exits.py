"""--async-save end to end on one process (pretrain_gpt.main, the tiny model): every way a run ends (the end of
training, --exit-interval, --exit-duration-in-mins, SIGTERM with --exit-signal-handler) waits for the save being
written in the background and commits it before the run ends (and --keep-last prunes after each commit); an error
lets it go, commits nothing more and stops the writer. The writer is slowed (0.3 s a file) so that each save is
still being written when the run ends. And --async-save without --use-persistent-ckpt-worker saves synchronously, as Megatron-LM does, saying so.

Megatron-LM, the reference (megatron/training/training.py): `maybe_finalize_async_save(blocking=True,
terminate=True)` after the loop, which every exit of the loop reaches; validate_args (arguments.py): "--async-save
is not supported without --use-persistent-ckpt-worker. Disabling --async-save."
"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from checkpoint.ours import async_save
from checkpoint.ours.async_save import WRITER_THREAD_NAME
from tests.checkpoint.test_async_save import SlowWrites
from tests.reliability_helpers import train
from training import exit_conditions, train_step

BACKGROUND = ["--async-save", "--use-persistent-ckpt-worker"]


def writer_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == WRITER_THREAD_NAME]


@pytest.mark.parametrize("flags, last", [
    (["--train-iters", "3", "--save-interval", "2", "--keep-last", "1"], 3),
    (["--train-iters", "9", "--exit-interval", "2"], 2),
    (["--train-iters", "9", "--exit-duration-in-mins", "1e-6"], 1),
    (["--train-iters", "9", "--exit-signal-handler"], 2),
], ids=["end-of-training", "exit-interval", "exit-duration", "sigterm"])
def test_every_exit_waits_for_the_background_write_and_commits_it(corpus_cache_300, tmp_path, monkeypatch,
                                                                  flags, last):
    SlowWrites(monkeypatch, delay=0.3)
    check = exit_conditions.ExitConditions.check

    def terminated_after_iteration_2(self, iteration):  # a scheduler's SIGTERM, taken by the handler
        if iteration == 2 and self._previous_handlers:
            os.kill(os.getpid(), signal.SIGTERM)
        return check(self, iteration)

    monkeypatch.setattr(exit_conditions.ExitConditions, "check", terminated_after_iteration_2)
    ck = tmp_path / "ck"
    outcome = train(corpus_cache_300, tmp_path, *BACKGROUND, "--save", ck, *flags)
    assert outcome.code == 0, outcome.err
    assert f"saved checkpoint {ck / f'iter_{last:07d}'}" in outcome.out, outcome.out
    assert "committed at the end of training" in outcome.out, outcome.out  # waited for, not found done
    assert (ck / "latest").read_text() == f"iter_{last:07d}\n"
    assert (ck / "latest_checkpointed_iteration.txt").read_text() == f"{last}\n"
    assert not list(ck.glob("*.partial")) and not writer_threads()
    if "--keep-last" in flags:  # pruned once each save was committed, never before
        assert [path.name for path in ck.glob("iter_*")] == [f"iter_{last:07d}"]


def test_an_error_lets_the_background_save_go_and_keeps_the_previous_checkpoint(corpus_cache_300, tmp_path,
                                                                               monkeypatch):
    writes = SlowWrites(monkeypatch, delay=0.3)
    step = train_step.DataParallelTrainStep.__call__

    def fails_at_iteration_3(self, iteration, *args, **kwargs):
        if iteration == 3:
            raise RuntimeError("an injected bug")
        return step(self, iteration, *args, **kwargs)

    monkeypatch.setattr(train_step.DataParallelTrainStep, "__call__", fails_at_iteration_3)
    ck = tmp_path / "ck"
    with pytest.raises(RuntimeError, match="an injected bug"):  # an error of our own: its traceback, as before
        train(corpus_cache_300, tmp_path, *BACKGROUND, "--save", ck, "--train-iters", "4", "--save-interval", "1")
    # iteration 1's save was committed before iteration 2's began; iteration 2's was still being written
    assert (ck / "latest").read_text() == "iter_0000001\n" and not (ck / "iter_0000002").exists()
    assert not (ck / "iter_0000002.partial" / "metadata.json").exists()
    assert len(writes.written) < 6 and not writer_threads()  # stopped after the file it was writing


def test_async_save_without_the_persistent_worker_saves_synchronously_and_says_so(corpus_cache_300, tmp_path,
                                                                                 monkeypatch):
    background = []
    monkeypatch.setattr(async_save.AsyncCheckpointSaver, "save", lambda *args, **kwargs: background.append(args))
    outcome = train(corpus_cache_300, tmp_path, "--async-save", "--save", tmp_path / "ck", "--train-iters", "1")
    assert outcome.code == 0, outcome.err
    assert "--async-save without --use-persistent-ckpt-worker is turned off, as Megatron-LM turns it off" \
        in outcome.out, outcome.out
    assert not background and (tmp_path / "ck" / "latest").read_text() == "iter_0000001\n"
