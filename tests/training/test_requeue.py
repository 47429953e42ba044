"""A requeued job always resumes (issue 33, problems 3, 4, 5 and 12): the same `--save CK --load CK`
command after a kill at any point of the first save, a lock left by this container's previous life,
a divergence message that names a checkpoint that resumes, and a run too short to train anything.

Megatron-LM, the reference: megatron/training/checkpointing.py (NVIDIA/Megatron-LM) writes the
tracker file `latest_checkpointed_iteration.txt` at the end of save_checkpoint, after every rank's
files, and _load_base_checkpoint on a missing tracker file prints "WARNING: could not find the
metadata file ... will not load any checkpoints and will start from random" and returns no state:
a `--load` directory without the tracker starts from scratch. Here the complete, verified iteration
the killed save left is adopted instead (checkpoint/unfinished_save.py), so nothing trained is lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.forked_runs import logged_iterations
from tests.reliability_helpers import TINY, metrics_records, train

REPO = Path(__file__).resolve().parents[2]
VOCAB = ["--tokenizer-vocab-size", "512"]  # the session corpus's vocabulary (tests/conftest.py)
SAVE_POINTS = ("files", "metadata", "renamed", "tracker", "latest-temp", "latest")  # tests/kill_in_save.py
TORCH_DIST_POINTS = ("files", "renamed", "tracker-temp", "tracker")  # the same, for --ckpt-format torch_dist
# (format flags, the point) for every kill; torch_dist with --async-save saves synchronously (said at start-up), so
# its table is the synchronous one's, run again under the flag (slow)
KILLS = ([pytest.param([], point, id=point) for point in SAVE_POINTS]
         + [pytest.param(["--ckpt-format", "torch_dist"], point, id=f"torch_dist-{point}") for point in TORCH_DIST_POINTS]
         + [pytest.param(["--ckpt-format", "torch_dist", "--async-save", "--use-persistent-ckpt-worker"], point,
                         id=f"torch_dist-async-{point}", marks=pytest.mark.slow) for point in TORCH_DIST_POINTS])


def losses(path: Path) -> dict[int, float]:
    """iteration -> training loss; a record a later run wrote again for the same iteration wins."""
    return {record["iteration"]: record["loss"] for record in metrics_records(path)
            if "loss" in record and "split" not in record and "memory" not in record}


@pytest.fixture(scope="module")
def straight(corpus_cache, tmp_path_factory):
    """format flags -> the uninterrupted run's losses; a torch_dist run reads its samples in Megatron-Core's order
    (arguments/config.py sample_order), so each format is compared with its own straight run."""
    runs = {}

    def losses_of(layout: list) -> dict[int, float]:
        ckpt_format = tuple(layout[:2])
        if ckpt_format not in runs:
            work = tmp_path_factory.mktemp("straight")
            outcome = train(corpus_cache, work, *VOCAB, *ckpt_format, "--train-iters", "4")
            assert outcome.code == 0, outcome.err
            runs[ckpt_format] = losses(work / "metrics.jsonl")
        return runs[ckpt_format]
    return losses_of


@pytest.mark.parametrize("layout,point", KILLS)
def test_a_kill_at_each_point_of_the_first_save_then_the_same_command_resumes(corpus_cache, straight, tmp_path,
                                                                              layout, point):
    """torch_dist: before, a kill after the .partial folder was renamed and before the tracker was written left a
    folder the same command refused every time ('holds checkpoints (iter_0000002) but no latest ...'), and the
    two-head model could not resume its own save ('--num-query-groups 2 (the checkpoint's: 4)')."""
    ck, metrics = tmp_path / "ck", tmp_path / "metrics.jsonl"
    command = TINY + VOCAB + layout + ["--data-cache-dir", corpus_cache, "--metrics-file", str(metrics),
                                       "--train-iters", "4", "--save", str(ck), "--load", str(ck), "--save-interval",
                                       "2"]
    killed = subprocess.run([sys.executable, str(REPO / "tests" / "kill_in_save.py"), *command], cwd=REPO,
                            env={**os.environ, "KILL_SAVE_POINT": point}, capture_output=True, text=True,
                            timeout=300)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    assert not (ck / "iter_0000004").exists()  # it died in the first save, at iteration 2

    again = train(corpus_cache, tmp_path, *VOCAB, *layout, "--train-iters", "4", "--save", ck, "--load", ck,
                  "--save-interval", "2")  # the same command: metrics.jsonl in tmp_path, as above
    assert again.code == 0, again.err
    assert losses(metrics) == straight(layout)
    if layout:  # Megatron-LM's layout: the tracker alone commits a save
        assert (ck / "latest_checkpointed_iteration.txt").read_text() == "4"
        assert sorted(path.name for path in ck.iterdir()) == ["iter_0000002", "iter_0000004",
                                                              "latest_checkpointed_iteration.txt"]
    else:
        assert (ck / "latest").read_text() == "iter_0000004\n"
        assert (ck / "latest_checkpointed_iteration.txt").read_text() == "4\n"
    if point != "files" and point != "metadata":  # iteration 2 was complete: resumed, not redone
        assert "resuming after iteration 2" in again.out, again.out


def test_a_left_iteration_that_does_not_verify_is_set_aside_and_the_run_starts_fresh(corpus_cache, tmp_path):
    ck = tmp_path / "ck"
    same_command = [*VOCAB, "--train-iters", "1", "--save", ck, "--load", ck, "--save-interval", "1"]
    assert train(corpus_cache, tmp_path, *same_command).code == 0
    (ck / "latest").unlink()  # as a kill before `latest` (after Megatron's tracker file) leaves it
    damaged = ck / "iter_0000001" / "model_tp00.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF  # a bit flip of the same size: only the content hash catches it
    damaged.write_bytes(bytes(data))

    again = train(corpus_cache, tmp_path, *same_command)
    assert again.code == 0, again.err
    assert "does not verify" in again.out and "starting a fresh run" in again.out, again.out
    aside = [path for path in ck.iterdir() if path.name.startswith("iter_0000001.unverified-")]
    assert len(aside) == 1 and (aside[0] / "model_tp00.safetensors").read_bytes() == bytes(data)  # never deleted
    assert (ck / "latest").read_text() == "iter_0000001\n"  # the fresh run saved iteration 1 anew
    assert "latest_checkpointed_iteration.txt named it and is removed" in again.out, again.out


# ---- a lock left by this container's previous life (problem 4) ----------------------------------------

def write_lock(directory: Path, pid: int, **recorded) -> Path:
    """A lock file as an earlier run on this host wrote it (a fresh heartbeat)."""
    import json
    import socket

    from checkpoint.save_directory import LOCK_FILE

    path = directory / LOCK_FILE
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "started": "earlier", "token": "theirs",
                                **recorded}))
    return path


def test_a_megatron_torch_dist_iteration_is_never_taken_for_an_unfinished_save(tmp_path):
    """A `--save CK --load CK` folder of Megatron-LM's layout (Megatron-LM's own, or ours with --ckpt-format
    torch_dist) has no 'latest' and one metadata.json per iteration, Megatron-Core's: committed by its tracker file,
    it is neither set aside nor re-pointed (it was set aside, and the tracker removed, at a ckpt-resume phase)."""
    from checkpoint.unfinished_save import finish_unfinished_save, needs_finishing

    iteration = tmp_path / "iter_0000002"
    iteration.mkdir()
    (iteration / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
                                             '"common_backend": "torch", "common_backend_version": 1}')
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2\n")
    assert not needs_finishing(str(tmp_path), str(tmp_path))
    lines: list[str] = []
    assert finish_unfinished_save(tmp_path, lines.append) is None and lines == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt"]


@pytest.mark.parametrize("damaged", [False, True], ids=["verified", "damaged"])
def test_a_torch_dist_iteration_no_pointer_names_is_verified_then_adopted_or_set_aside(tmp_path, damaged):
    """A torch_dist save killed after its rename and before its tracker leaves one complete iteration and no pointer:
    adopted once every stored item's CRC-32 verifies (the tracker then names it), else set aside, never deleted."""
    import shutil

    from checkpoint.unfinished_save import finish_unfinished_save, needs_finishing
    from tests.torch_dist_damage import flip_bit, tensor_bytes

    ck = tmp_path / "ck"
    iteration = Path(shutil.copytree(REPO / "tests" / "fixtures" / "megatron_tp1" / "iter_0000002",
                                     ck / "iter_0000002"))
    if damaged:
        path, at, length = tensor_bytes(iteration, "embedding.word_embeddings.weight")
        flip_bit(path, at + length - 1)
    assert needs_finishing(str(ck), str(ck))
    lines: list[str] = []
    adopted = finish_unfinished_save(ck, lines.append)
    if damaged:
        assert adopted is None and "does not match the CRC-32" in lines[0], lines
        assert [p.name.split("-")[0] for p in ck.iterdir()] == ["iter_0000002.unverified"]
    else:
        assert adopted == iteration and (ck / "latest_checkpointed_iteration.txt").read_text() == "2", lines


def test_a_lock_naming_our_own_pid_is_a_previous_life_of_this_container(tmp_path):
    """Before: 'in use by another run (pid <ours> ...)' naming itself, for 600 s."""
    from checkpoint.save_directory import SaveDirectoryLock

    write_lock(tmp_path, os.getpid())  # an old lock, without boot id or start time: the pid rule alone
    messages = []
    with SaveDirectoryLock(tmp_path, log=messages.append):
        pass
    assert "this process's own" in messages[0], messages


def test_a_lock_from_before_a_reboot_or_of_a_reused_pid_is_stale(tmp_path):
    """Before: the pid (our parent, alive) runs, so both were 'in use by another run'."""
    from base.output_locks import boot_id, process_start_ticks
    from checkpoint.save_directory import SaveDirectoryLock

    alive = os.getppid()
    assert boot_id() is not None and process_start_ticks(alive) is not None  # Linux's /proc
    for recorded, reason in (({"boot_id": "another-boot"}, "booted since"),
                             ({"boot_id": boot_id(), "process_start_ticks": process_start_ticks(alive) + 1},
                              "now belongs to another process")):
        write_lock(tmp_path, alive, **recorded)
        messages = []
        with SaveDirectoryLock(tmp_path, log=messages.append):
            pass
        assert reason in messages[0], messages


@pytest.mark.parametrize("recorded", ["none", "matching"])
def test_a_lock_of_a_live_process_on_this_host_still_holds(tmp_path, recorded):
    from base.errors import CheckpointError
    from base.output_locks import boot_id, process_start_ticks
    from checkpoint.save_directory import SaveDirectoryLock

    alive = os.getppid()
    extra = {} if recorded == "none" else {"boot_id": boot_id(), "process_start_ticks": process_start_ticks(alive)}
    write_lock(tmp_path, alive, **extra)
    with pytest.raises(CheckpointError, match=f"in use by another run .pid {alive} "):
        SaveDirectoryLock(tmp_path).acquire()


def test_a_lock_this_process_holds_is_not_taken_over_by_itself(tmp_path):
    from base.errors import CheckpointError
    from checkpoint.save_directory import SaveDirectoryLock

    with SaveDirectoryLock(tmp_path):
        with pytest.raises(CheckpointError, match="in use by another run"):
            SaveDirectoryLock(tmp_path).acquire()


# ---- a run too short for one iteration (problem 12) ---------------------------------------------------

def test_train_samples_below_one_global_batch_is_refused_before_any_work(corpus_cache, tmp_path):
    """Before: exit 0, 'the checkpoint is already at 0 iterations' with no checkpoint, nothing trained.
    Megatron-LM (NVIDIA/Megatron-LM megatron/training/training.py, update_train_iters): without a batch
    ramp `args.train_iters = args.train_samples // args.global_batch_size`, so such a run gets 0
    iterations and trains nothing silently; the issue asks for a refusal instead."""
    import pretrain_gpt
    from tests.reliability_helpers import run_main

    at = TINY.index("--train-iters")
    argv = TINY[:at] + TINY[at + 2:] + VOCAB + ["--data-cache-dir", corpus_cache, "--train-samples", "1",
                                                "--metrics-file", tmp_path / "out" / "metrics.jsonl",
                                                "--save", tmp_path / "out" / "ck"]
    line = run_main(pretrain_gpt.main, argv).one_error_line("--train-samples 1", "global batch", "--global-batch-size")
    assert "0 iterations" in line
    assert not (tmp_path / "out").exists()  # refused before any output was created


# ---- the divergence message names a checkpoint that resumes (problem 5) ------------------------------

def test_the_divergence_message_names_the_last_save_before_the_losses_left_their_trend(corpus_cache, tmp_path):
    """Before: 'the last good checkpoint is <latest>', a save made after the rate had taken the
    weights to ~1e7; resuming it with a lower rate, as the message advised, diverged at once."""
    ck = tmp_path / "ck"
    # the tiny preset's settings: under Megatron's defaults (a flag launch without a preset) the same rate
    # climbed to ~5e8 without reaching NaN within 8 iterations
    tiny = ("--config", "tiny")
    assert train(corpus_cache, tmp_path, *tiny, *VOCAB, "--train-iters", "2", "--save", ck,
                 "--save-interval", "1").code == 0
    diverging = train(corpus_cache, tmp_path, *tiny, *VOCAB, "--train-iters", "8", "--save", ck, "--load", ck,
                      "--save-interval", "1", "--lr", "1e3", "--clip-grad", "0", "--lr-warmup-iters", "0",
                      "--override-opt_param-scheduler")
    line = diverging.one_error_line("diverged", "the losses left their trend at iteration 4",
                                    f"{ck / 'iter_0000002'} (the one this run loaded)")
    latest = (ck / "latest").read_text().strip()
    assert latest > "iter_0000002" and latest not in line  # the diverging saves are never named

    def resume_one_step_at_a_low_rate(checkpoint: Path):
        work = tmp_path / checkpoint.name
        work.mkdir()
        # the checkpoint's own model settings (the tiny preset's gelu_tanh): a resume under Megatron's defaults
        # (gelu) is refused as another model since the resume check compares --activation
        outcome = train(corpus_cache, work, *tiny, *VOCAB, "--train-iters", str(int(checkpoint.name[5:]) + 1),
                        "--load", checkpoint, "--lr", "1e-4", "--override-opt_param-scheduler")
        return outcome, [r["loss"] for r in metrics_records(work / "metrics.jsonl") if "loss" in r and "split" not in r]

    outcome, named_losses = resume_one_step_at_a_low_rate(ck / "iter_0000002")
    assert outcome.code == 0, outcome.err
    assert named_losses[-1] < 7  # in trend: near the first loss, ln(512) = 6.2 at most
    outcome, latest_losses = resume_one_step_at_a_low_rate(ck / latest)  # what the old message advised
    assert outcome.code == 2 and "diverged" in outcome.err or latest_losses[-1] > 2 * named_losses[-1]


def test_a_spike_the_run_recovered_from_does_not_count():
    from training.divergence import DivergenceHistory

    # Iterations 11-17 after a resume at 10: a spike at 13 that recovered, then the weights of the
    # save at 15 gave 40.0 at 16 and the run stopped at 17.
    history = DivergenceHistory(10, [3.0, 2.9, 7.0, 2.8, 2.7, 40.0, float("nan")], saved_iterations=[12, 14, 15])
    assert history.left_trend_at() == 16
    assert history.resumable_iteration() == 14
    assert DivergenceHistory(0, [5.0, 90.0, float("nan")], [1, 2]).resumable_iteration() is None
    assert DivergenceHistory(4, [float("nan")], []).resumable_iteration() is None  # the loaded one gave NaN


# ---- the same under expert parallelism, multi-token prediction and Muon (issue 60, item 6) -------------
# Issue 60 probed kills at the save points under EP, CP, MTP, Muon and the pipeline layout (2 ranks under
# scripts/launch.py, at the points files, renamed and tracker), damaged files of those checkpoints at --load, and
# resumes across EP and CP sizes (tests/checkpoint/test_conformance.py holds EP, test_context_parallel_training.py
# CP 2 -> 1): all held. What no other test launches is kept: two ranks, one killed at a commit step while the other
# waits in the save's verdict (torchrun's agent stops it), every file kind of an expert-parallel Muon + MTP
# checkpoint verified at the adoption, and an expert file damaged, read by a run of another EP size.

MOE_MTP_MUON = ["--num-layers", "2", "--global-batch-size", "4", "--seed", "3", "--num-experts", "4",
                "--moe-router-topk", "2", "--moe-token-dispatcher-type", "alltoall", "--mtp-num-layers", "1",
                "--optimizer", "muon"]


def launch_two_ranks(script: str, argv: list, workdir: Path, **env) -> subprocess.CompletedProcess:
    from tests.training.test_launch_fuzz import LAUNCH_VARIABLES

    environment = {key: value for key, value in os.environ.items() if key not in LAUNCH_VARIABLES}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "launch.py"), "--standalone", "--nproc_per_node",
                           "2", str(REPO / script), *map(str, argv)], cwd=workdir, capture_output=True, text=True,
                          env={**environment, "WANDB_MODE": "disabled", **env}, timeout=300)


@pytest.fixture(scope="module")
def expert_parallel_requeue(corpus_cache, tmp_path_factory):
    """EP 2 with MTP and Muon on two ranks: a straight run saving at 2 and 4, and a run killed at `renamed`
    (iteration 2's directory in, no pointer: the adoption path) then requeued with the same command."""
    work = tmp_path_factory.mktemp("ep2-requeue")
    argv = TINY + VOCAB + MOE_MTP_MUON + ["--data-cache-dir", corpus_cache, "--train-iters", "4", "--save-interval", "2",
                                          "--expert-model-parallel-size", "2"]
    # the straight run gives the losses to resume to and the checkpoint the damage tests read: its two ranks are
    # forked (tests/forked_runs.py), the killed run and its requeue still go through scripts/launch.py
    straight = logged_iterations(work, "straight", argv + ["--save", work / "straight"], 2)
    requeued = argv + ["--save", work / "ck", "--load", work / "ck", "--metrics-file", work / "requeued.jsonl"]
    killed = launch_two_ranks("tests/kill_in_save.py", requeued, work, KILL_SAVE_POINT="renamed")
    assert killed.returncode != 0 and "killed by SIGKILL; torchrun stopped the other ranks" in killed.stderr, \
        killed.stderr[-2000:]
    assert not (work / "ck" / "latest").exists() and (work / "ck" / "iter_0000002").is_dir()
    again = launch_two_ranks("pretrain_gpt.py", requeued, work)
    return work, straight, again


@pytest.mark.slow
def test_a_two_rank_expert_parallel_run_killed_in_its_save_resumes_with_the_same_command(expert_parallel_requeue):
    work, straight, again = expert_parallel_requeue
    assert again.returncode == 0, again.stderr[-2000:]
    assert "is complete and verified" in again.stdout and "resuming after iteration 2" in again.stdout, again.stdout
    assert losses(work / "requeued.jsonl") == losses(work / "straight.jsonl")
    assert (work / "ck" / "latest").read_text() == "iter_0000004\n"


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["bit flipped", "truncated", "linked out"])
def test_a_damaged_expert_file_is_refused_in_one_line_by_a_run_of_another_expert_parallel_size(
        expert_parallel_requeue, corpus_cache, tmp_path, damage):
    import shutil

    import pretrain_gpt
    from tests.reliability_helpers import run_main

    ck = tmp_path / "ck"
    shutil.copytree(expert_parallel_requeue[0] / "straight", ck)
    expert_file = ck / "iter_0000004" / "model_tp00_ep001.safetensors"
    data = expert_file.read_bytes()
    if damage == "bit flipped":
        expert_file.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "truncated":
        expert_file.write_bytes(data[:len(data) // 2])
    else:
        (tmp_path / "elsewhere").write_bytes(data)  # the same bytes: only the link is wrong
        expert_file.unlink()
        expert_file.symlink_to(tmp_path / "elsewhere")
    resumed = run_main(pretrain_gpt.main, TINY + VOCAB + MOE_MTP_MUON + [  # one process: EP 1
        "--data-cache-dir", corpus_cache, "--train-iters", "6", "--use-checkpoint-opt_param-scheduler", "--load", ck,
        "--metrics-file", tmp_path / "metrics.jsonl"])
    resumed.one_error_line(str(expert_file), {"bit flipped": "hash mismatch", "truncated": "truncated",
                                              "linked out": "outside the checkpoint directory"}[damage])
    assert not (tmp_path / "metrics.jsonl").exists() or not losses(tmp_path / "metrics.jsonl")
