"""The on-disk checkpoint format, readable with no process group, no GPU and none of the model code: `latest` (and
Megatron-LM's latest_checkpointed_iteration.txt, written first; the later one wins) name iter_0000010/, holding
metadata.json (written last), model_tp00.safetensors, optim_tp00_dp000.safetensors (a flat partition and its fragment
table), rng_tp00_dp000.safetensors and tokenizer/. Only safetensors and JSON are read, so a load cannot run code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence

import torch

from base.errors import CheckpointError
from base.file_modes import apply_umask
from checkpoint.inside import check_named_paths, inside
from checkpoint.schema import INT64_MAX, check_metadata, listed_files, member, read_latest, read_tracker

FORMAT_VERSION = 1
LATEST_FILE = "latest"
TRACKER_FILE = "latest_checkpointed_iteration.txt"  # Megatron-LM's get_checkpoint_tracker_filename
METADATA_FILE = "metadata.json"
TOKENIZER_DIR = "tokenizer"
OPTIMIZER_KEYS = ("master", "exp_avg", "exp_avg_sq")
# A file's header entry: parameter name -> [global offset, local shape] of the slice it holds.
RECORDS = "records"
STAGING_SUFFIX = ".partial"
RETIRED_SUFFIX = ".old-"


def iteration_dir_name(iteration: int) -> str:
    return f"iter_{iteration:07d}"


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` to write; then fsynced and renamed over `path`, so a reader sees the old file or
    the whole new one. On failure `path` is untouched."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield temporary
        fsync_path(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_path(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` atomically (see `atomic_file`)."""
    with atomic_file(path) as temporary:
        temporary.write_text(text, encoding="utf-8")


def metadata_text(metadata: dict) -> str:
    return json.dumps(metadata, indent=1, sort_keys=True) + "\n"


def replace_directory(staging: Path, final: Path) -> None:
    """Rename a fully written `staging` to `final`; an existing `final` is moved aside first and deleted afterwards (a
    crash in between leaves the old copy, which `resolve_checkpoint` falls back to)."""
    for path in staging.iterdir():
        if path.is_file():
            fsync_path(path)
    fsync_path(staging)
    if final.exists():
        os.replace(final, final.with_name(f"{final.name}{RETIRED_SUFFIX}{os.getpid()}"))
    os.replace(staging, final)
    fsync_path(final.parent)
    for old_copy in final.parent.glob(f"{final.name}{RETIRED_SUFFIX}*"):  # this one, and any a crash left
        shutil.rmtree(old_copy, ignore_errors=True)


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: Optional[dict] = None) -> int:
    """Write a safetensors file and fsync it; returns its size in bytes."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in tensors.items()}
    text_metadata = {"format": "pt"}
    for key, value in (metadata or {}).items():
        text_metadata[key] = json.dumps(value)
    try:
        save_file(tensors, str(path), metadata=text_metadata)
    except SafetensorError as error:  # safetensors reports a full disk or a bad path as its own type
        raise OSError(f"{path}: cannot write ({error})") from None
    apply_umask(path)  # safetensors creates its files 0600; teammates must be able to read checkpoints
    sort_header_metadata(path)
    fsync_path(path)
    size, expected = path.stat().st_size, _safetensors_size(path)
    if size != expected:
        raise OSError(f"{path}: short write, {size} of {expected} bytes on disk (is the disk full?)")
    return size


def _compact_json(value) -> bytes:
    """JSON as safetensors' serde_json writes a header: no spaces, non-ASCII as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sort_header_metadata(path: Path) -> None:
    """Sort a safetensors file's `__metadata__` entries in place: safetensors writes them in a random HashMap order, so
    a file's bytes depend on what it holds only once sorted. A header this serializer does not reproduce is left as is.
    """
    with open(path, "r+b") as f:
        header_length = int.from_bytes(f.read(8), "little")
        text = f.read(header_length).rstrip(b" ")  # safetensors pads the header with spaces to 8 bytes
        header = json.loads(text)
        metadata = header.get("__metadata__")
        if not isinstance(metadata, dict) or len(metadata) < 2 or _compact_json(header) != text:
            return
        header["__metadata__"] = dict(sorted(metadata.items()))
        f.seek(8)
        f.write(_compact_json(header))


def _safetensors_size(path: Path) -> int:
    """The size a safetensors file must have, from its header."""
    with open(path, "rb") as f:
        header_length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(header_length))
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    return 8 + header_length + max(ends, default=0)


def is_save_directory(path: Path) -> bool:
    """Whether `path` names its checkpoint: it holds `latest` or Megatron's tracker file."""
    return (path / LATEST_FILE).is_file() or (path / TRACKER_FILE).is_file()


def pointed_checkpoint(save_dir: Path) -> tuple[str, str, Optional[str]]:
    """(the iteration directory a save directory points at, the file naming it, a note when `latest` and the tracker
    disagree)."""
    latest = read_latest(inside(save_dir, LATEST_FILE)) if (save_dir / LATEST_FILE).is_file() else None
    tracked = read_tracker(inside(save_dir, TRACKER_FILE)) if (save_dir / TRACKER_FILE).is_file() else None
    if tracked is None or latest == tracked:
        return latest, LATEST_FILE, None
    if latest is None:
        return tracked, TRACKER_FILE, None
    latest_written = (save_dir / LATEST_FILE).stat().st_mtime_ns
    tracker_written = (save_dir / TRACKER_FILE).stat().st_mtime_ns
    name, named_by = (latest, LATEST_FILE) if latest_written > tracker_written else (tracked, TRACKER_FILE)
    why = ("'latest' was written after the tracker" if latest_written > tracker_written else
           "the tracker was written after 'latest'" if tracker_written > latest_written else
           "both were written at once and Megatron-LM reads the tracker")
    return name, named_by, (f"> {save_dir}: {TRACKER_FILE} names iteration {int(tracked[len('iter_'):])} and "
                            f"'{LATEST_FILE}' names {latest}: loading {name}, as {why}")


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A `--save` directory or one iteration directory -> that iteration directory, checked to be complete."""
    path = Path(path)
    if (path / METADATA_FILE).is_file():
        # An iteration directory is itself, even if it holds a `latest` of its own: never another iteration, silently.
        return path
    if is_save_directory(path):
        name, named_by, _ = pointed_checkpoint(path)
        target = inside(path, name)
        if not target.exists():
            # A crash mid re-save of an iteration leaves the complete old copy.
            retired = sorted(path.glob(f"{name}{RETIRED_SUFFIX}*"))
            if retired and (retired[0] / METADATA_FILE).is_file():
                return inside(path, retired[0].name)
        if not (target / METADATA_FILE).is_file():
            raise CheckpointError(f"{path / named_by} names {name!r}, which is not a complete checkpoint")
        return target
    if path.is_dir() and path.name.endswith(STAGING_SUFFIX):
        raise CheckpointError(f"{path} is a save that never finished; use the checkpoint `latest` names")
    if path.is_dir() and path.name.startswith("iter_"):
        raise CheckpointError(f"{path} has no {METADATA_FILE}: the save did not finish")
    raise CheckpointError(f"{path}: no checkpoint here (no '{LATEST_FILE}' or '{TRACKER_FILE}' file, no "
                          f"{METADATA_FILE})")


def has_checkpoint(iteration_dir: str | os.PathLike) -> bool:
    """Whether `iteration_dir` holds a complete checkpoint (metadata is written last)."""
    return (Path(iteration_dir) / METADATA_FILE).is_file()


def read_metadata(iteration_dir: Path) -> dict:
    """metadata.json, trusted once every path it names lies inside `iteration_dir` and its entries have the right types.
    """
    path = inside(iteration_dir, METADATA_FILE)
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: unreadable or corrupt ({error})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: corrupt, nested too deeply to be checkpoint metadata") from None
    except ValueError as error:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise CheckpointError(f"{path}: corrupt, a number in it is too long ({str(error).split(';')[0]})") from None
    version = metadata.get("format_version") if isinstance(metadata, dict) else None
    if type(version) is not int or version != FORMAT_VERSION:  # not 1.0, not true
        raise CheckpointError(f"{path}: format version {version!r}; this code reads version {FORMAT_VERSION}")
    try:
        check_metadata(metadata, path)
    except RecursionError:  # JSON nested just shallowly enough to parse, too deep to walk
        raise CheckpointError(f"{path}: corrupt, nested too deeply to be checkpoint metadata") from None
    check_named_paths(iteration_dir, listed_files(metadata), metadata.get("tokenizer"))
    return metadata


@contextmanager
def open_tensors(iteration_dir: Path, name: str, metadata: dict) -> Iterator:
    """A safetensors reader for one checkpoint file, checked against the manifest; anything else raises
    `CheckpointError` naming the file, and nothing in it is executed."""
    from safetensors import safe_open

    path = member(iteration_dir, name)
    expected = metadata.get("files", {}).get(name)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing from the checkpoint")
    size = path.stat().st_size
    if expected is not None and size != expected:
        raise CheckpointError(f"{path}: {size} bytes where the save wrote {expected}: truncated or corrupt")
    try:
        reader = safe_open(str(path), framework="pt", device="cpu")
    except Exception as error:  # safetensors raises its own error types for malformed headers
        raise CheckpointError(f"{path}: not a valid safetensors file ({error})") from None
    yield _CheckedReader(reader, path)


class _CheckedReader:
    """safe_open's reader with its failures turned into errors that name the file."""

    def __init__(self, reader, path: Path) -> None:
        self._reader, self.path = reader, path

    def metadata(self) -> dict:
        raw = self._reader.metadata() or {}
        try:
            return {key: json.loads(value) for key, value in raw.items() if key != "format"}
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{self.path}: corrupt metadata ({error})") from None

    def fragments(self, keys: Sequence[str]) -> list[tuple[str, int, int, int]]:
        """The partition's fragment table, checked against the file's tensors."""
        table = self.metadata().get("fragments")
        try:
            lengths = {key: self._reader.get_slice(key).get_shape() for key in keys}
        except Exception as error:
            raise CheckpointError(f"{self.path}: lacks an optimizer tensor ({error})") from None
        if not isinstance(table, list):
            raise CheckpointError(f"{self.path}: no fragment table; not an optimizer partition")
        fragments = []
        for entry in table:
            ok = (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
                  and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= INT64_MAX
                          for v in entry[1:]))
            if not ok or any(len(shape) != 1 or entry[2] + entry[3] > shape[0] for shape in lengths.values()):
                raise CheckpointError(f"{self.path}: corrupt fragment table entry {entry!r}")
            fragments.append(tuple(entry))
        return fragments

    def keys(self) -> list[str]:
        return list(self._reader.keys())

    def dtype(self, key: str) -> torch.dtype:
        """The dtype `key` is stored in, from the header."""
        try:
            return self._reader.get_slice(key)[0:0].dtype
        except Exception as error:
            raise CheckpointError(f"{self.path}: cannot read {key!r} ({error})") from None

    def tensor(self, key: str) -> torch.Tensor:
        try:
            return self._reader.get_tensor(key)
        except Exception as error:
            raise CheckpointError(f"{self.path}: cannot read {key!r} ({error})") from None

    def range(self, key: str, start: int, end: int) -> torch.Tensor:
        """Elements [start, end) of a 1-D tensor, reading only those bytes."""
        try:
            return self._reader.get_slice(key)[start:end]
        except Exception as error:
            raise CheckpointError(f"{self.path}: cannot read {key!r}[{start}:{end}] ({error})") from None


def optimizer_shards(metadata: dict, tensor_parallel_rank: Optional[int] = None) -> list[tuple[int, int, str]]:
    """(tp rank, dp rank, file name) of every optimizer partition, optionally of one TP rank."""
    shards = [tuple(entry) for entry in metadata["optimizer_shards"]]
    return [s for s in shards if tensor_parallel_rank is None or s[0] == tensor_parallel_rank]


def local_shape(entry: dict, tensor_parallel_size: int) -> list[int]:
    """A parameter's shape on one TP rank, from its table entry (full shape and split dimension)."""
    shape = list(entry["shape"])
    dim = entry["tensor_parallel_dim"]
    if dim is not None:
        shape[dim] //= tensor_parallel_size
    return shape


def commit(staging: Path, final: Path, save_dir: Path) -> None:
    """Make a fully written staging directory the checkpoint `final`, then point the tracker and `latest` at it (in that
    order, so a stop in between leaves the tracker naming the newer complete checkpoint)."""
    replace_directory(staging, final)
    point_at(save_dir, final.name)


def point_at(save_dir: Path, name: str, tracker: bool = True) -> None:
    """Write Megatron's tracker file (unless `tracker` is False), then `latest`, each atomically."""
    if tracker:
        write_text_atomic(save_dir / TRACKER_FILE, f"{int(name[len('iter_'):])}\n")
    write_text_atomic(save_dir / LATEST_FILE, name + "\n")


def remove_stale_saves(save_dir: Path) -> None:
    """Delete what dead saves left: staging directories, temporary `latest` files, replaced iteration copies."""
    for path in save_dir.glob(f"iter_*{STAGING_SUFFIX}"):
        shutil.rmtree(path, ignore_errors=True)
    for pointer in (LATEST_FILE, TRACKER_FILE):
        for path in save_dir.glob(f".{pointer}.tmp-*"):
            path.unlink(missing_ok=True)
    for path in save_dir.glob(f"iter_*{RETIRED_SUFFIX}*"):
        if (save_dir / path.name.split(RETIRED_SUFFIX)[0] / METADATA_FILE).is_file():
            shutil.rmtree(path, ignore_errors=True)


def saved_run_id(iteration_dir: Path) -> Optional[str]:
    """The lineage a checkpoint's metadata names; None where unattributable (nobody's to delete)."""
    try:
        with open(inside(iteration_dir, METADATA_FILE), encoding="utf-8") as f:
            metadata = json.load(f)
    except (CheckpointError, OSError, ValueError, RecursionError):
        return None
    value = metadata.get("run_id") if isinstance(metadata, dict) else None
    return value if isinstance(value, str) else None


def prune(save_dir: Path, keep_last: int, run_id: str) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints of lineage `run_id`, never the one the pointers name; other
    runs' checkpoints are neither counted nor deleted."""
    kept = {read_latest(save_dir / LATEST_FILE)}
    if (save_dir / TRACKER_FILE).is_file():
        kept.add(read_tracker(save_dir / TRACKER_FILE))
    complete = sorted((p for p in save_dir.glob("iter_*") if re.fullmatch(r"iter_\d+", p.name) and p.is_dir()
                       and (p / METADATA_FILE).is_file()), key=lambda p: int(p.name[len("iter_"):]))
    ours = [path for path in complete if saved_run_id(path) == run_id]
    removed = []
    for path in ours[:-keep_last] if keep_last > 0 else []:
        if path.name not in kept:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
