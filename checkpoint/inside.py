"""Whether a path read from a checkpoint lies inside it: the one check every reader makes.

A checkpoint is read through names it holds itself: `latest` names an iteration directory,
metadata.json names the tensor files, the pipeline stages' files and the tokenizer folder, and that
folder holds the tokenizer files. A symbolic link among them can point anywhere, and a reader that
followed one would load, or copy into an export, a file that was never part of the checkpoint.

`inside(root, *names)` is `root / names...` once each component, from the first name down, resolves
(every link followed) to `root`'s resolved path or below it: a link to a sibling inside the
checkpoint is fine, a link that leaves -- the file, a folder on the way, metadata.json, `latest`, the
iteration directory -- is a `CheckpointError` naming the path and where it leads. The root itself is
whatever the user named (a `--save` directory or one iteration directory), links and all.

Every reader goes through it: `resolve_checkpoint` for `latest` and the iteration directory,
`read_metadata` for metadata.json and every path the metadata names (`check_named_paths`), `member`
for each tensor file opened, and the tokenizer copies of the HF export and of resharding
(`folder_files`). So `--load`, scripts/tools/convert_to_hf.py, scripts/tools/zero_to_fp32.py and
scripts/tools/reshard_checkpoint.py refuse the same things in the same words.
"""

from __future__ import annotations

from pathlib import Path

from base.errors import CheckpointError


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError) as error:  # a link loop: RuntimeError before Python 3.13, OSError after
        raise CheckpointError(f"{path}: cannot be resolved ({error}); a checkpoint's files must lie inside it") \
            from None


def inside(root: Path, *names: str) -> Path:
    """`root / names[0] / names[1] ...`, refused unless each component resolves inside `root`."""
    root = Path(root)
    top = _resolved(root)
    path = root
    for name in names:
        path = path / name
        target = _resolved(path)
        if not target.is_relative_to(top):
            raise CheckpointError(f"{path} points outside the checkpoint directory {root} (to {target}); a checkpoint's "
                                  f"files must lie inside it")
    return path


def _entries(root: Path, folder: str) -> list[Path]:
    """Each entry of `root / folder` (when it is a folder), checked with `inside`, in name order."""
    directory = inside(root, folder)
    if not directory.is_dir():
        return []
    return [inside(root, folder, entry.name) for entry in sorted(directory.iterdir())]


def folder_files(root: Path, folder: str) -> list[Path]:
    """The files directly in `root / folder` (a checkpoint's tokenizer/), the folder and each entry
    checked with `inside`, in name order. Sub-folders are not part of a saved tokenizer and are left out."""
    if not inside(root, folder).is_dir():
        raise CheckpointError(f"{root / folder}: missing from the checkpoint")
    return [path for path in _entries(root, folder) if path.is_file()]


def check_named_paths(iteration_dir: Path, names: list[str], tokenizer: str | None) -> None:
    """Every file the metadata names (`names`) and, when it has one, the tokenizer folder and each
    entry in it: all inside `iteration_dir`. Existence is not checked here: verification names a
    missing file, and the readers of the tokenizer a missing folder."""
    for name in names:
        inside(iteration_dir, name)
    if tokenizer is not None:
        _entries(iteration_dir, tokenizer)
