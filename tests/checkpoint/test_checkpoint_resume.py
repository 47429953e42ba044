"""Resume from a checkpoint, end to end through pretrain_gpt: the issue's acceptance runs.

- Exact resume: 8 iterations uninterrupted vs 4 (saved, `--exit-interval 4`) + 4 resumed with
  `--load`: iterations 5-8 log bitwise the same losses, with dropout on (so the RNG streams must be
  restored too), for ZeRO stages 0-3 at DP=2, for TP=2, and with two blended datasets.
- Elastic resume (saved at DP=4 stage 2, resumed at DP=2 stage 3 and at DP=1 stage 0) is two rows of the
  conformance table, tests/checkpoint/test_conformance.py, with every other layout change.
- Preemption: SIGTERM with --exit-signal-handler finishes the iteration, saves and exits 0; a rank
  killed with SIGKILL after iteration 6 ends the whole job with a non-zero status, and the restart
  (the same command) resumes from the iteration-4 checkpoint and reproduces 5-8.

Every property here holds at any length with a save between two logged iterations; 8 iterations (4
before the save, past the 3 warm-up ones, and 4 after it) check each one at 40% of the 20 iterations
this file once trained.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import pretrain_gpt
from tests.distributed import free_port, run_distributed
from tests.zero.test_zero_training import train_configurations

ROOT = Path(__file__).resolve().parents[2]
ITERS = 8
SAVE_AT = ITERS // 2  # the checkpoint every resume starts from
KILL_AT = SAVE_AT + 2  # past the checkpoint, so the restart drops and redoes logged iterations
COMMON = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--max-position-embeddings", "32", "--train-iters", str(ITERS), "--seed", "1", "--log-interval", "1",
          "--eval-iters", "0", "--tokenizer-vocab-size", "512", "--device", "cpu", "--global-batch-size", "8",
          "--lr-warmup-iters", "3", "--reduce-bucket-size", "20000", "--allgather-bucket-size", "30000"]
NO_DROPOUT = ["--hidden-dropout", "0", "--attention-dropout", "0"]


@pytest.fixture(scope="module")
def corpus(embedded_corpus):
    return embedded_corpus


def losses(metrics_file) -> dict[int, float]:
    """iteration -> training loss, from metrics.jsonl (a resumed run appends to its first part)."""
    result = {}
    for line in Path(metrics_file).read_text().splitlines():
        record = json.loads(line)
        if "loss" in record and "split" not in record:
            assert record["iteration"] not in result, f"iteration {record['iteration']} logged twice"
            result[record["iteration"]] = record["loss"]
    return result


class Scenario:
    """argv for the three runs of one exact-resume check: uninterrupted, first part, resumed part."""

    def __init__(self, tmp_path, cache, name, *extra):
        self.full = tmp_path / f"{name}-full.jsonl"
        self.resumed = tmp_path / f"{name}-resumed.jsonl"
        self.save_dir = tmp_path / f"{name}-ckpt"
        base = COMMON + ["--data-cache-dir", cache, *extra]
        every = str(SAVE_AT)
        self.argvs = [
            base + ["--metrics-file", str(self.full)],
            base + ["--metrics-file", str(self.resumed), "--save", str(self.save_dir), "--save-interval", every,
                    "--exit-interval", every],
            base + ["--metrics-file", str(self.resumed), "--save", str(self.save_dir), "--save-interval", every,
                    "--load", str(self.save_dir)],
        ]

    def check_bitwise(self):
        full, resumed = losses(self.full), losses(self.resumed)
        assert sorted(full) == sorted(resumed) == list(range(1, ITERS + 1))
        after_save = range(SAVE_AT + 1, ITERS + 1)
        assert [resumed[i] for i in after_save] == [full[i] for i in after_save]


def write_reversed_dataset(prefix: str, out_prefix: str) -> None:
    """A second, different dataset for blending: the corpus' documents in reverse, each reversed."""
    from data.indexed import IndexedDataset, IndexedDatasetWriter

    source = IndexedDataset(prefix)
    pointers, lengths = source.sequence_pointers, source.sequence_lengths
    tokens = np.memmap(prefix + ".bin", dtype=source.dtype, mode="r")
    with IndexedDatasetWriter(out_prefix, source.dtype) as writer:
        for i in reversed(range(len(lengths))):
            start = pointers[i] // source.dtype.itemsize
            writer.add_document(np.array(tokens[start:start + lengths[i]][::-1]))


@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory, corpus):
    tmp_path = tmp_path_factory.mktemp("resume-runs")
    cache, prepared = corpus
    stages = [Scenario(tmp_path, cache, f"dp2-stage{stage}", "--zero-stage", str(stage),
                       "--micro-batch-size", "2") for stage in range(4)]
    tensor_parallel = Scenario(tmp_path, cache, "tp2", "--tensor-model-parallel-size", "2", "--zero-stage", "1",
                               "--micro-batch-size", "4")
    other = str(tmp_path / "reversed_text_document")
    write_reversed_dataset(prepared.data_prefix, other)
    blending = Scenario(tmp_path, cache, "blend", "--micro-batch-size", "4", "--data-path", "0.3",
                        prepared.data_prefix, "0.7", other,
                        "--tokenizer-file", os.path.join(prepared.tokenizer_dir, "tokenizer.json"))

    run_distributed(train_configurations, 2, 1, [argv for s in stages for argv in s.argvs], timeout=600)
    run_distributed(train_configurations, 2, 2, tensor_parallel.argvs, timeout=600)
    for argv in blending.argvs:
        assert pretrain_gpt.main(argv) == 0
    return {"stages": stages, "tensor_parallel": tensor_parallel, "blending": blending}


@pytest.mark.slow
@pytest.mark.parametrize("stage", range(4))
def test_resume_is_bitwise_for_every_zero_stage(resume_runs, stage):
    resume_runs["stages"][stage].check_bitwise()


@pytest.mark.slow
def test_resume_is_bitwise_with_tensor_parallelism(resume_runs):
    resume_runs["tensor_parallel"].check_bitwise()


@pytest.mark.slow
def test_resume_is_bitwise_with_blended_data(resume_runs):
    resume_runs["blending"].check_bitwise()


@pytest.mark.slow
def test_checkpoints_are_kept_and_latest_points_to_the_last(resume_runs):
    save_dir = resume_runs["stages"][2].save_dir
    first, last = f"iter_{SAVE_AT:07d}", f"iter_{ITERS:07d}"
    assert (save_dir / "latest").read_text().strip() == last
    assert (save_dir / "latest_checkpointed_iteration.txt").read_text() == f"{ITERS}\n"  # Megatron's tracker
    assert sorted(p.name for p in save_dir.iterdir()) == [first, last, "latest", "latest_checkpointed_iteration.txt"]
    names = sorted(p.name for p in (save_dir / first).iterdir())
    assert names == ["metadata.json", "model_tp00.safetensors", "optim_tp00_dp000.safetensors",
                     "optim_tp00_dp001.safetensors", "rng_tp00_dp000.safetensors", "rng_tp00_dp001.safetensors",
                     "tokenizer"]
    # Stage 0's partition is the same on every DP rank: one copy.
    stage0 = sorted(p.name for p in (resume_runs["stages"][0].save_dir / first).glob("optim_*"))
    assert stage0 == ["optim_tp00_dp000.safetensors"]


# ---- preemption and faults (separate processes, as a cluster would run them) -------------------

def _launch(argv, rank, world_size, port, log, extra_env=None, script="pretrain_gpt.py", errors=None):
    """One rank as torchrun would start it; its stderr goes to `errors` when given, else into `log`."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
               WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
               OMP_NUM_THREADS="1", WANDB_MODE="disabled", **(extra_env or {}))
    return subprocess.Popen([sys.executable, str(ROOT / script), *argv], env=env, cwd=ROOT,
                            stdout=log, stderr=errors or subprocess.STDOUT)


def _wait_for_iteration(metrics_file: Path, iteration: int, process, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics_file.exists() and any(json.loads(line).get("iteration", 0) >= iteration
                                         for line in metrics_file.read_text().splitlines() if line.strip()):
            return
        assert process.poll() is None, f"the run exited ({process.returncode}) before iteration {iteration}"
        time.sleep(0.05)
    raise AssertionError(f"no iteration {iteration} within {timeout} s")


@pytest.mark.slow
def test_sigterm_saves_and_exits_zero_then_resume_continues(tmp_path, corpus):
    cache, _ = corpus
    save_dir, metrics = tmp_path / "ckpt", tmp_path / "run.jsonl"
    argv = COMMON + NO_DROPOUT + ["--data-cache-dir", cache, "--micro-batch-size", "8", "--train-iters", "400",
                                  "--save", str(save_dir), "--exit-signal-handler"]
    with open(tmp_path / "run.log", "w") as log:
        process = _launch(argv + ["--metrics-file", str(metrics)], 0, 1, free_port(), log)
        try:
            _wait_for_iteration(metrics, 3, process)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=120) == 0, (tmp_path / "run.log").read_text()
        finally:
            if process.poll() is None:
                process.kill()
    output = (tmp_path / "run.log").read_text()
    stopped = max(losses(metrics))
    assert stopped < 400, "the run finished before the signal arrived"
    assert f"exiting after iteration {stopped}: received SIGTERM" in output, output
    assert (save_dir / "latest").read_text().strip() == f"iter_{stopped:07d}"


@pytest.mark.slow
def test_killed_rank_ends_the_job_and_restart_resumes_from_latest(tmp_path, corpus, resume_runs):
    """Two ranks as torchrun would start them; rank 1 is SIGKILLed after iteration KILL_AT (a node dies).
    Rank 0 must fail (not hang) within the collective timeout; the same command then resumes from the
    iteration-SAVE_AT checkpoint and logs exactly the uninterrupted run's losses after it."""
    cache, _ = corpus
    save_dir = tmp_path / "ckpt"
    # The uninterrupted reference is resume_runs' DP=2 stage-2 run (dropout on, micro-batch 2, seed 1):
    # the same training flags as this launch, so no reference run of its own; the collective timeout
    # changes no loss.
    base = COMMON + ["--data-cache-dir", cache, "--micro-batch-size", "2", "--zero-stage", "2",
                     "--distributed-timeout-minutes", "1"]
    reference = resume_runs["stages"][2].full

    metrics = tmp_path / "run.jsonl"
    argv = base + ["--metrics-file", str(metrics), "--save", str(save_dir), "--save-interval", str(SAVE_AT),
                   "--load", str(save_dir)]
    port, logs = free_port(), [open(tmp_path / f"rank{rank}.log", "w") for rank in range(2)]
    try:
        processes = [_launch(argv, rank, 2, port, logs[rank], {"KILL_AT_ITERATION": str(KILL_AT), "KILL_RANK": "1"},
                             script="tests/kill_rank.py") for rank in range(2)]
        started = time.monotonic()
        codes = [process.wait(timeout=180) for process in processes]
        elapsed = time.monotonic() - started
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        for log in logs:
            log.close()
    assert codes[1] == -signal.SIGKILL
    assert codes[0] not in (0, None), (tmp_path / "rank0.log").read_text()
    assert elapsed < 150
    assert (save_dir / "latest").read_text().strip() == f"iter_{SAVE_AT:07d}"

    # The restart: the same command line, nobody killed.
    port = free_port()
    with open(tmp_path / "restart0.log", "w") as log0, open(tmp_path / "restart1.log", "w") as log1:
        processes = [_launch(argv, rank, 2, port, log) for rank, log in enumerate((log0, log1))]
        codes = [process.wait(timeout=300) for process in processes]
    assert codes == [0, 0], (tmp_path / "restart0.log").read_text()
    assert f"resuming after iteration {SAVE_AT}" in (tmp_path / "restart0.log").read_text()
    full, resumed = losses(reference), losses(metrics)
    every = list(range(1, ITERS + 1))
    assert sorted(resumed) == every  # the killed run's SAVE_AT+1..KILL_AT were dropped, then redone
    assert [resumed[i] for i in every] == [full[i] for i in every]
