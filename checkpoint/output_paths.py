"""Output paths checked before any work: created, tested for writability, never a checkpoint's inside, so a mistake
costs a second at start rather than a run. Failures are `ConfigError`s naming the flag and the path.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from base.errors import ConfigError
from checkpoint.format import METADATA_FILE, fsync_path, is_save_directory


def prepare_output_directory(path: str | os.PathLike, flag: str) -> Path:
    """Create `path` (and its parents) if missing and prove a file can be written in it."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file; it must be a directory (created if missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigError(f"{flag} {path}: cannot write there ({error.strerror or error}); "
                          f"choose a writable directory") from None
    return path


def prepare_output_file(path: str | os.PathLike, flag: str) -> Path:
    """Create the parent of `path` and open `path` for appending, so an unwritable file fails now; existing bytes are
    kept."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a directory; it must name a file")
    if path.parent.exists() and not path.parent.is_dir():
        raise ConfigError(f"{flag} {path}: {path.parent} is a file, so nothing can be written under it")
    prepare_output_directory(path.parent, flag)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as error:
        raise ConfigError(f"{flag} {path}: cannot write it ({error.strerror or error}); "
                          f"choose a writable path") from None
    return path


def checkpoint_holding(path: str | os.PathLike, include_self: bool = False) -> Path | None:
    """The nearest directory above `path` (or at it, with `include_self`) that is a checkpoint or a save directory, or
    None."""
    path = Path(path).resolve()
    for directory in ([path] if include_self else []) + list(path.parents):
        if (directory / METADATA_FILE).is_file() or is_save_directory(directory):
            return directory
    return None


def refuse_inside_checkpoint(path: str | os.PathLike, flag: str, include_self: bool = False) -> None:
    """Tools write beside checkpoints, never into one; with `include_self`, `path` must not be one either."""
    holder = checkpoint_holding(path, include_self)
    if holder is not None:
        where = "is" if holder == Path(path).resolve() else "is inside"
        raise ConfigError(f"{flag} {path} {where} the checkpoint directory {holder}; write it somewhere else")


def refuse_training_output_in_checkpoint(path: str | os.PathLike, flag: str, save_directory: bool = False) -> None:
    """A run's outputs go beside checkpoints, never into one (a `latest` inside an iteration directory would redirect a
    later --load); --save may itself be a save directory."""
    resolved = Path(path).resolve()
    for directory in [resolved] + list(resolved.parents):
        inside = "is" if directory == resolved else "is inside"
        if (directory / METADATA_FILE).is_file():
            raise ConfigError(f"{flag} {path} {inside} the checkpoint {directory}; a run writes beside "
                              f"checkpoints, never into one: choose another {flag}")
        if save_directory and directory != resolved and is_save_directory(directory):
            raise ConfigError(f"{flag} {path} is inside the save directory {directory}; pass --save {directory} "
                              f"to save there, or choose a directory outside it")


def refuse_existing(path: str | os.PathLike, flag: str, overwrite: bool) -> None:
    """An output that exists is replaced only when the user said --overwrite."""
    path = Path(path)
    if overwrite or not path.exists():
        return
    if path.is_dir() and not any(path.iterdir()):
        return  # an empty directory holds nothing to lose
    raise ConfigError(f"{flag} {path} already exists; pass --overwrite to replace it, or choose another path")


MAX_NAMED = 5  # foreign entries named in one refusal before "... and N more"


def foreign_entries(folder: Path, owned_names: frozenset[str]) -> list[str]:
    """The entries of `folder` a tool writing `owned_names` did not write (an owned name that is not a regular file
    too)."""
    return sorted(entry.name + ("/" if entry.is_dir() else "") for entry in folder.iterdir()
                  if entry.name not in owned_names or entry.is_symlink() or not entry.is_file())


def check_replaceable_folder(folder: Path, owned_names: frozenset[str], overwrite: bool, flag: str) -> None:
    """`folder` may be absent or empty; with --overwrite it may also hold the tool's own files, and nothing else: a
    user's other files are refused by name, never touched."""
    if folder.is_symlink() and not folder.exists():  # renaming the finished folder onto it would fail at the end
        raise ConfigError(f"{flag} {folder} is a symbolic link to nothing (to {os.readlink(folder)}); remove it or "
                          f"choose another path")
    if not folder.exists():
        return
    if not folder.is_dir():
        raise ConfigError(f"{flag} {folder} exists and is not a directory")
    entries = list(folder.iterdir())
    if not entries:
        return
    if not overwrite:
        raise ConfigError(f"{flag} {folder} exists and is not empty; pass --overwrite to replace the files this "
                          f"tool wrote there, or choose another path")
    foreign = foreign_entries(folder, owned_names)
    if foreign:
        named = ", ".join(foreign[:MAX_NAMED]) + (f" and {len(foreign) - MAX_NAMED} more" if len(foreign) > MAX_NAMED
                                                  else "")
        raise ConfigError(f"{flag} {folder} holds files this tool did not write ({named}); --overwrite replaces "
                          f"only {', '.join(sorted(owned_names))}: move the others away or choose another path")


def install_folder(staging: Path, folder: Path, owned_names: frozenset[str]) -> None:
    """Put the fully written `staging` at `folder`: an existing one is renamed aside, emptied of the owned files only,
    and removed only if that leaves it empty."""
    for path in staging.iterdir():
        if path.is_file():
            fsync_path(path)
    fsync_path(staging)
    if not folder.exists():
        os.replace(staging, folder)
        fsync_path(folder.parent)
        return
    check_replaceable_folder(folder, owned_names, overwrite=True, flag="OUT_DIR")
    retired = folder.with_name(f".{folder.name}.replaced-{os.getpid()}")
    os.replace(folder, retired)
    os.replace(staging, folder)
    fsync_path(folder.parent)
    for entry in retired.iterdir():
        if entry.name in owned_names and entry.is_file() and not entry.is_symlink():
            entry.unlink()
    try:
        retired.rmdir()
    except OSError:  # something appeared in the old folder meanwhile: keep it, and say where
        print(f"note: {retired} kept: it holds files that appeared while {folder} was replaced", flush=True)


def check_output_directory(path: str | os.PathLike, flag: str) -> Path:
    """What `prepare_output_directory` would find, creating nothing, for commands that check every input first."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} exists and is not a directory; it must be a directory (created if missing)")
    ancestor = path.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(f"{flag} {path}: {ancestor} is a file, so no directory can be made under it")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: cannot write in {ancestor}; choose a writable directory")
    return path
