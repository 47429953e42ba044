"""Nothing lost, nothing silent (issue 11): one section per class of failure the hostile-user probes
found, each test reproducing the failure (it fails on the code before this issue) and checking the fix.

1. a fresh start into a save directory holding checkpoints      6. non-finite settings and NaN checkpoints
2. tools that overwrite                                          7. two runs on one save directory
3. an unwritable output found only at the end                    8. integrity of what a checkpoint lists
4. a wrong --load that became a fresh run; metrics kept          9. one line, everywhere (and Ctrl-C)
5. token ids outside the vocabulary

Most tests run `pretrain_gpt.main` in this process on a one-block model (about a second a run); the
two through the torchrun launcher start processes and are marked slow.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import pretrain_gpt
from checkpoint.file_names import model_file, optimizer_file, rng_file
from checkpoint.format import (
    LATEST_FILE,
    METADATA_FILE,
    CheckpointError,
    resolve_checkpoint,
)
from checkpoint.ours.sharded import load_checkpoint, save_checkpoint
from data import DataError
from data.gpt_dataset import build_train_valid_test_datasets
from data.indexed import IndexedDataset
from data.tokenizer import GPTTokenizer
from scripts.tools import convert_to_hf, reshard_checkpoint, zero_to_fp32
from tests.checkpoint.test_checkpoint_safety import build, cpu_state, make_config, train_steps
from tests.forked_runs import logged_iterations
from tests.reliability_helpers import TINY, metrics_records, run_main, snapshot, train, write_dataset
from zero.optimizer import StepResult

# Modules and names this issue added are imported inside the tests that use them, so that on the
# code before it every other test still runs (and fails for what it checks, not for an import).

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cache(corpus_cache_300):
    """The session's embedded corpus with a 300-token vocabulary (tokenizer training is the slow part)."""
    return corpus_cache_300


@pytest.fixture(scope="module")
def trained(cache, tmp_path_factory):
    """A save directory with checkpoints at iterations 1 and 2 (read-only for the tests: copy it)."""
    work = tmp_path_factory.mktemp("reliability-trained")
    outcome = train(cache, work, "--save", work / "ck", "--save-interval", "1")
    assert outcome.code == 0, outcome.err
    return work / "ck"


@pytest.fixture
def ck(trained, tmp_path):
    """A private copy of the trained save directory."""
    return Path(shutil.copytree(trained, tmp_path / "ck"))


def no_work(monkeypatch):
    """Make any data preparation fail the test: the error must come before it."""
    def forbidden(*args, **kwargs):
        raise AssertionError("data preparation started although the run should have been refused")

    monkeypatch.setattr("training.prepare.build_data", forbidden)


# ---- 1. a fresh start into a save directory with checkpoints --------------------------------------

@pytest.mark.parametrize("how", ["no_load", "latest_deleted", "finetune", "init_elsewhere"])
def test_fresh_start_into_a_save_directory_with_checkpoints_is_refused(ck, cache, tmp_path, monkeypatch, how):
    """Before: each of these replaced iter_* and moved `latest` back."""
    if how == "latest_deleted":  # both pointers: with Megatron's tracker file left, --load reads it
        (ck / LATEST_FILE).unlink()
        (ck / "latest_checkpointed_iteration.txt").unlink()
    before = snapshot(ck)
    extra = {"no_load": [], "latest_deleted": ["--load", ck], "finetune": ["--load", ck, "--finetune"],
             "init_elsewhere": ["--load", ck / "iter_0000001", "--finetune"]}[how]
    no_work(monkeypatch)
    line = train(cache, tmp_path, "--save", ck, *extra).one_error_line()
    assert str(ck) in line
    assert ("--overwrite-save" in line) or ("latest" in line and "iter_0000002" in line), line
    assert snapshot(ck) == before


def test_overwrite_save_lets_a_fresh_run_write(ck, cache, tmp_path):
    outcome = train(cache, tmp_path, "--save", ck, "--overwrite-save", "--train-iters", "1")
    assert outcome.code == 0, outcome.err
    assert (ck / LATEST_FILE).read_text().strip() == "iter_0000001"  # the user asked for it


def test_megatron_style_save_equals_load_starts_fresh_then_resumes(cache, tmp_path):
    """What must keep working: Megatron-LM's scripts pass --save $CK --load $CK from the first run."""
    empty = tmp_path / "new-ck"
    first = train(cache, tmp_path, "--save", empty, "--load", empty)
    assert first.code == 0, first.err
    assert first.out.count("starting a fresh run") == 1
    again = train(cache, tmp_path, "--save", empty, "--load", empty, "--train-iters", "3", "--override-opt_param-scheduler")
    assert again.code == 0 and "resuming after iteration 2" in again.out, again.err


def test_resuming_from_an_older_iteration_of_the_same_directory_is_allowed(ck, cache, tmp_path):
    outcome = train(cache, tmp_path, "--save", ck, "--load", ck / "iter_0000001")
    assert outcome.code == 0, outcome.err
    assert "resuming after iteration 1" in outcome.out


# ---- 2. tools that overwrite ----------------------------------------------------------------------

def test_zero_to_fp32_never_overwrites_without_asking_nor_writes_into_a_checkpoint(ck, tmp_path):
    before = snapshot(ck)
    inside = ck / "iter_0000002" / model_file(0)
    line = run_main(zero_to_fp32.main, [ck, inside, "--overwrite"]).one_error_line("inside the checkpoint")
    assert "zero_to_fp32.py: error:" in line
    run_main(zero_to_fp32.main, [ck, ck / "export.safetensors"]).one_error_line("inside the checkpoint")
    assert snapshot(ck) == before

    out = tmp_path / "mine.safetensors"
    out.write_bytes(b"a user's own file")
    run_main(zero_to_fp32.main, [ck, out]).one_error_line("--overwrite")
    # Issue 27: --overwrite replaces only what the tool itself wrote, never a user's other file.
    run_main(zero_to_fp32.main, [ck, out, "--overwrite"]).one_error_line("not a file this tool wrote")
    assert out.read_bytes() == b"a user's own file"
    out.unlink()
    assert run_main(zero_to_fp32.main, [ck, out]).code == 0
    os.utime(out, ns=(0, 0))
    assert run_main(zero_to_fp32.main, [ck, out, "--overwrite"]).code == 0
    assert out.stat().st_mtime_ns != 0  # an earlier export is replaced


def test_reshard_into_a_save_directory_with_checkpoints_needs_overwrite(ck, trained, tmp_path):
    before = snapshot(ck)
    source = tmp_path / "source"
    shutil.copytree(trained, source)
    (source / LATEST_FILE).write_text("iter_0000001\n")  # rewriting iteration 1 into ck would move its latest back
    run_main(reshard_checkpoint.main, [source, ck, "--tensor-model-parallel-size", "2"]).one_error_line(
        "already holds checkpoints", "--overwrite")
    assert snapshot(ck) == before
    run_main(reshard_checkpoint.main, [source, ck / "iter_0000002" / "x", "--tensor-model-parallel-size", "2"]
             ).one_error_line("inside the checkpoint")
    assert snapshot(ck) == before


def test_convert_to_hf_never_writes_inside_a_checkpoint(ck):
    before = snapshot(ck)
    run_main(convert_to_hf.main, [ck, ck / "iter_0000001" / "hf", "--overwrite"]).one_error_line(
        "inside the checkpoint")
    assert snapshot(ck) == before


# ---- 3. unwritable outputs are found before any work ----------------------------------------------

@pytest.mark.parametrize("flag", ["--save", "--metrics-file", "--data-cache-dir"])
def test_an_output_under_a_regular_file_is_refused_before_any_work(cache, tmp_path, monkeypatch, flag):
    """Before: --save under a file trained to the end and then failed; the other two were tracebacks."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    no_work(monkeypatch)
    argv = {"--save": ["--save", blocker / "ck"], "--metrics-file": ["--metrics-file", blocker / "m.jsonl"],
            "--data-cache-dir": ["--data-cache-dir", blocker / "cache"]}[flag]
    line = train(cache, tmp_path, *argv).one_error_line(flag, str(blocker))
    assert line.startswith("pretrain_gpt.py: error:")


# ---- 4. a wrong --load, and metrics that are appended to --------------------------------------------

@pytest.mark.parametrize("what", ["file", "iteration_without_metadata", "non_empty_directory_without_checkpoint"])
def test_a_load_that_names_no_checkpoint_is_an_error(ck, cache, tmp_path, monkeypatch, what):
    """Before: each of these started a fresh run with exit 0. A folder that holds something but no
    checkpoint stays an error (issue 34: nothing is silently thrown away)."""
    target = {"file": ck / "iter_0000002" / METADATA_FILE, "iteration_without_metadata": tmp_path / "iter_0000009",
              "non_empty_directory_without_checkpoint": tmp_path / "weights"}[what]
    if what != "file":
        target.mkdir()
    if what == "non_empty_directory_without_checkpoint":
        (target / "model.pt").write_text("someone's weights")
    no_work(monkeypatch)
    train(cache, tmp_path, "--load", target, "--save", tmp_path / "out").one_error_line(str(target))


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_a_load_of_a_missing_or_empty_folder_starts_from_random_weights_with_one_warning(cache, tmp_path, what):
    """Issue 34, point 3: every Megatron-LM functional-test config passes `--load` of an empty folder other
    than `--save`; Megatron-LM (github:NVIDIA/Megatron-LM megatron/training/checkpointing.py, load_checkpoint
    via _load_base_checkpoint: "WARNING: could not find the metadata file {tracker_filename} ... will not
    load any checkpoints and will start from random") returns iteration 0 and trains. Was: refused. Issue 115,
    item 5: the line stands out, and Megatron-LM's --exit-on-missing-checkpoint makes it an error before any work
    (exit 2 here; Megatron-LM's sys.exit() is 0)."""
    target = tmp_path / "checkpoints"
    if what == "empty":
        target.mkdir()
    refused = train(cache, tmp_path, "--load", target, "--save", tmp_path / "out", "--exit-on-missing-checkpoint")
    assert "--exit-on-missing-checkpoint refuses" in refused.one_error_line(f"--load {target}")
    assert not (tmp_path / "out").exists() and not (tmp_path / "metrics.jsonl").exists()
    outcome = train(cache, tmp_path, "--load", target, "--save", tmp_path / "out")
    assert outcome.code == 0, outcome.err
    assert [line for line in outcome.out.splitlines() + outcome.err.splitlines()
            if line.startswith("WARNING: --load") and str(target) in line and "NOTHING IS RESUMED" in line
            and "random weights" in line and "--exit-on-missing-checkpoint" in line]
    assert [r["iteration"] for r in metrics_records(tmp_path / "metrics.jsonl")] == [1, 2]


def test_save_interval_without_save_trains_saves_nothing_and_says_so(cache, tmp_path):
    """Issue 34, point 3: Megatron-LM (github:NVIDIA/Megatron-LM megatron/training/training.py, train():
    `if args.save and args.save_interval and iteration % args.save_interval == 0: save_checkpoint_and_time`)
    saves nothing without --save. Was: refused ("--save-interval needs --save DIR")."""
    before = sorted(path.name for path in tmp_path.iterdir())
    outcome = train(cache, tmp_path, "--save-interval", "1")
    assert outcome.code == 0, outcome.err
    assert [line for line in outcome.out.splitlines() if "--save-interval 1 without --save: nothing is saved" in line]
    written = ["metrics.jsonl", "metrics.commands.jsonl"]  # the records, and the flags the plot labels the run by
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted(before + written)


def test_metrics_are_appended_and_a_resume_drops_only_what_it_redoes(cache, tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"iteration": 1, "loss": 9.0, "note": "an earlier run"}\n')
    assert train(cache, tmp_path, "--save", tmp_path / "ck", "--train-iters", "3", "--save-interval", "2").code == 0
    records = metrics_records(metrics)
    assert records[0]["note"] == "an earlier run"
    assert [r["iteration"] for r in records[1:]] == [1, 2, 3]
    # The run is resumed from its iteration-2 checkpoint: its record of iteration 3 goes, nothing else.
    (tmp_path / "ck" / LATEST_FILE).write_text("iter_0000002\n")
    outcome = train(cache, tmp_path, "--save", tmp_path / "ck", "--load", tmp_path / "ck", "--train-iters", "3",
                    "--overwrite-save")
    assert outcome.code == 0, outcome.err
    assert "dropped 1 records after iteration 2" in outcome.out
    assert [r["iteration"] for r in metrics_records(metrics)] == [1, 1, 2, 3]
    assert metrics_records(metrics)[0]["note"] == "an earlier run"


# ---- 5. token ids outside the vocabulary -------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer_file(cache):
    return str(next(Path(cache).glob("pydoc-topics-v300-*")) / "tokenizer" / "tokenizer.json")


def out_of_vocabulary_dataset(directory: Path, bad_token: int, dtype=np.uint16) -> str:
    documents = [[(7 * d + i) % 250 for i in range(40)] for d in range(60)]
    documents[37][11] = bad_token
    return write_dataset(directory / "bad_text_document", documents, dtype)


@pytest.mark.parametrize("bad_token, dtype", [(300, np.uint16), (65000, np.uint16), (-3, np.int32)])
def test_out_of_vocabulary_token_is_an_error_naming_file_and_document(cache, tokenizer_file, tmp_path, bad_token,
                                                                      dtype):
    """Before: an IndexError mid-run at TP=1 (silent zero embeddings at TP>=2)."""
    prefix = out_of_vocabulary_dataset(tmp_path, bad_token, dtype)
    line = train(cache, tmp_path, "--data-path", prefix, "--tokenizer-file", tokenizer_file,
                 "--split", "1,0,0").one_error_line(prefix + ".bin", "document 37", f"token id {bad_token}",
                                                    "at position 11")
    assert "[0, 300)" in line


def test_token_range_pass_is_chunked_and_cached_beside_the_index(tmp_path, monkeypatch):
    from data import token_range
    from data.token_range import check_token_ids, range_cache_path

    documents = [[d % 200 + i for i in range(30)] for d in range(50)]
    dataset = IndexedDataset(write_dataset(tmp_path / "ok_text_document", documents))
    found = check_token_ids(dataset, 300, chunk_tokens=7)  # many chunks, the last one partial
    expected = np.concatenate([np.asarray(d) for d in documents])
    assert (found.low, found.high) == (int(expected.min()), int(expected.max()))
    assert json.loads(Path(range_cache_path(dataset.prefix)).read_text())["high"] == found.high

    def no_second_scan(*args, **kwargs):
        raise AssertionError("the token range was scanned again although it is cached")

    monkeypatch.setattr(token_range, "scan_token_range", no_second_scan)
    assert check_token_ids(IndexedDataset(dataset.prefix), 300) == found
    vocab = 70
    first = next((d, i, t) for d, tokens in enumerate(documents) for i, t in enumerate(tokens) if t >= vocab)
    with pytest.raises(DataError, match=f"document {first[0]} holds token id {first[2]} at position {first[1]},"):
        check_token_ids(IndexedDataset(dataset.prefix), vocab, chunk_tokens=7)  # the cache says how far, a scan where


def test_datasets_check_token_ids_when_opened(tmp_path):
    prefix = out_of_vocabulary_dataset(tmp_path, 400)
    with pytest.raises(DataError, match="document 37"):
        build_train_valid_test_datasets([prefix], "1,0,0", 16, 1, (4, 0, 0), vocab_size=300)


def test_a_tokenizer_whose_ids_have_gaps_sizes_the_embedding_by_its_largest_id():
    from tokenizers import Tokenizer, models

    vocab = {"a": 0, "b": 1, "<|endoftext|>": 2, "c": 900}
    tokenizer = GPTTokenizer(Tokenizer(models.WordLevel(vocab, unk_token="a")))
    assert tokenizer.vocab_size == 901


@pytest.mark.slow
def test_out_of_vocabulary_token_is_an_error_at_tensor_parallel_2(cache, tokenizer_file, tmp_path):
    """Before: at TP=2 the run trained, the id mapped to a zero embedding on every rank."""
    from tests.distributed import DistributedTestError, run_distributed
    from tests.zero.test_zero_training import train_configurations

    prefix = out_of_vocabulary_dataset(tmp_path, 300)
    argv = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
            "--train-iters", "2", "--eval-iters", "0", "--device", "cpu", "--tensor-model-parallel-size", "2",
            "--data-path", prefix, "--tokenizer-file", tokenizer_file, "--split", "1,0,0",
            "--metrics-file", str(tmp_path / "m.jsonl")]
    with pytest.raises(DistributedTestError, match="document 37 holds token id 300"):
        run_distributed(train_configurations, 2, 2, [argv], timeout=300)


# ---- 6. non-finite settings and NaN checkpoints -----------------------------------------------------

# Each of these passed validation before (NaN compares false, inf is "positive"); the fuzz test in
# tests/training/test_bad_inputs_fuzz.py feeds every float flag NaN, inf and -inf.
@pytest.mark.parametrize("flag, value", [
    ("--lr", "nan"), ("--lr", "inf"), ("--min-lr", "nan"), ("--clip-grad", "nan"), ("--clip-grad", "inf"),
    ("--adam-eps", "nan"), ("--adam-eps", "inf"), ("--weight-decay", "nan"), ("--weight-decay", "inf"),
    ("--init-method-std", "inf"), ("--layernorm-epsilon", "nan"), ("--distributed-timeout-minutes", "inf"),
    ("--exit-duration-in-mins", "inf"),
])
def test_non_finite_float_settings_are_refused(cache, tmp_path, monkeypatch, flag, value):
    """Before: NaN passed every range check (`--clip-grad nan` silently disabled clipping)."""
    no_work(monkeypatch)
    train(cache, tmp_path, f"{flag}={value}").one_error_line(flag, "finite")


def test_a_checkpoint_is_never_written_from_non_finite_master_weights(tmp_path):
    config, state = make_config(), cpu_state()
    model, optimizer, rng = build(config, state, seed=1)
    train_steps(model, optimizer, 1, data_seed=0)
    save_checkpoint(tmp_path / "ck", 1, 8, model, optimizer, rng, config, state)
    before = snapshot(tmp_path / "ck")
    optimizer.master[5] = float("nan")
    with pytest.raises(CheckpointError, match="non-finite"):
        save_checkpoint(tmp_path / "ck", 2, 16, model, optimizer, rng, config, state)
    assert snapshot(tmp_path / "ck") == before  # no iter_0000002, `latest` still at 1


def poison_master(iteration_dir: Path) -> None:
    """Put NaN into the saved fp32 master weights, keeping the checkpoint otherwise consistent."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from checkpoint.integrity import file_digest

    path = iteration_dir / optimizer_file(0, 0)
    with safe_open(str(path), framework="pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
        header = f.metadata()
    tensors["master"][:] = float("nan")
    save_file(tensors, str(path), metadata=header)
    metadata = json.loads((iteration_dir / METADATA_FILE).read_text())
    metadata["file_hashes"][path.name] = file_digest(path)
    (iteration_dir / METADATA_FILE).write_text(json.dumps(metadata))


def test_loading_nan_warns_and_the_diverged_run_stops_in_one_line_saving_nothing(ck, cache, tmp_path):
    """Before: no warning, and a FloatingPointError traceback."""
    poison_master(ck / "iter_0000002")
    before = snapshot(ck)
    outcome = train(cache, tmp_path, "--load", ck, "--save", ck, "--train-iters", "4", "--override-opt_param-scheduler")
    assert re.search(r"holds non-finite values \(NaN or inf\): \d+ in master; training from it will diverge",
                     outcome.out), outcome.out
    # The loaded iter_2 holds NaN: its first loss is out of trend, so it is not named as one to resume.
    line = outcome.one_error_line("iteration 3", "diverged", "the losses left their trend at iteration 3",
                                  "no checkpoint saved before that")
    assert line.startswith("pretrain_gpt.py: error:")
    assert snapshot(ck) == before


def test_a_non_finite_gradient_norm_stops_the_run_unless_fp16_skipped_the_step():
    from training.train_step import TrainingDiverged, check_step_is_finite

    check_step_is_finite(5, 2.5, StepResult(float("inf"), skipped=True, loss_scale=1024.0))
    with pytest.raises(TrainingDiverged, match="iteration 5: loss 2.5, gradient norm nan"):
        check_step_is_finite(5, 2.5, StepResult(float("nan"), skipped=False, loss_scale=1.0))
    with pytest.raises(TrainingDiverged, match="iteration 6: loss inf"):
        check_step_is_finite(6, float("inf"), StepResult(1.0, skipped=False, loss_scale=1.0))


def test_a_skipped_step_with_a_non_finite_loss_is_divergence():
    """Issue 27: a skip is the loss scaler's business only when the forward was finite."""
    from training.train_step import TrainingDiverged, check_skip_limit, check_step_is_finite

    with pytest.raises(TrainingDiverged, match="iteration 7: loss nan"):
        check_step_is_finite(7, float("nan"), StepResult(float("nan"), skipped=True, loss_scale=1024.0))
    check_skip_limit(9, 99, 100, 1.0)
    check_skip_limit(9, 10**6, 0, 1.0)  # 0: no limit
    with pytest.raises(TrainingDiverged, match="100 steps in a row skipped"):
        check_skip_limit(9, 100, 100, 1.0)


def test_fp16_divergence_stops_the_run_and_commits_nothing(cache, tmp_path):
    """Issue 27: with --fp16 --lr 1e9 --clip-grad 0 the loss was NaN from iteration 2, every step was
    logged as a skipped overflow, the run exited 0 and its diverged weights became `latest`."""
    # 2**16: the scale this was written at (a flag launch now starts at Megatron's 2**32, whose first steps
    # overflow and are skipped before the rate can diverge the weights)
    diverging = ["--fp16", "--lr", "1e9", "--clip-grad", "0", "--lr-warmup-iters", "0", "--train-iters", "6",
                 "--initial-loss-scale", "65536", "--save", tmp_path / "ck"]
    # A Megatron launch's default --rerun-mode validate_results re-runs iteration 2's NaN, finds it reproduced and
    # asks for iteration 1's checkpoint (resilience/rerun_state.py): its fp16 weights are inf, so that save is refused
    outcome = train(cache, tmp_path, *diverging, "--save-interval", "3")
    outcome.one_error_line("saving iteration 1 failed", "beyond float16's range", "diverged")
    assert not (tmp_path / "ck" / "latest").exists() and not list((tmp_path / "ck").glob("iter_*"))
    diverging += ["--rerun-mode", "disabled"]  # the divergence check itself
    outcome = train(cache, tmp_path, *diverging, "--save-interval", "3", "--overwrite-save")
    outcome.one_error_line("iteration 2: loss nan", "diverged")
    assert not (tmp_path / "ck" / "latest").exists() and not list((tmp_path / "ck").glob("iter_*"))

    # Saving after iteration 1: the fp32 master (about 1e8) is finite, its fp16 copy is not.
    outcome = train(cache, tmp_path, *diverging, "--save-interval", "1", "--overwrite-save")
    outcome.one_error_line("saving iteration 1 failed", "beyond float16's range", "diverged")
    assert not (tmp_path / "ck" / "latest").exists() and not list((tmp_path / "ck").glob("iter_*"))


def test_an_fp16_run_that_only_skips_stops_at_the_limit(cache, tmp_path):
    """A static scale of 1e30 overflows every backward with a finite loss: before, the run skipped
    every step and exited 0 having trained nothing."""
    outcome = train(cache, tmp_path, "--fp16", "--loss-scale", "1e30", "--train-iters", "8",
                    "--max-consecutive-skipped-iterations", "3", "--save", tmp_path / "ck")
    outcome.one_error_line("iteration 3: 3 steps in a row skipped", "--max-consecutive-skipped-iterations")
    assert not (tmp_path / "ck" / "latest").exists()


# ---- 7. two runs on one save directory -------------------------------------------------------------

def write_lock(directory: Path, host: str, pid: int) -> Path:
    from checkpoint.save_directory import LOCK_FILE

    path = directory / LOCK_FILE
    path.write_text(json.dumps({"host": host, "pid": pid, "started": "earlier", "token": "theirs"}))
    return path


def test_a_second_writer_fails_at_start_and_leaves_the_first_runs_files(ck, cache, tmp_path, monkeypatch):
    """Before: the second run replaced the first's checkpoints and deleted its `.partial` save."""
    partial = ck / "iter_0000003.partial"
    partial.mkdir()
    (partial / model_file(0)).write_bytes(b"being written by the other run")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        write_lock(ck, socket.gethostname(), live.pid)
        before = snapshot(ck)
        no_work(monkeypatch)
        train(cache, tmp_path, "--save", ck, "--load", ck).one_error_line("in use by another run", str(live.pid))
        assert snapshot(ck) == before
    finally:
        live.kill()
        live.wait()


def test_two_runs_cannot_share_a_metrics_file(cache, tmp_path, monkeypatch):
    """Issue 27: two runs given one --metrics-file (different --save) interleaved their records in it
    silently (iterations 1-10 twice). The second is now refused at start, naming the first."""
    metrics = tmp_path / "shared" / "metrics.jsonl"
    first = subprocess.Popen([sys.executable, "pretrain_gpt.py", *TINY, "--data-cache-dir", cache,
                              "--metrics-file", str(metrics), "--train-iters", "100000", "--save", str(tmp_path / "a")],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (metrics.is_file() and metrics_records(metrics)):
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first run logged nothing in 120 s"
            time.sleep(0.2)
        no_work(monkeypatch)
        outcome = run_main(pretrain_gpt.main, TINY + ["--data-cache-dir", cache, "--metrics-file", metrics,
                                                      "--save", tmp_path / "b"])
        outcome.one_error_line(f"--metrics-file {metrics} is in use by another run", f"pid {first.pid}",
                               "pass another --metrics-file")
        assert not (tmp_path / "b" / "latest").exists()
    finally:
        first.kill()
        first.wait()
    iterations = [record["iteration"] for record in metrics_records(metrics) if "iteration" in record]
    assert iterations == sorted(set(iterations)), "records of two runs interleaved"


def test_a_stale_lock_is_taken_over_with_a_message(ck, cache, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    lock = write_lock(ck, socket.gethostname(), gone.pid)
    outcome = train(cache, tmp_path, "--save", ck, "--load", ck, "--train-iters", "3", "--override-opt_param-scheduler")
    assert outcome.code == 0, outcome.err
    assert f"taking over the lock {lock} of pid {gone.pid}" in outcome.out
    assert "is no longer running" in outcome.out
    assert not lock.exists()  # released at the end of the run


def test_a_lock_from_another_host_is_live_until_its_heartbeat_goes_stale(tmp_path):
    from checkpoint.save_directory import SaveDirectoryLock

    path = write_lock(tmp_path, "another-host", 1)
    with pytest.raises(CheckpointError, match="in use by another run .pid 1 on host another-host"):
        SaveDirectoryLock(tmp_path, stale_after_s=60).acquire()
    old = time.time() - 120
    os.utime(path, (old, old))
    messages = []
    with SaveDirectoryLock(tmp_path, log=messages.append, stale_after_s=60) as lock:
        assert json.loads(path.read_text())["token"] == lock.owner["token"]
        assert "no heartbeat for" in messages[0]
    assert not path.exists()


def test_the_lock_heartbeat_keeps_it_fresh(tmp_path):
    from checkpoint.save_directory import SaveDirectoryLock

    with SaveDirectoryLock(tmp_path, heartbeat_s=0.05) as lock:
        old = time.time() - 1000
        os.utime(lock.path, (old, old))
        deadline = time.time() + 10
        while lock.path.stat().st_mtime < time.time() - 100 and time.time() < deadline:
            time.sleep(0.02)
        assert lock.path.stat().st_mtime > time.time() - 100


# ---- 8. integrity ----------------------------------------------------------------------------------

def fresh_model():
    config, state = make_config(), cpu_state()
    return config, state, *build(config, state, seed=2)


@pytest.fixture
def api_checkpoint(tmp_path):
    config, state = make_config(), cpu_state()
    model, optimizer, rng = build(config, state, seed=1)
    train_steps(model, optimizer, 1, data_seed=0)
    return save_checkpoint(tmp_path / "ck", 4, 32, model, optimizer, rng, config, state)


def _load(path):
    _, state, model, optimizer, rng = fresh_model()
    return load_checkpoint(path, model, optimizer, rng, state)


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_the_model_file_is_verified_on_load(api_checkpoint, tmp_path):
    """Before: a missing, truncated or substituted model file was accepted."""
    model_path = api_checkpoint / model_file(0)
    original = model_path.read_bytes()
    model_path.unlink()
    with pytest.raises(CheckpointError, match=re.escape(str(model_path)) + ": missing"):
        _load(api_checkpoint)
    model_path.write_bytes(original[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        _load(api_checkpoint)
    # The same-sized model file of another run: only the content hash tells.
    config, state = make_config(), cpu_state()
    other_model, other_optimizer, other_rng = build(config, state, seed=9)
    other = save_checkpoint(tmp_path / "other", 4, 32, other_model, other_optimizer, other_rng, config, state)
    shutil.copy(other / model_file(0), model_path)
    with pytest.raises(CheckpointError, match="hash mismatch"):
        _load(api_checkpoint)


def test_a_header_dtype_swap_is_refused(api_checkpoint):
    """Before: F32 -> I32 (same width) loaded the bytes as integers."""
    path = api_checkpoint / optimizer_file(0, 0)
    data = path.read_bytes()
    header_length = int.from_bytes(data[:8], "little")
    header = data[8:8 + header_length].replace(b'"F32"', b'"I32"', 1)
    path.write_bytes(data[:8] + header + data[8 + header_length:])
    with pytest.raises(CheckpointError, match="is I32 .*optimizer partitions are flat F32"):
        _load(api_checkpoint)


def test_a_bit_flip_is_caught_by_the_hash_unless_verification_is_off(api_checkpoint):
    path = api_checkpoint / optimizer_file(0, 0)
    _flip_byte(path, path.stat().st_size - 5)
    with pytest.raises(CheckpointError, match=re.escape(path.name) + ".*hash mismatch"):
        _load(api_checkpoint)
    _, state, model, optimizer, rng = fresh_model()
    assert load_checkpoint(api_checkpoint, model, optimizer, rng, state, verify=False).iteration == 4


@pytest.mark.parametrize("where", ["latest", "metadata_name", "symlink"])
def test_names_resolve_inside_the_checkpoint_directory(api_checkpoint, tmp_path, where):
    save_dir = api_checkpoint.parent
    elsewhere = shutil.copytree(api_checkpoint, tmp_path / "elsewhere" / "iter_0000004")
    if where == "latest":
        (save_dir / LATEST_FILE).write_text("../elsewhere/iter_0000004\n")
        match = "not an iteration directory name"
    elif where == "metadata_name":
        metadata = json.loads((api_checkpoint / METADATA_FILE).read_text())
        outside = f"../../elsewhere/iter_0000004/{rng_file(0, 0)}"
        metadata["rng_files"] = [[0, 0, outside]]
        metadata["files"][outside] = metadata["files"][rng_file(0, 0)]
        (api_checkpoint / METADATA_FILE).write_text(json.dumps(metadata))
        match = "corrupt"
    else:
        (api_checkpoint / rng_file(0, 0)).unlink()
        (api_checkpoint / rng_file(0, 0)).symlink_to(elsewhere / rng_file(0, 0))
        match = "points outside the checkpoint directory"
    with pytest.raises(CheckpointError, match=match):
        _load(save_dir)


def test_wrong_typed_metadata_is_one_line(ck, cache, tmp_path, monkeypatch):
    """Before: JSON-valid metadata with wrong types ended in a TypeError traceback."""
    path = ck / "iter_0000002" / METADATA_FILE
    metadata = json.loads(path.read_text())
    metadata["parameters"] = ["not", "a", "table"]
    path.write_text(json.dumps(metadata))
    no_work(monkeypatch)
    train(cache, tmp_path, "--load", ck, "--save", ck).one_error_line(str(path), "'parameters' must be")


@pytest.mark.parametrize("flag, value", [("--seq-length", "8"), ("--seed", "7"), ("--split", "90,10,0")])
def test_a_resume_with_other_data_settings_needs_override(ck, cache, tmp_path, monkeypatch, flag, value):
    """Before: the run resumed silently with samples that do not continue the original sequence."""
    line = train(cache, tmp_path, "--load", ck, "--save", ck, "--train-iters", "3", "--override-opt_param-scheduler", flag, value).one_error_line(
        flag, "--override-data-on-resume")
    assert "the checkpoint's" in line
    outcome = train(cache, tmp_path, "--load", ck, "--save", ck, "--train-iters", "3", "--override-opt_param-scheduler", flag, value,
                    "--override-data-on-resume")
    assert outcome.code == 0, outcome.err
    assert "as --override-data-on-resume allows" in outcome.out


# ---- 9. one line everywhere --------------------------------------------------------------------------

def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("case", ["yaml_not_utf8", "yaml_nested", "json_not_utf8", "json_nested", "latest_not_utf8",
                                  "device", "seed"])
def test_malformed_inputs_are_one_line(ck, cache, tmp_path, monkeypatch, case):
    """Before: each was a traceback."""
    preset, zero_json = tmp_path / "preset.yaml", tmp_path / "zero.json"
    argv = {
        "yaml_not_utf8": ["--config", preset], "yaml_nested": ["--config", preset],
        "json_not_utf8": ["--zero-config", zero_json], "json_nested": ["--zero-config", zero_json],
        "latest_not_utf8": ["--load", ck, "--save", ck], "device": ["--device", "foo"], "seed": ["--seed", "-1"],
    }[case]
    preset.write_bytes(b"num_layers: 1\nhidden_size: \xff\xfe\n" if case == "yaml_not_utf8"
                       else f"num_layers: {nested(5000)}\n".encode())
    zero_json.write_bytes(b'{"gradient_clipping": "\xff"}' if case == "json_not_utf8" else nested(100000).encode())
    if case == "latest_not_utf8":
        (ck / LATEST_FILE).write_bytes(b"iter_\xff\xfe\n")
    no_work(monkeypatch)
    train(cache, tmp_path, *argv).one_error_line()


def test_disk_full_inside_a_tool_is_one_line(ck, tmp_path, monkeypatch):
    """Before: safetensors reports ENOSPC as its own error type, which escaped as a traceback."""
    import safetensors.torch
    from safetensors import SafetensorError

    def disk_full(*args, **kwargs):
        raise SafetensorError(f"Error while serializing: IoError({os.strerror(errno.ENOSPC)})")

    monkeypatch.setattr(safetensors.torch, "save_file", disk_full)
    run_main(zero_to_fp32.main, [ck, tmp_path / "out.safetensors"]).one_error_line("No space left on device")
    assert not (tmp_path / "out.safetensors").exists()
    run_main(reshard_checkpoint.main, [ck, tmp_path / "tp2", "--tensor-model-parallel-size", "2"]).one_error_line(
        "No space left on device")


def interrupt_at_iteration(metrics: Path, iteration: int, signum: int) -> threading.Thread:
    """Send `signum` to this process once the run has logged `iteration`."""
    def watch():
        deadline = time.time() + 120
        while time.time() < deadline:
            if metrics.exists() and any(r.get("iteration", 0) >= iteration for r in metrics_records(metrics)):
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def terminal_sigint():
    """SIGINT as a terminal's Python has it (KeyboardInterrupt). A suite started in the background
    (nohup, `cmd &` in a script) inherits SIGINT ignored, and Python then installs no handler, so
    the Ctrl-C tests would test the launcher rather than the run."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_without_the_handler_is_one_line_and_status_130(cache, tmp_path, terminal_sigint):
    """Before: a KeyboardInterrupt traceback."""
    watcher = interrupt_at_iteration(tmp_path / "metrics.jsonl", 2, signal.SIGINT)
    outcome = train(cache, tmp_path, "--train-iters", "400", "--save", tmp_path / "ck")
    watcher.join()
    assert outcome.code == 130 and len(outcome.err_lines) == 1 and "Traceback" not in outcome.err, outcome.err
    assert "interrupted (SIGINT)" in outcome.err
    assert not (tmp_path / "ck" / LATEST_FILE).exists()


def test_ctrl_c_with_the_handler_saves_and_exits_zero(cache, tmp_path, terminal_sigint):
    """Before: a KeyboardInterrupt traceback and no save, even with --exit-signal-handler."""
    watcher = interrupt_at_iteration(tmp_path / "metrics.jsonl", 2, signal.SIGINT)
    outcome = train(cache, tmp_path, "--train-iters", "400", "--save", tmp_path / "ck", "--exit-signal-handler")
    watcher.join()
    assert outcome.code == 0, outcome.err
    stopped = max(r["iteration"] for r in metrics_records(tmp_path / "metrics.jsonl"))
    assert f"exiting after iteration {stopped}: received SIGINT" in outcome.out
    assert resolve_checkpoint(tmp_path / "ck").name == f"iter_{stopped:07d}"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def launcher(tmp_path: Path, *argv, gpus: int = 2, **popen) -> subprocess.Popen:
    env = dict(os.environ, GPUS_PER_NODE=str(gpus), WANDB_MODE="disabled",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.Popen(["bash", str(REPO / "scripts" / "launch_single_node.sh"), *map(str, argv)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.slow
def test_under_torchrun_one_rank_prints_and_the_launcher_forwards_the_status(cache, tmp_path):
    """Before: every rank printed the error, torchrun added its traceback and exited 1. The preset is a
    path relative to the caller's directory: the launcher keeps it (it used to cd into the repo, where
    the preset was "no such file")."""
    (tmp_path / "mine.yaml").write_text("num_layers: 2\n")
    process = launcher(tmp_path, "--config", "mine.yaml", "--device", "cpu", "--lr", "nan", "--data-cache-dir", cache)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 2, (out, err)
    assert err.splitlines() == ["pretrain_gpt.py: error: --lr must be a finite number, got nan"], (out, err)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_through_the_launcher_saves_and_exits_zero(cache, tmp_path, signum):
    """A scheduler's SIGTERM, or Ctrl-C at the terminal (torchrun starts the ranks in their own
    sessions, so only the launcher gets it and forwards it). Before: the ranks saved, then torchrun
    exited 1 with its own traceback."""
    from tests.reliability_helpers import TINY

    metrics = tmp_path / "metrics.jsonl"
    process = launcher(tmp_path, *TINY, "--train-iters", "2000", "--global-batch-size", "4", "--data-cache-dir", cache,
                       "--metrics-file", metrics, "--save", tmp_path / "ck", "--exit-signal-handler")
    try:
        deadline = time.time() + 240
        while not (metrics.exists() and metrics_records(metrics)) and time.time() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.1)
        process.send_signal(signum)  # the launcher itself, as `kill`, a scheduler or a terminal would
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err and f"received {signal.Signals(signum).name}" in out, (out, err)
    assert resolve_checkpoint(tmp_path / "ck").name.startswith("iter_")


def training_losses(metrics: Path) -> dict[int, float]:
    return {record["iteration"]: record["loss"] for record in metrics_records(metrics) if "loss" in record}


@pytest.mark.slow
def test_sigusr1_to_the_launchers_process_group_saves_exits_zero_and_the_resume_continues_exactly(cache, tmp_path):
    """Issue 47, item 1. SLURM's `--signal=USR1@120` signals every process of the job step: here the
    launcher's process group (twice, as a scheduler that repeats itself would) and each rank's own (torchrun
    starts the ranks in sessions of their own), so every rank gets SIGUSR1 directly and forwarded, under
    PP 2 x DP 2. Before: torchrun does not handle SIGUSR1 (torch/distributed/run.py, --signals_to_handle
    defaults to SIGTERM,SIGINT,SIGHUP,SIGQUIT), so the launcher died of it (status 138) with the
    rendezvous store it serves, and the ranks stopped on "the rendezvous store ... stopped answering"
    without saving. Now: one save at the iteration the ranks agreed on, exit 0, and a resume from it
    logs the uninterrupted run's losses exactly (fp32, no dropout)."""
    run = [*TINY, "--num-layers", "2", "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1",
           "--global-batch-size", "4", "--train-iters", "2000", "--exit-interval", "40", "--data-cache-dir", cache]
    reference, stopped_run, resumed = tmp_path / "reference.jsonl", tmp_path / "stopped.jsonl", tmp_path / "resumed.jsonl"
    save = tmp_path / "ck"

    # The uninterrupted run only gives the losses to continue to: its 4 ranks are forked (tests/forked_runs.py), one
    # thread each as under the launcher, which the signalled run and its resume go through.
    logged_iterations(tmp_path, reference.stem, run, 4)
    expected = training_losses(reference)
    assert sorted(expected) == list(range(1, 41)), sorted(expected)

    process = launcher(tmp_path, *run, "--metrics-file", stopped_run, "--save", save, "--exit-signal-handler", gpus=4,
                       start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (stopped_run.exists() and metrics_records(stopped_run)):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        ranks = [int(pid) for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()]
        assert len(ranks) == 4, ranks
        os.killpg(process.pid, signal.SIGUSR1)
        for rank in ranks:
            os.killpg(rank, signal.SIGUSR1)
        time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):  # it may be gone already: that is for the asserts below
            os.killpg(process.pid, signal.SIGUSR1)
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, (out[-3000:], err)
    assert "Traceback" not in err and err.strip() == "", err
    stopped = max(training_losses(stopped_run))
    assert stopped < 40, "the run reached its exit interval before the signal"
    assert out.count("saving checkpoint at") == 1 and f"exiting after iteration {stopped}: received SIGUSR1" in out, out
    assert resolve_checkpoint(save).name == f"iter_{stopped:07d}"

    process = launcher(tmp_path, *run, "--metrics-file", resumed, "--save", save, "--load", save, gpus=4)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, (out[-3000:], err)
    losses = {**training_losses(stopped_run), **training_losses(resumed)}
    assert min(training_losses(resumed)) == stopped + 1
    assert losses == expected  # exactly: the same fp32 arithmetic in the same order


@pytest.mark.parametrize("kind", ["FIFO", "/dev/zero"])
def test_a_zero_config_that_is_not_a_regular_file_is_one_line(kind, tmp_path):
    """Issue 27, problem 7: --zero-config naming a FIFO blocked forever, and /dev/zero was read until
    memory ran out. Both are now refused by what they are, before anything is read."""
    if kind == "FIFO":
        path = tmp_path / "ds.json"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    result = subprocess.run([sys.executable, "pretrain_gpt.py", *TINY, "--zero-config", str(path),
                             "--metrics-file", str(tmp_path / "m.jsonl")],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "--zero-config" in lines[0] and str(path) in lines[0], lines[0]
    assert not (tmp_path / "m.jsonl").exists()
