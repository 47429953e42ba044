"""Every file a checkpoint lists, verified before it is loaded: present, its size, its safetensors header, dtypes and
shapes, and (unless skipped) a content hash written at save time (XXH3-128, else SHA-256). The ranks share the files and
agree on the verdict.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Callable, Optional

from base.errors import CheckpointError
from checkpoint.format import RECORDS, local_shape
from checkpoint.schema import listed_files, member

try:
    import xxhash
except ImportError:  # the standard library's SHA-256 is the fallback
    xxhash = None

HASHERS: dict[str, Callable[[], object]] = {"sha256": hashlib.sha256}
if xxhash is not None:
    HASHERS["xxh3_128"] = xxhash.xxh3_128
DEFAULT_HASH = "xxh3_128" if xxhash is not None else "sha256"
_READ_CHUNK = 8 << 20

DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
SAFETENSORS_DTYPE_OF_PRECISION = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}
# A header this large means a corrupt length prefix.
MAX_HEADER_BYTES = 100 << 20


def file_digest(path: Path, algorithm: str = DEFAULT_HASH) -> str:
    """'algorithm:hex digest' of a file's content, read in chunks (memory stays flat)."""
    hasher = HASHERS[algorithm]()
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            hasher.update(chunk)
    return f"{algorithm}:{hasher.hexdigest()}"


def read_header(path: Path, file_size: int) -> tuple[dict[str, dict], dict]:
    """The tensors a safetensors file declares, once the header is well formed and they tile the data exactly; and its
    metadata."""
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: not a valid safetensors file ({file_size} bytes)")
        (header_length,) = struct.unpack("<Q", prefix)
        if header_length > min(MAX_HEADER_BYTES, file_size - 8):
            raise CheckpointError(f"{path}: not a valid safetensors file (its header claims {header_length} bytes)")
        raw = f.read(header_length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise CheckpointError(f"{path}: not a valid safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a valid safetensors file (its header is not a JSON object)")
    extra = header.pop("__metadata__", None)
    extra = extra if isinstance(extra, dict) else {}
    spans = []
    for name, entry in header.items():
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        valid = (dtype in DTYPE_SIZES and isinstance(shape, list)
                 and all(isinstance(n, int) and n >= 0 for n in shape)
                 and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(n, int) for n in offsets))
        if not valid:
            raise CheckpointError(f"{path}: not a valid safetensors file (corrupt header entry {name!r})")
        numel = 1
        for n in shape:
            numel *= n
        if offsets[1] - offsets[0] != numel * DTYPE_SIZES[dtype] or offsets[0] < 0:
            raise CheckpointError(f"{path}: not a valid safetensors file (tensor {name!r}, {dtype} "
                                  f"{shape}, does not fit its byte range {offsets})")
        spans.append(tuple(offsets))
    position = 0
    for start, end in sorted(spans):
        if start != position:
            raise CheckpointError(f"{path}: not a valid safetensors file (its tensors' byte ranges overlap or "
                                  f"leave gaps)")
        position = end
    if 8 + header_length + position != file_size:
        raise CheckpointError(f"{path}: not a valid safetensors file ({file_size} bytes, but its header "
                              f"describes {8 + header_length + position}: truncated or corrupt)")
    return header, extra


def slice_records(extra: dict) -> Optional[dict]:
    """The sharding records a file's metadata holds; None for a file without; malformed ones come back for the check to
    name."""
    raw = extra.get(RECORDS)
    if raw is None:
        return None
    try:
        records = json.loads(raw)
    except (TypeError, json.JSONDecodeError, RecursionError):
        return {"": "not JSON"}
    return records if isinstance(records, dict) else {"": "not an object"}


def _records_problem(header: dict, records: dict, table: dict, dtype: str, precision: str) -> Optional[str]:
    """A model file holds exactly the slices its records name, inside their parameters, in the training dtype."""
    if set(header) != set(records):
        unknown, missing = sorted(set(header) - set(records)), sorted(set(records) - set(header))
        return f"its tensors differ from its sharding records (extra {unknown[:3]}, missing {missing[:3]})"
    for param, entry in header.items():
        record = records[param]
        whole = table.get(param, {}).get("shape")
        split = table.get(param, {}).get("tensor_parallel_dim")
        ok = (whole is not None and isinstance(record, list) and len(record) == 2
              and all(isinstance(v, list) and len(v) == len(whole) and all(isinstance(n, int) for n in v)
                      for v in record)
              and all(0 <= o and 0 < n and o + n <= w and o % n == 0 and w % n == 0 and (n == w or axis == split)
                      for axis, (o, n, w) in enumerate(zip(*record, whole))))
        if not ok:  # a slice is the whole tensor, or an equal slice along the table's split dimension
            return (f"{param}: its sharding record {record!r:.80} is not a slice of the parameter table's {whole} "
                    f"(split along {split})")
        if entry["dtype"] != dtype:
            return f"{param} is {entry['dtype']}; a {precision} checkpoint stores {dtype}"
        if entry["shape"] != record[1]:
            return f"{param} has shape {entry['shape']}, its sharding record says {record[1]}"
    return None


def expected_tensors(name: str, metadata: dict) -> Optional[Callable[[dict, dict], Optional[str]]]:
    """A check of one file's tensors against what a checkpoint of ours puts in that kind of file (a problem in words, or
    None); None for an unknown kind."""
    tp_size = metadata["tensor_parallel_size"]
    model_files = {file: tp for tp, file in metadata.get("model_files", [])}
    expert_files = {file: set(held) for _, _, file, held in metadata.get("expert_model_files", [])}
    if name in model_files or name in expert_files:
        dtype = SAFETENSORS_DTYPE_OF_PRECISION.get(metadata.get("precision", "fp32"), "F32")
        shapes = {param: local_shape(entry, tp_size) for param, entry in metadata["parameters"].items()}
        if name in expert_files:
            shapes = {param: shape for param, shape in shapes.items() if param in expert_files[name]}
        else:
            experts = set().union(*expert_files.values())
            shapes = {param: shape for param, shape in shapes.items() if param not in experts}
        for stage in metadata.get("pipeline_stages", []):  # a stage's model file holds that stage's names
            if name in stage["files"]:
                shapes = {param: shape for param, shape in shapes.items() if param in set(stage["parameters"])}

        def model(header: dict, extra: dict) -> Optional[str]:
            records = slice_records(extra)
            if records is not None:  # since the records: the slices this file's rank was the first replica of
                if not set(records) <= set(shapes):
                    return f"it holds slices of {sorted(set(records) - set(shapes))[:3]}, not its stage's parameters"
                return _records_problem(header, records, metadata["parameters"], dtype,
                                        metadata.get("precision", "fp32"))
            if set(header) != set(shapes):
                unknown, missing = sorted(set(header) - set(shapes)), sorted(set(shapes) - set(header))
                return f"its tensors differ from the parameter table (extra {unknown[:3]}, missing {missing[:3]})"
            for param, entry in header.items():
                if entry["dtype"] != dtype:
                    precision = metadata.get("precision", "fp32")
                    return f"{param} is {entry['dtype']}; a {precision} checkpoint stores {dtype}"
                if entry["shape"] != shapes[param]:
                    return f"{param} has shape {entry['shape']}, the parameter table says {shapes[param]}"
            return None
        return model
    if name in {file for _, _, file in metadata["optimizer_shards"]}:
        def optimizer(header: dict, extra: dict) -> Optional[str]:
            lengths = set()
            for key in ("master", "exp_avg", "exp_avg_sq", *(("exp_avg_slow",) if "exp_avg_slow" in header else ())):
                entry = header.get(key)
                if entry is None:
                    return f"it lacks the optimizer tensor {key!r}"
                dtypes = ("F32", "BF16") if key in ("exp_avg", "exp_avg_sq") else ("F32",)
                if entry["dtype"] not in dtypes or len(entry["shape"]) != 1:
                    return (f"{key} is {entry['dtype']} {entry['shape']}; optimizer partitions are flat "
                            f"{' or '.join(dtypes)}")
                lengths.add(entry["shape"][0])
            return None if len(lengths) == 1 else "its master weights and Adam moments differ in length"
        return optimizer
    if name in {file for _, _, file in metadata.get("rng_files", [])}:
        def rng(header: dict, extra: dict) -> Optional[str]:
            for key, entry in header.items():
                wanted = "I64" if key == "numpy_keys" else "U8"
                if entry["dtype"] != wanted:
                    return f"random state {key!r} is {entry['dtype']}, not {wanted}"
            return None
        return rng
    return None


def verify_file(iteration_dir: Path, name: str, metadata: dict, check_content: bool = True) -> None:
    """Raise CheckpointError naming the file if it is missing, mis-sized, malformed, mistyped or (with `check_content`)
    differs from its hash."""
    path = member(iteration_dir, name)
    if not path.is_file():
        raise CheckpointError(f"{path}: missing from the checkpoint")
    size, expected_size = path.stat().st_size, metadata["files"][name]
    if size != expected_size:
        raise CheckpointError(f"{path}: {size} bytes where the save wrote {expected_size}: truncated or corrupt")
    if name.endswith(".safetensors"):
        header, extra = read_header(path, size)
        check = expected_tensors(name, metadata)
        problem = check(header, extra) if check is not None else None
        if problem:
            raise CheckpointError(f"{path}: {problem}")
    recorded = metadata.get("file_hashes", {}).get(name)
    if check_content and recorded is not None:
        algorithm = recorded.split(":", 1)[0]
        if algorithm not in HASHERS:
            raise CheckpointError(f"{path}: hashed with {algorithm}, which needs a package this machine lacks "
                                  f"(pip install xxhash), or pass --no-verify-checkpoint")
        if file_digest(path, algorithm) != recorded:
            raise CheckpointError(f"{path}: its content differs from what the save wrote (hash mismatch): "
                                  f"the file is corrupt")


def verify_checkpoint(iteration_dir: Path, metadata: dict, check_content: bool = True, rank: int = 0,
                      world_size: int = 1) -> Optional[str]:
    """Verify this rank's share of the files; returns the first problem, or None (the caller makes the ranks agree)."""
    try:
        for name in listed_files(metadata)[rank::world_size]:
            verify_file(iteration_dir, name, metadata, check_content)
    except CheckpointError as error:
        return str(error)
    except OSError as error:
        return f"{iteration_dir}: cannot read ({error})"
    return None


def hash_files(directory: Path, names, algorithm: str = DEFAULT_HASH) -> dict[str, str]:
    """{name: digest} of files just written (read back from the page cache)."""
    return {name: file_digest(directory / name, algorithm) for name in names}


def verify_or_raise(iteration_dir: Path, metadata: dict, check_content: bool = True) -> None:
    """`verify_checkpoint` for one process (the offline tools): raise the first problem."""
    problem = verify_checkpoint(iteration_dir, metadata, check_content)
    if problem:
        raise CheckpointError(problem)
