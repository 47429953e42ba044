"""Ways to damage a torch_dist checkpoint's files, for tests/checkpoint/test_torch_dist_integrity.py and
tests/checkpoint/test_torch_dist_fuzz.py: where a tensor's bytes lie inside a `.distcp` file (each stored item is a
torch.save zip archive; its `archive/data/0` record holds the values), and common.pt rewritten with one entry
changed; and a whole folder saved again by DCP itself with some tensors replaced (`rewrite_tensors`), so that its
index, records and digests are consistent and only the content is what a test chose."""

from __future__ import annotations

import hashlib
import io
import struct
import zipfile
from pathlib import Path
from typing import Optional

import torch

from checkpoint.file_names import DCP_METADATA_FILE
from checkpoint.torch_dist.common import COMMON_FILE, FILE_DIGESTS_KEY, INDEX_DIGEST_KEY, index_digest, safe_globals
from checkpoint.torch_dist.dcp_reader import DcpReader

LOCAL_HEADER = 30  # a zip local file header's fixed part; its name and extra field follow


def stored_items(iteration_dir: Path) -> list[tuple[str, Path, int, int]]:
    """(key, file, offset, length) of every item DCP's index places, in file order."""
    reader = DcpReader(iteration_dir)
    items = [(index.fqn, iteration_dir / info.relative_path, info.offset, info.length)
             for index, info in reader.metadata.storage_data.items()]
    return sorted(items, key=lambda item: (item[1].name, item[2]))


def tensor_bytes(iteration_dir: Path, key: str) -> tuple[Path, int, int]:
    """(file, first byte, length) of tensor `key`'s values inside its `.distcp` file (its first chunk)."""
    for fqn, path, offset, length in stored_items(iteration_dir):
        if fqn == key:
            data = path.read_bytes()[offset:offset + length]
            info = zipfile.ZipFile(io.BytesIO(data)).getinfo(next(
                name for name in zipfile.ZipFile(io.BytesIO(data)).namelist() if name.endswith("/data/0")))
            at = info.header_offset
            name_length, extra_length = struct.unpack("<HH", data[at + 26:at + 30])
            return path, offset + at + LOCAL_HEADER + name_length + extra_length, info.file_size
    raise KeyError(key)


def flip_bit(path: Path, at: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1 << bit
    path.write_bytes(bytes(data))


def read_common(iteration_dir: Path) -> dict:
    with torch.serialization.safe_globals(safe_globals()):
        return torch.load(iteration_dir / COMMON_FILE, weights_only=True)


def write_common(iteration_dir: Path, common: dict) -> None:
    torch.save(common, iteration_dir / COMMON_FILE)


def rewrite_tensors(iteration_dir: Path, changes: dict[str, Optional[torch.Tensor]]) -> None:
    """Every item of the folder read by DCP (format_utils.dcp_to_torch_save), `changes` applied (key -> its new
    tensor, of any shape, or a new key's; None drops the key), and the whole saved again by DCP's own writer in place of the old
    files; where common.pt records our writer's digests of the index and the files, they are recomputed."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = iteration_dir.parent / f"{iteration_dir.name}.whole.pt"
    dcp_to_torch_save(iteration_dir, whole)
    state = torch.load(whole, weights_only=False)
    whole.unlink()
    for key, tensor in changes.items():
        if tensor is None:
            del state[key]
        else:
            state[key] = tensor
    for old in [*iteration_dir.glob("*.distcp"), iteration_dir / DCP_METADATA_FILE]:
        old.unlink()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(iteration_dir), no_dist=True)
    common = read_common(iteration_dir)
    if INDEX_DIGEST_KEY in common:
        files = {path.name: f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}"
                 for path in sorted(iteration_dir.glob("*.distcp"))}
        write_common(iteration_dir, {**common, INDEX_DIGEST_KEY: index_digest(iteration_dir),
                                     FILE_DIGESTS_KEY: files})
