"""Megatron-compatible indexed dataset: a flat token file (.bin) plus an index (.idx) in Megatron-LM's ``MMIDIDX``
layout, byte for byte, so data prepared there works here and back. A document is consecutive sequences, one contiguous
run of tokens, so a slice of it is read without touching the rest.
"""

from __future__ import annotations

import array
import os
import shutil
import struct
from typing import Iterable

import numpy as np

from data import DataError
from data.prefix_hint import prefix_hint

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
# magic + version <Q + dtype code <B + sequence count <Q + document count <Q
HEADER_SIZE = len(MAGIC) + 8 + 1 + 8 + 8

# Megatron's codes (indexed_dataset.py DType); never renumber them.
DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float64),
    7: np.dtype(np.float32),
    8: np.dtype(np.uint16),
}
_CODE_OF_DTYPE = {dtype: code for code, dtype in DTYPE_CODES.items()}

# Pointer validation reads the index in slices this big, bounding memory on huge corpora.
_VALIDATION_CHUNK = 1 << 22


def best_dtype(vocab_size: int) -> np.dtype:
    """The smallest token dtype Megatron would pick for this vocabulary."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def data_file_path(prefix: str) -> str:
    return prefix + ".bin"


def index_file_path(prefix: str) -> str:
    return prefix + ".idx"


def _dtype_code(dtype) -> int:
    dtype = np.dtype(dtype)
    if dtype not in _CODE_OF_DTYPE:
        supported = ", ".join(str(d) for d in DTYPE_CODES.values())
        raise ValueError(f"dtype {dtype} cannot be stored in an MMIDIDX dataset; use one of {supported}")
    return _CODE_OF_DTYPE[dtype]


class IndexedDatasetWriter:
    """Writes ``<prefix>.bin`` and ``<prefix>.idx``: tokens stream to a temporary file and ``finalize`` renames both
    into place, so a crash never leaves a half-written dataset that looks valid."""

    def __init__(self, prefix: str, dtype):
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        self._dtype_code = _dtype_code(self.dtype)
        suffix = f".tmp-{os.getpid()}-{id(self):x}"
        self._tmp_bin = data_file_path(prefix) + suffix
        self._tmp_idx = index_file_path(prefix) + suffix
        self._bin = open(self._tmp_bin, "wb")
        # array.array keeps 4/8 bytes per entry, a tenth of a list's.
        self._sequence_lengths = array.array("i")
        self._document_indices = array.array("q", [0])
        self._finalized = False

    def __enter__(self) -> "IndexedDatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            if not self._finalized:
                self.finalize()
        else:
            self.discard()

    @property
    def _has_open_document(self) -> bool:
        return len(self._sequence_lengths) != self._document_indices[-1]

    def _check_writable(self) -> None:
        if self._finalized:
            raise ValueError(f"dataset {self.prefix!r} is already finalized; open a new writer")

    def add_sequence(self, tokens: Iterable[int] | np.ndarray) -> None:
        """Append one sequence to the current document (closed by ``end_document``)."""
        self._check_writable()
        values = np.asarray(tokens)
        if values.ndim != 1:
            raise DataError(f"{self.prefix}: a sequence must be 1-D, got shape {values.shape}")
        if values.size and self.dtype.kind in "iu" and values.dtype.kind in "iub":
            info = np.iinfo(self.dtype)
            low, high = values.min(), values.max()
            if low < info.min or high > info.max:
                raise DataError(
                    f"{self.prefix}: token values [{low}, {high}] do not fit the dataset dtype "
                    f"{self.dtype}; pick a wider dtype (best_dtype(vocab_size))"
                )
        if values.size > np.iinfo(np.int32).max:
            raise DataError(f"{self.prefix}: a sequence of {values.size} tokens exceeds int32 lengths")
        self._bin.write(values.astype(self.dtype, copy=False).tobytes(order="C"))
        self._sequence_lengths.append(values.size)

    def end_document(self) -> None:
        """Close the current document: the sequences added since the last call form one."""
        self._check_writable()
        self._document_indices.append(len(self._sequence_lengths))

    def add_document(self, tokens: Iterable[int] | np.ndarray) -> None:
        """Append a document made of a single sequence."""
        self.add_sequence(tokens)
        self.end_document()

    def merge(self, other_prefix: str) -> None:
        """Append every document of an existing dataset (e.g. one worker's shard) to this one."""
        self._check_writable()
        if self._has_open_document:
            raise ValueError(
                f"{self.prefix}: call end_document() before merge(); the open document would "
                f"otherwise swallow the first document of {other_prefix!r}"
            )
        other = IndexedDataset(other_prefix)
        if other.dtype != self.dtype:
            raise DataError(
                f"{index_file_path(other_prefix)}: dtype {other.dtype} differs from {self.dtype} "
                f"of the dataset being written to {self.prefix!r}"
            )
        offset = len(self._sequence_lengths)
        self._sequence_lengths.extend(np.asarray(other.sequence_lengths, dtype=np.int32).tolist())
        self._document_indices.extend((np.asarray(other.document_indices[1:]) + offset).tolist())
        other.close()
        with open(data_file_path(other_prefix), "rb") as source:
            shutil.copyfileobj(source, self._bin, length=16 << 20)

    def finalize(self) -> None:
        """Write the index and move both files into place, closing an open document first."""
        self._check_writable()
        if self._has_open_document:
            self.end_document()
        self._bin.close()
        lengths = np.frombuffer(self._sequence_lengths, dtype=np.int32)
        pointers = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        document_indices = np.frombuffer(self._document_indices, dtype=np.int64)
        with open(self._tmp_idx, "wb") as index:
            index.write(MAGIC)
            index.write(struct.pack("<Q", VERSION))
            index.write(struct.pack("<B", self._dtype_code))
            index.write(struct.pack("<Q", len(lengths)))
            index.write(struct.pack("<Q", len(document_indices)))
            index.write(lengths.astype("<i4").tobytes())
            index.write(pointers.astype("<i8").tobytes())
            index.write(document_indices.astype("<i8").tobytes())
        # .bin first: a reader only trusts a dataset once the .idx describing it exists.
        os.replace(self._tmp_bin, data_file_path(self.prefix))
        os.replace(self._tmp_idx, index_file_path(self.prefix))
        self._finalized = True

    def discard(self) -> None:
        """Drop everything written so far; the files at ``prefix`` (if any) stay untouched."""
        if self._finalized:
            return
        self._bin.close()
        for path in (self._tmp_bin, self._tmp_idx):
            if os.path.exists(path):
                os.remove(path)
        self._finalized = True


class IndexedDataset:
    """Memory-mapped reader of ``<prefix>.bin``/``<prefix>.idx``, validated on open; ``len`` and ``[i]`` count sequences
    (as in Megatron)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.index_path = index_file_path(prefix)
        self.data_path = data_file_path(prefix)
        for path in (self.index_path, self.data_path):
            if not os.path.isfile(path):
                raise DataError(f"{path}: file not found (expected an MMIDIDX dataset at prefix {prefix!r})"
                                f"{prefix_hint(prefix)}")
        self._read_index()
        self._check_data_file()
        self._bin = (
            np.memmap(self.data_path, dtype=self._dtype, mode="r")
            if self.num_tokens
            else np.zeros(0, dtype=self._dtype)  # np.memmap refuses empty files
        )
        self._document_token_offsets = None

    # Pickling a memmap copies the mapped bytes into every spawned worker: ship the prefix and map again.
    def __getstate__(self) -> dict:
        return {"prefix": self.prefix}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["prefix"])

    def _read_index(self) -> None:
        path = self.index_path
        file_size = os.path.getsize(path)
        with open(path, "rb") as index:
            header = index.read(HEADER_SIZE)
        if len(header) < len(MAGIC) or header[: len(MAGIC)] != MAGIC:
            raise DataError(f"{path}: not an MMIDIDX index (bad magic {header[:len(MAGIC)]!r})")
        if len(header) < HEADER_SIZE:
            raise DataError(f"{path}: truncated header ({file_size} bytes, need {HEADER_SIZE})")
        (version,) = struct.unpack_from("<Q", header, len(MAGIC))
        if version != VERSION:
            raise DataError(f"{path}: unsupported MMIDIDX version {version} (this reader knows {VERSION})")
        (code,) = struct.unpack_from("<B", header, len(MAGIC) + 8)
        if code not in DTYPE_CODES:
            raise DataError(f"{path}: unknown dtype code {code} (known: {sorted(DTYPE_CODES)})")
        sequence_count, document_count = struct.unpack_from("<QQ", header, len(MAGIC) + 9)
        expected = HEADER_SIZE + sequence_count * (4 + 8) + document_count * 8
        if file_size != expected:
            raise DataError(
                f"{path}: {file_size} bytes but the header ({sequence_count} sequences, "
                f"{document_count} document indices) implies {expected}; the file is truncated or corrupt"
            )
        if document_count < 1:
            raise DataError(f"{path}: document index is empty (it must at least hold the leading 0)")
        self._dtype = DTYPE_CODES[code]
        mapped = np.memmap(path, dtype=np.uint8, mode="r")
        offset = HEADER_SIZE
        self._sequence_lengths = mapped[offset : offset + 4 * sequence_count].view("<i4")
        offset += 4 * sequence_count
        self._sequence_pointers = mapped[offset : offset + 8 * sequence_count].view("<i8")
        offset += 8 * sequence_count
        self._document_indices = mapped[offset : offset + 8 * document_count].view("<i8")
        self._check_document_indices()

    def _check_document_indices(self) -> None:
        docs = self._document_indices
        n = len(self._sequence_lengths)
        if docs[0] != 0 or docs[-1] != n or np.any(np.diff(docs) < 0):
            raise DataError(
                f"{self.index_path}: document indices must rise from 0 to the sequence count {n} "
                f"(got first {docs[0]}, last {docs[-1]})"
            )

    def _check_data_file(self) -> None:
        """Lengths, pointers and the .bin size must agree, or reads would return the wrong tokens."""
        itemsize = self._dtype.itemsize
        lengths, pointers = self._sequence_lengths, self._sequence_pointers
        next_pointer = 0
        num_tokens = 0
        for start in range(0, len(lengths), _VALIDATION_CHUNK):
            chunk_lengths = lengths[start : start + _VALIDATION_CHUNK].astype(np.int64)
            if np.any(chunk_lengths < 0):
                raise DataError(f"{self.index_path}: negative sequence length near sequence {start}")
            expected = np.empty_like(chunk_lengths)
            expected[0] = next_pointer
            np.cumsum(chunk_lengths[:-1] * itemsize, out=expected[1:])
            expected[1:] += next_pointer
            mismatch = np.flatnonzero(pointers[start : start + _VALIDATION_CHUNK] != expected)
            if mismatch.size:
                bad = start + int(mismatch[0])
                raise DataError(
                    f"{self.index_path}: pointer of sequence {bad} is {pointers[bad]} but the lengths "
                    f"before it put it at byte {expected[mismatch[0]]}"
                )
            next_pointer = int(expected[-1] + chunk_lengths[-1] * itemsize)
            num_tokens += int(chunk_lengths.sum())
        self._num_tokens = num_tokens
        bin_size = os.path.getsize(self.data_path)
        if bin_size != num_tokens * itemsize:
            raise DataError(
                f"{self.data_path}: {bin_size} bytes but the index describes {num_tokens} tokens of "
                f"{self._dtype} ({num_tokens * itemsize} bytes); the files do not belong together or "
                f"one is truncated"
            )

    def close(self) -> None:
        """Release the memory maps (reads afterwards fail); garbage collection does it too."""
        for name in ("_bin", "_sequence_lengths", "_sequence_pointers", "_document_indices"):
            setattr(self, name, None)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def sequence_lengths(self) -> np.ndarray:
        return self._sequence_lengths

    @property
    def sequence_pointers(self) -> np.ndarray:
        return self._sequence_pointers

    @property
    def document_indices(self) -> np.ndarray:
        return self._document_indices

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def num_documents(self) -> int:
        return len(self._document_indices) - 1

    @property
    def document_token_offsets(self) -> np.ndarray:
        """int64[num_documents + 1]: token offset in .bin where each document starts, then the total."""
        if self._document_token_offsets is None:
            token_starts = np.empty(len(self) + 1, dtype=np.int64)
            token_starts[:-1] = self._sequence_pointers // self._dtype.itemsize
            token_starts[-1] = self._num_tokens
            self._document_token_offsets = token_starts[np.asarray(self._document_indices)]
        return self._document_token_offsets

    @property
    def document_lengths(self) -> np.ndarray:
        """int64[num_documents]: tokens per document (the sum over its sequences)."""
        return np.diff(self.document_token_offsets)

    def __len__(self) -> int:
        return len(self._sequence_lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.get(i)

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of sequence ``i``; reads only those bytes."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {len(self)} sequences in {self.prefix!r}")
        i = i % len(self)
        start = int(self._sequence_pointers[i]) // self._dtype.itemsize
        return self._slice(start, int(self._sequence_lengths[i]), offset, length, f"sequence {i}")

    def get_document(self, d: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset + length)`` of document ``d`` (across its sequences)."""
        if not 0 <= d < self.num_documents:
            raise IndexError(f"document {d} out of range for {self.num_documents} documents in {self.prefix!r}")
        starts = self.document_token_offsets
        start = int(starts[d])
        return self._slice(start, int(starts[d + 1]) - start, offset, length, f"document {d}")

    def _slice(self, start: int, size: int, offset: int, length: int | None, what: str) -> np.ndarray:
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"{what} has {size} tokens; cannot read [{offset}, {offset + length})")
        return np.asarray(self._bin[start + offset : start + offset + length])
