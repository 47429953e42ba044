"""Everything a run writes gets the permissions the umask gives (0644 files, 0755 directories under
the usual 022), not the 0600/0700 that safetensors and tempfile create, so teammates can read the
checkpoints, exports and shared data caches."""

import os
import stat

import pytest

import pretrain_gpt
from base.file_modes import current_umask
from scripts.tools import convert_to_hf

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
         "--train-iters", "2", "--eval-iters", "0", "--tokenizer-vocab-size", "300", "--device", "cpu"]


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)  # group may read, others may not: a value no writer has by accident
    try:
        yield 0o027
    finally:
        os.umask(previous)


def modes(root):
    """{relative path: permission bits} of everything under `root`."""
    found = {}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = os.path.join(directory, name)
            found[os.path.relpath(path, root)] = stat.S_IMODE(os.stat(path).st_mode)
    return found


def expected_mode(path, umask):
    return (0o777 if os.path.isdir(path) else 0o666) & ~umask


@pytest.mark.smoke
def test_umask_is_read_without_changing_it(umask_027):
    assert current_umask() == 0o027
    assert current_umask() == 0o027


def test_checkpoint_export_and_caches_follow_the_umask(tmp_path, umask_027):
    cache, save, export = tmp_path / "cache", tmp_path / "ckpt", tmp_path / "hf"
    code = pretrain_gpt.main(SMALL + ["--data-cache-dir", str(cache), "--save", str(save),
                                      "--metrics-file", str(tmp_path / "m.jsonl")])
    assert code == 0
    assert convert_to_hf.main([str(save), str(export)]) == 0
    written = {}
    for root in (cache, save, export):
        written.update({os.path.join(root, path): mode for path, mode in modes(root).items()})
    assert any(path.endswith(".safetensors") for path in written)
    assert any(path.endswith("_index.npy") for path in written)  # the dataset's index cache
    wrong = {path: oct(mode) for path, mode in written.items() if mode != expected_mode(path, umask_027)}
    assert not wrong, wrong
