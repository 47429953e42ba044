"""What a checkpoint's `metadata.json`, `latest` and Megatron's tracker file may contain, checked
before anything trusts them.

JSON that parses can still be wrong: a string where an iteration count belongs, a parameter table
that is a list, or a file name such as `../../elsewhere` or `/etc/passwd`. Every such value is a
`CheckpointError` naming metadata.json and the entry, raised before any file is opened, and every
name a checkpoint uses must be a plain file name (`member`); that it resolves inside the iteration
directory, links followed, is checkpoint/inside.py's check, so neither `latest` nor the metadata can
point a load, or a tool's write, elsewhere.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

from base.errors import CheckpointError
from checkpoint.inside import inside

# `latest` names an iteration directory and nothing else.
ITERATION_NAME = re.compile(r"iter_\d{7,}")
# Bytes of `latest` worth reading: its content is one short name.
LATEST_MAX_BYTES = 256
PRECISIONS = ("fp32", "bf16", "fp16")
# A run's lineage and launch ids (checkpoint/lineage.py): uuid4().hex.
IDENTITY = re.compile(r"[0-9a-f]{32}")


def _is_int(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_plain_name(value: Any) -> bool:
    return (isinstance(value, str) and value not in ("", ".", "..") and "/" not in value and "\\" not in value
            and "\x00" not in value)


def _list_of(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, list) and all(check(item) for item in value)


def _parameter_entry(entry: Any) -> bool:
    if not isinstance(entry, dict) or not _list_of(_is_int)(entry.get("shape")):
        return False
    dim = entry.get("tensor_parallel_dim")
    return dim is None or (_is_int(dim) and dim < len(entry["shape"]))


def _shard(entry: Any) -> bool:  # [tp rank, dp rank, file name]
    return (isinstance(entry, list) and len(entry) == 3 and _is_int(entry[0]) and _is_int(entry[1])
            and _is_plain_name(entry[2]))


def _model_entry(entry: Any) -> bool:  # [tp rank, file name]
    return isinstance(entry, list) and len(entry) == 2 and _is_int(entry[0]) and _is_plain_name(entry[1])


def _pipeline_stage(entry: Any) -> bool:  # {parameters: [names], files: [file names]}
    return (isinstance(entry, dict) and _list_of(lambda name: isinstance(name, str))(entry.get("parameters"))
            and _list_of(_is_plain_name)(entry.get("files")))


# Entry -> (what it must be, in words; the check). Entries every save writes come first.
REQUIRED = {
    "iteration": ("a non-negative integer", _is_int),
    "consumed_samples": ("a non-negative integer", _is_int),
    "tensor_parallel_size": ("a positive integer", lambda v: _is_int(v, 1)),
    "data_parallel_size": ("a positive integer", lambda v: _is_int(v, 1)),
    "zero_stage": ("0, 1, 2 or 3", lambda v: _is_int(v) and v <= 3),
    "adam_step": ("a non-negative integer", _is_int),
    "parameters": ("an object of {shape, tensor_parallel_dim} entries",
                   lambda v: isinstance(v, dict) and all(isinstance(k, str) and _parameter_entry(e)
                                                         for k, e in v.items())),
    "optimizer_shards": ("a list of [tp rank, dp rank, file name]", _list_of(_shard)),
    "files": ("an object of file name -> size in bytes",
              lambda v: isinstance(v, dict) and all(_is_plain_name(k) and _is_int(n) for k, n in v.items())),
}
OPTIONAL = {
    "precision": (f"one of {', '.join(PRECISIONS)}", lambda v: v in PRECISIONS),
    "lr": ("a number or null", lambda v: v is None or _is_number(v)),
    "loss_scaler": ("an object or null",
                    lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("state", {}), dict))),
    "model_files": ("a list of [tp rank, file name]", _list_of(_model_entry)),
    "rng_files": ("a list of [tp rank, dp rank, file name]", _list_of(_shard)),
    "pipeline_parallel_size": ("a positive integer", lambda v: _is_int(v, 1)),
    "pipeline_stages": ("a list of {parameters: [names], files: [file names]}, one per stage",
                        _list_of(_pipeline_stage)),
    "tokenizer": ("a directory name or null", lambda v: v is None or _is_plain_name(v)),
    "config": ("an object of config sections", lambda v: isinstance(v, dict)
               and all(isinstance(section, dict) for section in v.values())),
    "run_id": ("a lineage id (32 hex digits)", lambda v: isinstance(v, str) and IDENTITY.fullmatch(v) is not None),
    "launch_id": ("a launch id (32 hex digits)", lambda v: isinstance(v, str) and IDENTITY.fullmatch(v) is not None),
    "data_identity": ("a list of dataset objects or null",
                      lambda v: v is None or (isinstance(v, list) and all(isinstance(e, dict) for e in v))),
    "file_hashes": ("an object of file name -> 'algorithm:hex digest'",
                    lambda v: isinstance(v, dict) and all(_is_plain_name(k) and isinstance(d, str) and ":" in d
                                                          for k, d in v.items())),
}


def check_metadata(metadata: Any, path: Path) -> None:
    """Raise CheckpointError naming `path` and the first entry that is missing or of the wrong type."""
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: corrupt, it is not a JSON object")
    missing = [key for key in REQUIRED if key not in metadata]
    if missing:
        raise CheckpointError(f"{path}: corrupt, it lacks {', '.join(missing)}")
    for table, required in ((REQUIRED, True), (OPTIONAL, False)):
        for key, (meaning, check) in table.items():
            if (required or key in metadata) and not check(metadata[key]):
                shown = repr(metadata[key])
                raise CheckpointError(f"{path}: corrupt, its {key!r} must be {meaning}, got "
                                      f"{shown[:80] + '...' if len(shown) > 80 else shown}")
    listed = set(metadata["files"])
    for name in listed_files(metadata):
        if name not in listed:
            raise CheckpointError(f"{path}: corrupt, it names {name} but its 'files' manifest has no size for it")


def listed_files(metadata: dict) -> list[str]:
    """Every file the checkpoint says it holds: the manifest and the per-rank lists."""
    names = set(metadata["files"])
    names.update(name for _, _, name in metadata["optimizer_shards"])
    names.update(name for stage in metadata.get("pipeline_stages", []) for name in stage["files"])
    names.update(name for _, name in metadata.get("model_files", []))
    names.update(name for _, _, name in metadata.get("rng_files", []))
    return sorted(names)


def member(iteration_dir: Path, name: str) -> Path:
    """`iteration_dir / name`, refused unless `name` is a plain name that resolves inside the
    directory (checkpoint/inside.py: a symbolic link out of it is refused too)."""
    if not _is_plain_name(name):
        raise CheckpointError(f"{iteration_dir}: the checkpoint names {name!r}, which is not a file name inside it")
    return inside(iteration_dir, name)


def _read_pointer(path: Path, holds: str) -> tuple[bytes, str]:
    """A pointer file's first bytes (one more than a pointer may have, so an oversized one shows) and their
    stripped text; an unreadable or non-UTF-8 file is an error naming what it should hold."""
    try:
        with open(path, "rb") as f:
            raw = f.read(LATEST_MAX_BYTES + 1)
        return raw, raw.decode("utf-8").strip()
    except OSError as error:
        raise CheckpointError(f"{path}: unreadable ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{path}: not UTF-8 text; it should hold {holds}") from None


def read_latest(path: Path) -> str:
    """The iteration directory name a `latest` file holds, checked to be one."""
    raw, text = _read_pointer(path, "an iteration directory name")
    if len(raw) > LATEST_MAX_BYTES or not ITERATION_NAME.fullmatch(text):
        shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
        raise CheckpointError(f"{path} holds {shown}, not an iteration directory name like iter_0001000")
    return text


def read_tracker(path: Path) -> str:
    """The iteration directory Megatron-LM's tracker file (`latest_checkpointed_iteration.txt`) names.
    Its read_metadata (megatron/training/checkpointing.py) takes the stripped text as an integer
    iteration, or "release" for a release checkpoint's `release/` directory, which this format has
    not: that, and anything else, is an error naming the file."""
    raw, text = _read_pointer(path, "an iteration number")
    if text == "release":
        raise CheckpointError(f"{path} names Megatron-LM's release checkpoint (a 'release' directory), which "
                              f"this checkpoint format has not; pass --load an iter_* directory instead")
    if len(raw) > LATEST_MAX_BYTES or not re.fullmatch(r"\d+", text):
        shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
        raise CheckpointError(f"{path} holds {shown}, not an iteration number like 1000 (Megatron-LM's tracker "
                              f"file holds the iteration of the checkpoint to load)")
    return f"iter_{int(text):07d}"
