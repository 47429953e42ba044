"""Whether a path read from a checkpoint lies inside it: the one check every reader makes. A symbolic link in a
checkpoint can point anywhere; `inside` refuses any component that resolves outside the checkpoint's root, so every
reader and tool refuses the same things in the same words.
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
    directory = inside(root, folder)
    if not directory.is_dir():
        return []
    return [inside(root, folder, entry.name) for entry in sorted(directory.iterdir())]


def folder_files(root: Path, folder: str) -> list[Path]:
    """The files directly in `root / folder` (a tokenizer/), each checked with `inside`, in name order; sub-folders are
    left out."""
    if not inside(root, folder).is_dir():
        raise CheckpointError(f"{root / folder}: missing from the checkpoint")
    return [path for path in _entries(root, folder) if path.is_file()]


def check_named_paths(iteration_dir: Path, names: list[str], tokenizer: str | None) -> None:
    """Every file the metadata names, and the tokenizer folder's entries, lie inside `iteration_dir`; existence is
    checked elsewhere."""
    for name in names:
        inside(iteration_dir, name)
    if tokenizer is not None:
        _entries(iteration_dir, tokenizer)
