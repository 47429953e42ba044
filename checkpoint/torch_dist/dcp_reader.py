"""A torch.distributed.checkpoint folder read a region at a time, in one process, through DCP's own load. Every stored
item's CRC-32 is checked before DCP unpickles it, `.metadata` is unpickled with DCP's classes only, and nothing read
runs code; a small byte-bounded cache loads each chunk once.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Optional

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from base.errors import CheckpointError
from checkpoint.file_names import DCP_METADATA_FILE
from checkpoint.torch_dist.dcp_failures import DCP_FAILURES, failure_line
from checkpoint.zip_records import zip_damage

CACHE_BYTES = 64 * 2**20  # the chunks kept between reads (a chunk larger than this is still read, then dropped)

# Every global DCP's `.metadata` pickle names: data classes and enums, no callable that acts.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.planner", name) for name in (
        "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "LoadPlan", "ReadItem", "LoadItemType")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
     ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"), ("builtins", "set"),
     ("builtins", "frozenset"), ("pathlib", "PosixPath")}  # DCP's own writer keeps the checkpoint's path


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS or (
                module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


class _SafeReader(FileSystemReader):
    """DCP's file reader, its metadata unpickled by `_MetadataUnpickler`."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        path = Path(self.path) / DCP_METADATA_FILE
        try:
            with open(path, "rb") as file:
                metadata = _MetadataUnpickler(file).load()
        except pickle.UnpicklingError as error:
            raise CheckpointError(f"{path}: names {error}, which is not DCP metadata; refusing to unpickle it (a "
                                  f"checkpoint is read without running its code)") from None
        except OSError as error:
            raise CheckpointError(f"{path}: cannot be read ({error.strerror or error})") from None
        except Exception as error:  # noqa: BLE001 - a damaged pickle fails in any of a dozen ways
            raise CheckpointError(f"{path}: unreadable DCP metadata ({type(error).__name__}: {str(error)[:200]}); "
                                  f"the checkpoint is corrupt or truncated") from None
        if not isinstance(metadata, Metadata):
            raise CheckpointError(f"{path}: holds a {type(metadata).__name__}, not DCP metadata")
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata

    def _slice_file(self, file, sinfo: _StorageInfo):
        """The stored item's bytes, verified, for DCP to unpickle."""
        names = getattr(self, "_names", None)
        if names is None or names[0] is not self.storage_data:
            names = self._names = (self.storage_data, {id(info): index for index, info in self.storage_data.items()})
        index = names[1].get(id(sinfo))
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)
        check_record(Path(self.path) / sinfo.relative_path, index, sinfo, data)
        return io.BytesIO(data)


def _item_name(index: Optional[MetadataIndex]) -> str:
    if index is None:
        return "an item"
    offsets = f" (its chunk at {tuple(index.offset)})" if index.offset is not None else ""
    return f"{index.fqn}{offsets}"


def check_record(path: Path, index: Optional[MetadataIndex], sinfo: _StorageInfo, data: bytes) -> None:
    """Raise CheckpointError naming the file, tensor and bytes unless the item is an intact torch archive of its indexed
    length."""
    end = sinfo.offset + sinfo.length
    if len(data) != sinfo.length:
        raise CheckpointError(f"{path}: ends at byte {sinfo.offset + len(data)}, inside {_item_name(index)} (bytes "
                              f"{sinfo.offset}-{end}); the file is truncated")
    if sinfo.transform_descriptors:  # DCP's stream extensions (compression, ...): Megatron-Core writes none
        raise CheckpointError(f"{path}: {_item_name(index)} is stored through DCP's stream transforms "
                              f"({', '.join(map(str, sinfo.transform_descriptors))}), which this reader does not read")
    damage = zip_damage(memoryview(data))
    if damage:
        raise CheckpointError(f"{path}: {_item_name(index)} (bytes {sinfo.offset}-{end}) is {damage}; the "
                              f"checkpoint is damaged")


class _RegionPlanner(LoadPlanner):
    """Reads chunks of some tensors (`targets`) and some byte objects (`objects`)."""

    def __init__(self, targets: dict[tuple[str, tuple[int, ...]], torch.Tensor], objects: dict[str, Optional[bytes]]):
        self.targets, self.objects = targets, objects

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        items: list[ReadItem] = []
        for (key, offsets), target in self.targets.items():
            chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=target.size())
            items += create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [chunk])
        for key in self.objects:
            index = MetadataIndex(key)
            items.append(ReadItem(type=LoadItemType.BYTE_IO, dest_index=index, dest_offsets=torch.Size([0]),
                                  storage_index=index, storage_offsets=torch.Size([0]), lengths=torch.Size([0])))
        return LoadPlan(items)

    def create_global_plan(self, global_plan):
        return global_plan

    def finish_plan(self, central_plan):
        return central_plan

    def load_bytes(self, read_item, value) -> None:
        self.objects[read_item.dest_index.fqn] = value.read()

    def resolve_tensor(self, read_item) -> torch.Tensor:
        target = self.targets[(read_item.dest_index.fqn, tuple(read_item.dest_index.offset))]
        for dim, (offset, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            target = target.narrow(dim, offset, length)
        return target

    def commit_tensor(self, read_item, tensor) -> None:
        pass  # resolve_tensor handed out a view of the target: DCP copied into it


class DcpReader:
    """One DCP folder (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not (self.path / DCP_METADATA_FILE).is_file():
            raise CheckpointError(f"{self.path}: no {DCP_METADATA_FILE} (torch.distributed.checkpoint's index); the "
                                  f"save did not finish or the folder is not a torch_dist checkpoint")
        self._reader = _SafeReader(self.path)
        self.metadata = self._reader.read_metadata()
        self.bytes_read = 0
        self._cache: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self._cached_bytes = 0

    def tensors(self) -> dict[str, TensorStorageMetadata]:
        return {key: md for key, md in self.metadata.state_dict_metadata.items()
                if isinstance(md, TensorStorageMetadata)}

    def objects(self) -> list[str]:
        return [key for key, md in self.metadata.state_dict_metadata.items() if isinstance(md, BytesStorageMetadata)]

    def read(self, key: str, region: tuple[slice, ...]) -> torch.Tensor:
        """`region` of tensor `key` (global coordinates), in its stored dtype."""
        md = self.tensors().get(key)
        if md is None:
            raise CheckpointError(f"{self.path}: holds no tensor {key!r}; the checkpoint is incomplete")
        out = torch.empty([part.stop - part.start for part in region], dtype=md.properties.dtype)
        filled = 0
        for chunk in md.chunks:
            overlap = [(max(part.start, o), min(part.stop, o + s)) for part, o, s in zip(region, chunk.offsets,
                                                                                         chunk.sizes)]
            if any(lo >= hi for lo, hi in overlap):
                continue
            values = self._chunk(key, chunk, md.properties.dtype)
            source = values[tuple(slice(lo - o, hi - o) for (lo, hi), o in zip(overlap, chunk.offsets))]
            out[tuple(slice(lo - part.start, hi - part.start) for (lo, hi), part in zip(overlap, region))] = source
            filled += source.numel()
        if filled != out.numel():
            shown = ", ".join(f"{p.start}:{p.stop}" for p in region)
            raise CheckpointError(f"{self.path}: its chunks cover {filled} of the {out.numel()} elements of "
                                  f"{key}[{shown}]; the checkpoint is incomplete")
        return out

    def read_objects(self, keys: Iterable[str], safe_globals: list) -> dict[str, object]:
        """The byte objects `keys`, each torch.load-ed weights-only with `safe_globals` added."""
        objects: dict[str, Optional[bytes]] = {key: None for key in keys}
        self._load({}, objects)
        loaded = {}
        for key, data in objects.items():
            try:
                with torch.serialization.safe_globals(safe_globals):
                    loaded[key] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as error:  # an unpickling error names what the object holds
                raise CheckpointError(f"{self.path}: object {key!r} cannot be read without running code or is "
                                      f"corrupt ({type(error).__name__}: {str(error).splitlines()[0][:200]})") from None
        return loaded

    def _chunk(self, key: str, chunk: ChunkStorageMetadata, dtype: torch.dtype) -> torch.Tensor:
        cache_key = (key, tuple(chunk.offsets))
        if cache_key in self._cache:
            self._cache.move_to_end(cache_key)
            return self._cache[cache_key]
        values = torch.empty(tuple(chunk.sizes), dtype=dtype)
        self._load({cache_key: values}, {})
        size = values.numel() * values.element_size()
        self.bytes_read += size
        if size <= CACHE_BYTES:
            self._cache[cache_key] = values
            self._cached_bytes += size
            while self._cached_bytes > CACHE_BYTES:
                _, dropped = self._cache.popitem(last=False)
                self._cached_bytes -= dropped.numel() * dropped.element_size()
        return values

    def verify(self, rank: int = 0, world_size: int = 1, digests: Optional[dict] = None) -> None:
        """Every stored item of this rank's share verified as a load would; with `digests`, one whole file in
        `world_size` each, its SHA-256 compared too."""
        items = sorted(self.metadata.storage_data.items(), key=lambda item: (item[1].relative_path, item[1].offset))
        if digests is not None:
            return self._verify_files(items, rank, world_size, digests)
        by_file: dict[str, list] = {}
        for index, sinfo in items[rank::world_size]:
            by_file.setdefault(sinfo.relative_path, []).append((index, sinfo))
        for name, stored in by_file.items():
            path = self.path / name
            try:
                with open(path, "rb") as file:
                    for index, sinfo in stored:
                        file.seek(sinfo.offset)
                        check_record(path, index, sinfo, file.read(sinfo.length))
            except OSError as error:
                raise CheckpointError(f"{path}: cannot be read ({error.strerror or error})") from None

    def _verify_files(self, items: list, rank: int, world_size: int, digests: dict) -> None:
        by_file: dict[str, list] = {}
        for index, sinfo in items:
            by_file.setdefault(sinfo.relative_path, []).append((index, sinfo))
        if not isinstance(digests, dict) or not all(isinstance(value, str) for value in digests.values()):
            raise CheckpointError(f"{self.path / 'common.pt'}: its record of the files' digests is not a map of file "
                                  f"names to digests; the checkpoint is damaged")
        unrecorded = sorted(set(by_file) - set(digests))
        if unrecorded:
            raise CheckpointError(f"{self.path / unrecorded[0]}: the checkpoint's index places chunks in it, but "
                                  f"common.pt records no digest of it; the save that wrote common.pt did not write it")
        for name in sorted(by_file)[rank::world_size]:
            path = self.path / name
            hasher = hashlib.sha256()
            try:
                with open(path, "rb") as file:
                    for index, sinfo in by_file[name]:  # in offset order: each byte read once
                        hasher.update(file.read(max(sinfo.offset - file.tell(), 0)))
                        file.seek(sinfo.offset)
                        data = file.read(sinfo.length)
                        check_record(path, index, sinfo, data)
                        hasher.update(data)
                    while chunk := file.read(1 << 24):
                        hasher.update(chunk)
            except OSError as error:
                raise CheckpointError(f"{path}: cannot be read ({error.strerror or error})") from None
            if f"sha256:{hasher.hexdigest()}" != digests[name]:
                raise CheckpointError(f"{path}: not the file this checkpoint's save wrote: its SHA-256 is not the one "
                                      f"common.pt recorded ({str(digests[name])[:23]}..., now "
                                      f"sha256:{hasher.hexdigest()[:16]}...)")

    def _load(self, targets: dict, objects: dict) -> None:
        try:
            with warnings.catch_warnings():  # "torch.distributed is disabled ... load in a single process": yes
                warnings.simplefilter("ignore", UserWarning)
                dcp.load({}, storage_reader=self._reader, planner=_RegionPlanner(targets, objects), no_dist=True)
        except CheckpointError:
            raise
        except DCP_FAILURES as error:  # DCP wraps a rank's failure (a missing or damaged .distcp file) in its own
            failure = failure_line(error)
            if isinstance(failure, CheckpointError):
                raise failure from None
            raise CheckpointError(f"{self.path}: reading it failed ({failure}); the checkpoint is corrupt or "
                                  f"incomplete") from None
