"""A path read from a checkpoint must lie inside it, and every reader refuses one that does not (issue 47,
"Nothing lost, round 4", items 2 and 3): checkpoint/inside.py's `inside` is the one check.

Before it, a symbolic link in `tokenizer/` was followed: `convert_to_hf.py` exited 0 with the outside file copied
into the export, and `--load` and `zero_to_fp32.py` accepted the checkpoint; a `metadata.json` linked outside was
read by all three. The walk below takes a PP 2 checkpoint saved with optimizer offload, links each of its files
out in turn (to an identical copy, so only the link is wrong) and runs every reader on it: `--load` (in process,
through pretrain_gpt.main as a launch runs it), convert_to_hf.py, zero_to_fp32.py and reshard_checkpoint.py. Each
refuses in one line naming the file, exit 2, and none writes anything.

The real pair: Megatron-LM reads whatever `latest_checkpointed_iteration.txt` and the paths it builds lead to
(megatron/training/checkpointing.py, read_metadata / get_checkpoint_name), and transformers' save_pretrained copies
tokenizer files as found (tokenization_utils_base.py, save_pretrained); neither refuses a link. The project's
rule is stricter (docs/checkpoints.md, "Safety and integrity": links out are refused), and this is its test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pretrain_gpt
from scripts.tools import convert_to_hf, reshard_checkpoint, zero_to_fp32
from tests.distributed import run_distributed
from tests.readme import ROOT as REPO_ROOT
from tests.reliability_helpers import run_main

# Two blocks over two stages, optimizer states on the host (ZeRO 2 offload), two iterations.
FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
         "--train-iters", "2", "--eval-iters", "0", "--log-interval", "1", "--tokenizer-vocab-size", "512",
         "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "1"]
SAVE_FLAGS = ["--pipeline-model-parallel-size", "2", "--zero-stage", "2", "--offload-optimizer",
              "--sub-group-size", "500"]


def _save_at_pp2_with_offload(rank: int, world_size: int, cache: str, save: str, metrics: str) -> None:
    assert pretrain_gpt.main([*FLAGS, *SAVE_FLAGS, "--data-cache-dir", cache, "--save", save,
                              "--metrics-file", metrics]) == 0


@pytest.fixture(scope="module")
def pp2_offload_checkpoint(corpus_cache, tmp_path_factory) -> Path:
    """A save directory: `latest`, iter_0000002 with both stages' model, optimizer and RNG files, metadata.json
    and the run's tokenizer/ (tokenizer.json, vocab.json, merges.txt, tokenizer_config.json). Read-only."""
    work = tmp_path_factory.mktemp("links-pp2-offload")
    run_distributed(_save_at_pp2_with_offload, 2, corpus_cache, str(work / "ck"), str(work / "metrics.jsonl"),
                    timeout=300)
    return work / "ck"


def _files(save_dir: Path) -> list[Path]:
    """Every regular file the checkpoint holds, relative to the save directory."""
    return sorted(path.relative_to(save_dir) for path in save_dir.rglob("*") if path.is_file())


def _linked_out(source: Path, relative: Path, work: Path) -> Path:
    """A copy of the save directory `source` in `work` whose file `relative` is a symbolic link to an identical
    copy outside it; returns the copy's save directory."""
    save_dir = Path(shutil.copytree(source, work / "ck"))
    outside = work / "outside" / relative.name
    outside.parent.mkdir()
    shutil.copyfile(save_dir / relative, outside)
    (save_dir / relative).unlink()
    (save_dir / relative).symlink_to(outside)
    return save_dir


def _refused_in_one_line(outcome, linked: Path) -> None:
    assert outcome.code == 2, (outcome.code, outcome.err[-2000:])
    assert len(outcome.err_lines) == 1 and "Traceback" not in outcome.err, outcome.err
    assert str(linked) in outcome.err and "points outside the checkpoint" in outcome.err, outcome.err


def _load(save_dir: Path, cache: str, work: Path, monkeypatch):
    """`--load` as a launch runs it (pretrain_gpt.main, one process: any pipeline size loads a PP 2 checkpoint);
    data preparation fails the test, as the refusal must come before it."""
    def forbidden(*args, **kwargs):
        raise AssertionError("data preparation started although the run should have been refused")

    monkeypatch.setattr("training.prepare.build_data", forbidden)
    return run_main(pretrain_gpt.main, [*FLAGS, "--data-cache-dir", cache, "--load", save_dir,
                                        "--metrics-file", work / "load.jsonl"])


def _every_reader_refuses(save_dir: Path, linked: Path, cache: str, work: Path, monkeypatch) -> None:
    _refused_in_one_line(_load(save_dir, cache, work, monkeypatch), linked)
    hf, fp32, resharded = work / "hf", work / "fp32.safetensors", work / "resharded"
    _refused_in_one_line(run_main(convert_to_hf.main, [save_dir, hf]), linked)
    _refused_in_one_line(run_main(zero_to_fp32.main, [save_dir, fp32]), linked)
    _refused_in_one_line(run_main(reshard_checkpoint.main, [save_dir, resharded, "--tensor-model-parallel-size",
                                                            "1"]), linked)
    # Nothing exported, nothing staged beside the outputs; the refused run wrote no metrics record.
    assert sorted(path.name for path in work.iterdir() if path.name != "load.jsonl") == ["ck", "outside"]
    assert not (work / "load.jsonl").exists() or (work / "load.jsonl").read_text() == ""


def test_every_file_linked_out_in_turn_is_refused_by_every_reader(pp2_offload_checkpoint, corpus_cache, tmp_path,
                                                                 monkeypatch):
    """The acceptance walk: each file of the PP 2 offload checkpoint, linked out in turn."""
    files = _files(pp2_offload_checkpoint)
    names = {str(path) for path in files}
    # What the walk covers: `latest`, Megatron's tracker file, metadata.json, both stages' tensor files, and the
    # tokenizer's files.
    assert {"latest", "latest_checkpointed_iteration.txt", "iter_0000002/metadata.json",
            "iter_0000002/tokenizer/vocab.json", "iter_0000002/model_pp001_tp00.safetensors",
            "iter_0000002/optim_pp001_tp00_dp000.safetensors"} <= names
    assert len(files) == 13, names
    for number, relative in enumerate(files):
        work = tmp_path / str(number)
        work.mkdir()
        save_dir = _linked_out(pp2_offload_checkpoint, relative, work)
        _every_reader_refuses(save_dir, save_dir / relative, corpus_cache, work, monkeypatch)


def test_a_tokenizer_file_linked_outside_is_neither_exported_nor_accepted(pp2_offload_checkpoint, corpus_cache,
                                                                         tmp_path, monkeypatch):
    """Issue 47, item 2. Before: convert_to_hf.py exited 0 and copied the outside vocab.json into the export, and
    --load, zero_to_fp32.py and reshard_checkpoint.py accepted the checkpoint. A link that stays inside the
    checkpoint (to a sibling of the tokenizer folder) is not refused: the export carries that file's content."""
    relative = Path("iter_0000002/tokenizer/vocab.json")
    save_dir = _linked_out(pp2_offload_checkpoint, relative, tmp_path)
    _every_reader_refuses(save_dir, save_dir / relative, corpus_cache, tmp_path, monkeypatch)

    sibling = save_dir / "iter_0000002" / "vocab-original.json"
    shutil.move(tmp_path / "outside" / "vocab.json", sibling)
    (save_dir / relative).unlink()
    (save_dir / relative).symlink_to("../vocab-original.json")
    outcome = run_main(convert_to_hf.main, [save_dir, tmp_path / "hf"])
    assert outcome.code == 0, outcome.err
    assert (tmp_path / "hf" / "vocab.json").read_bytes() == sibling.read_bytes()
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


def test_a_folder_linked_outside_is_refused_by_every_reader(pp2_offload_checkpoint, corpus_cache, tmp_path,
                                                            monkeypatch):
    """Each component is resolved, not only the whole file: the iteration directory `latest` names, or the
    tokenizer folder, moved outside and linked back, is refused although every file in it is intact. Before, a
    linked iteration directory was read by every reader (a linked tokenizer folder was already refused)."""
    for number, folder in enumerate(("iter_0000002", "iter_0000002/tokenizer")):
        work = tmp_path / str(number)
        save_dir = Path(shutil.copytree(pp2_offload_checkpoint, work / "ck"))
        (work / "outside").mkdir()
        shutil.move(save_dir / folder, work / "outside" / Path(folder).name)
        (save_dir / folder).symlink_to(work / "outside" / Path(folder).name, target_is_directory=True)
        _every_reader_refuses(save_dir, save_dir / folder, corpus_cache, work, monkeypatch)


def test_a_metadata_file_linked_outside_is_refused_by_a_real_load_launch(pp2_offload_checkpoint, corpus_cache,
                                                                        tmp_path, monkeypatch):
    """Issue 47, item 3. Before: --load, convert_to_hf.py and zero_to_fp32.py read the outside metadata.json.
    Here --load is a real launch (python pretrain_gpt.py): one line on stderr, exit 2."""
    relative = Path("iter_0000002/metadata.json")
    save_dir = _linked_out(pp2_offload_checkpoint, relative, tmp_path)
    linked = save_dir / relative
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    launch = subprocess.run([sys.executable, str(REPO_ROOT / "pretrain_gpt.py"), *FLAGS, "--data-cache-dir",
                             corpus_cache, "--load", str(save_dir), "--metrics-file", str(tmp_path / "launch.jsonl")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert launch.returncode == 2, (launch.returncode, launch.stderr[-2000:])
    lines = launch.stderr.splitlines()
    assert len(lines) == 1 and str(linked) in lines[0] and "points outside the checkpoint" in lines[0], launch.stderr
    for main, out in ((convert_to_hf.main, tmp_path / "hf"), (zero_to_fp32.main, tmp_path / "fp32.safetensors")):
        _refused_in_one_line(run_main(main, [save_dir, out]), linked)
        assert not out.exists()
