"""This project's own checkpoint as a `GlobalStateSource`: whole tensors by name, read a region at a time from the
optimizer partitions of whatever layout saved them. Each file's fragments and records place its elements in the whole
tensor, so a read touches exactly the region's bytes; copies of the same elements are read once.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from pathlib import Path
from typing import Optional, Sequence

import torch

from base.errors import CheckpointError
from checkpoint.format import RECORDS, open_tensors, optimizer_shards, read_metadata
from checkpoint.global_state import GlobalStateSource, GlobalTensorInfo, SourceProgress
from checkpoint.pieces import Piece, read_pieces, refuse_short
from checkpoint.random_states import restore_random_states
from checkpoint.regions import box_numel, flat_start, shift
from zero.optimizer_state import PARTITION_TENSORS_OF

FORMAT_NAME = "zero-gpt"


def saved_optimizer(metadata: dict) -> str:
    """The --optimizer a checkpoint's moments are of (checkpoints from before the setting: adam)."""
    return ((metadata.get("config") or {}).get("optimizer") or {}).get("optimizer", "adam")


def saved_moment_dtypes(metadata: dict) -> dict[str, str]:
    """The stored dtype of each Adam moment (fp32 before --exp-avg-dtype existed)."""
    section = (metadata.get("config") or {}).get("optimizer") or {}
    return {key: section.get(f"{key}_dtype", "fp32") for key in ("exp_avg", "exp_avg_sq")}


def legacy_record(entry: dict, tensor_parallel_size: int, tensor_parallel_rank: int
                  ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global offset, local shape) of a TP rank's slice, from the parameter table of a checkpoint without records:
    equal slices along `tensor_parallel_dim`, else whole."""
    shape, dim = list(entry["shape"]), entry["tensor_parallel_dim"]
    offset = [0] * len(shape)
    if dim is not None:
        shape[dim] //= tensor_parallel_size
        offset[dim] = tensor_parallel_rank * shape[dim]
    return tuple(offset), tuple(shape)


def _records_of(extra: dict, path: Path) -> Optional[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]:
    table = extra.get(RECORDS)
    if table is None:
        return None
    try:
        return {name: (tuple(int(v) for v in offset), tuple(int(v) for v in shape))
                for name, (offset, shape) in table.items()}
    except (TypeError, ValueError, AttributeError):
        raise CheckpointError(f"{path}: corrupt sharding records in its metadata") from None


def _uncovered(covered: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) not in the sorted, disjoint `covered` intervals."""
    parts, position = [], start
    for lo, hi in covered:
        if hi <= position or lo >= end:
            continue
        if lo > position:
            parts.append((position, lo))
        position = max(position, hi)
    if position < end:
        parts.append((position, end))
    return parts


class ZeroGptSource(GlobalStateSource):
    """A checkpoint of ours as global tensors; a context manager (or `close()` it): it keeps its files open."""

    format_name = FORMAT_NAME
    saves_expert_bias = True

    def __init__(self, iteration_dir: Path, metadata: Optional[dict] = None) -> None:
        self.path = Path(iteration_dir)
        self.metadata = metadata if metadata is not None else read_metadata(self.path)
        self.bytes_read = 0  # tensor bytes and file headers read, for the load's line and its test
        self._keys = PARTITION_TENSORS_OF.get(saved_optimizer(self.metadata), PARTITION_TENSORS_OF["adam"])
        self._files = contextlib.ExitStack()
        self._readers: dict[str, object] = {}
        self._pieces: Optional[dict[str, list[Piece]]] = None
        self._dtypes: dict[str, torch.dtype] = {}

    def __enter__(self) -> "ZeroGptSource":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._files.close()
        self._readers.clear()

    def keys(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def tensors(self, key: str) -> dict[str, GlobalTensorInfo]:
        if key not in self._keys:
            return {}
        self._index()
        dtype = self._dtypes.get(key, torch.float32)
        return {name: GlobalTensorInfo(tuple(entry["shape"]), dtype, real_rows=entry.get("real_rows"))
                for name, entry in self.metadata["parameters"].items()}

    def read(self, key: str, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        def fetch(file: str, begin: int, end: int) -> torch.Tensor:
            values = self._reader(file).range(key, begin, end)
            self.bytes_read += values.numel() * values.element_size()
            return values
        return read_pieces(self._index().get(name, []), name, region, self._dtypes.get(key, torch.float32), fetch,
                           self.path)

    def pieces_by_file(self) -> dict[str, list[tuple[str, "Piece"]]]:
        """Every piece, by the file that holds it, in file order: (parameter name, piece)."""
        by_file: dict[str, list[tuple[str, Piece]]] = {}
        for name, pieces in self._index().items():
            for piece in pieces:
                by_file.setdefault(piece.file, []).append((name, piece))
        return {file: by_file[file] for _, _, file in optimizer_shards(self.metadata) if file in by_file}

    def read_piece(self, key: str, piece: "Piece") -> torch.Tensor:
        """A piece's elements, flat, in its saved slice's order."""
        self.bytes_read += piece.numel * self._dtypes.get(key, torch.float32).itemsize
        return self._reader(piece.file).range(key, piece.partition_offset, piece.partition_offset + piece.numel)

    def progress(self) -> SourceProgress:
        metadata = self.metadata
        scaler = metadata.get("loss_scaler") or {}
        return SourceProgress(
            iteration=metadata["iteration"], consumed_samples=metadata["consumed_samples"],
            schedule_samples=metadata.get("lr_schedule_samples", metadata["consumed_samples"]),
            optimizer_step=metadata["adam_step"], loss_scaler_state=scaler.get("state"),
            extra={"loss_scaler_type": scaler.get("type"), "optimizer": saved_optimizer(metadata),
                   "tensor_parallel_size": metadata["tensor_parallel_size"]})

    def not_carried(self) -> list[str]:
        return []

    def expert_biases(self) -> Optional[dict[str, list[float]]]:
        return self.metadata.get("expert_bias")

    def fp8_histories(self) -> Optional[dict[str, dict[str, list]]]:
        return self.metadata.get("fp8_amax_history")

    def restore_random_states(self, rng, state, log=print) -> None:
        restore_random_states(self.path, self.metadata, rng, state, log)

    def _reader(self, file: str):
        if file not in self._readers:
            self._readers[file] = self._files.enter_context(open_tensors(self.path, file, self.metadata))
        return self._readers[file]

    def _index(self) -> dict[str, list[Piece]]:
        """Every file's pieces by parameter name, copies of the same elements kept once."""
        if self._pieces is not None:
            return self._pieces
        metadata, table = self.metadata, self.metadata["parameters"]
        tp_size = metadata["tensor_parallel_size"]
        pieces: dict[str, list[Piece]] = defaultdict(list)
        covered: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
        for tp, _, file in optimizer_shards(metadata):
            reader = self._reader(file)
            self.bytes_read += _header_bytes(reader.path)
            fragments = reader.fragments(list(self._keys))
            for key in self._keys:
                self._dtypes.setdefault(key, reader.dtype(key))
            records = _records_of(reader.metadata(), reader.path)
            for name, param_offset, partition_offset, numel in fragments:
                if name not in table:
                    raise CheckpointError(f"{reader.path}: its fragment table names {name!r}, which the "
                                          f"checkpoint's parameter table lacks; the checkpoint is corrupt")
                if records is not None:
                    if name not in records:
                        raise CheckpointError(f"{reader.path}: no sharding record for {name!r}; corrupt")
                    offset, shape = records[name]
                else:
                    offset, shape = legacy_record(table[name], tp_size, tp)
                whole = table[name]["shape"]
                if len(offset) != len(whole) or len(shape) != len(whole) \
                        or any(o < 0 or o + n > w for o, n, w in zip(offset, shape, whole)) \
                        or param_offset + numel > math.prod(shape):
                    raise CheckpointError(f"{reader.path}: its fragment of {name!r} does not lie inside the "
                                          f"parameter table's shape {whole}; the checkpoint is corrupt")
                slice_key = (name, offset, shape)
                spans = covered[slice_key]
                for start, end in _uncovered(spans, param_offset, param_offset + numel):
                    pieces[name].append(Piece(file, start, partition_offset + start - param_offset, end - start,
                                              shape, offset))
                spans.append((param_offset, param_offset + numel))
                spans.sort()
        self._pieces = dict(pieces)
        return self._pieces


def _header_bytes(path: Path) -> int:
    """A safetensors file's header (its 8-byte length and the JSON), which opening it reads."""
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def consolidate(iteration_dir: Path, keys: Sequence[str] = ("master",), progress: bool = False
                ) -> dict[str, dict[str, torch.Tensor]]:
    """{key: {parameter name: whole fp32 tensor}} for keys among the optimizer states; each file is read in turn, so
    memory holds the result and one piece. An element no file holds is named."""
    iteration_dir = Path(iteration_dir)
    with ZeroGptSource(iteration_dir) as source:
        infos = source.tensors("master")
        by_file = source.pieces_by_file()
        for name, info in infos.items():  # before allocating: a table asking for more than the files hold
            refuse_short(source._index().get(name, []), name, tuple(slice(0, n) for n in info.shape), iteration_dir)
        result = {key: {name: torch.zeros(info.shape, dtype=torch.float32) for name, info in infos.items()}
                  for key in keys}
        for count, (file, pieces) in enumerate(by_file.items(), 1):
            for name, piece in pieces:
                for key in keys:
                    values = source.read_piece(key, piece)
                    for box in piece.boxes():
                        local = shift(box, [-o for o in piece.global_offset])
                        start = flat_start(piece.local_shape, local) - piece.param_offset
                        result[key][name][box] = values[start:start + box_numel(box)].view(
                            [p.stop - p.start for p in box]).float()
            if progress:
                print(f"  read {file} ({count}/{len(by_file)})", flush=True)
    return result
