"""Token ids in range: every id in a dataset's .bin must index the model's vocabulary, else tensor parallelism trains on
zero vectors silently. One chunked min/max pass when a dataset is opened, cached beside the index; an id out of range is
a `DataError` naming the file, document and position.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Optional

import numpy as np

from base.progress import ProgressLines
from data import DataError
from data.indexed import IndexedDataset

logger = logging.getLogger(__name__)

# Tokens per chunk of the min/max pass (64 MiB of uint16).
CHUNK_TOKENS = 32 << 20
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class TokenRange:
    low: Optional[int]   # None for a dataset with no tokens
    high: Optional[int]


def range_cache_path(prefix: str) -> str:
    return prefix + ".token_range.json"


def _fingerprint(dataset: IndexedDataset) -> dict:
    """What the cached range is valid for: both files exactly as they are now."""
    fingerprint = {"format": _CACHE_FORMAT}
    for kind, path in (("idx", dataset.index_path), ("bin", dataset.data_path)):
        stat = os.stat(path)
        fingerprint[f"{kind}_size"], fingerprint[f"{kind}_mtime_ns"] = stat.st_size, stat.st_mtime_ns
    return fingerprint


def scan_token_range(dataset: IndexedDataset, chunk_tokens: int = CHUNK_TOKENS,
                     progress: Optional[ProgressLines] = None) -> TokenRange:
    """The smallest and largest token id in the dataset's .bin, one chunk in memory at a time."""
    tokens = dataset.num_tokens
    if tokens == 0:
        return TokenRange(None, None)
    progress = progress or ProgressLines(emit=None)
    progress.start(f"data: checking the token ids of {dataset.prefix} ({tokens:,} tokens)")
    data = np.memmap(dataset.data_path, dtype=dataset.dtype, mode="r", shape=(tokens,))
    low, high = None, None
    for start in range(0, tokens, chunk_tokens):
        chunk = data[start:start + chunk_tokens]
        chunk_low, chunk_high = chunk.min().item(), chunk.max().item()
        low = chunk_low if low is None else min(low, chunk_low)
        high = chunk_high if high is None else max(high, chunk_high)
        progress.update(lambda: f"data: checked {min(start + chunk_tokens, tokens):,} of {tokens:,} token ids "
                                f"of {dataset.prefix}")
    del data
    progress.done(f"data: token ids of {dataset.prefix} are in [{low}, {high}]")
    return TokenRange(int(low), int(high))


def cached_token_range(dataset: IndexedDataset, chunk_tokens: int = CHUNK_TOKENS) -> TokenRange:
    """`scan_token_range`, from the cache beside the index when it matches the files; a fresh scan is written there if
    it can be."""
    path = range_cache_path(dataset.prefix)
    fingerprint = _fingerprint(dataset)
    try:
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
        if isinstance(cached, dict) and cached.get("fingerprint") == fingerprint:
            low, high = cached.get("low"), cached.get("high")
            if all(value is None or (isinstance(value, int) and not isinstance(value, bool)) for value in (low, high)):
                return TokenRange(low, high)
    except (OSError, ValueError, RecursionError):
        pass  # no cache yet, or not one we wrote: scan
    result = scan_token_range(dataset, chunk_tokens, ProgressLines())  # ~1 s per GB: say so on a big corpus
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump({"fingerprint": fingerprint, "low": result.low, "high": result.high}, f)
        os.replace(temporary, path)
    except OSError as error:
        logger.warning("cannot cache the token range of %s beside it (%s); it is scanned again next time",
                       dataset.prefix, error)
        try:
            os.remove(temporary)
        except OSError:
            pass
    return result


def first_out_of_range(dataset: IndexedDataset, vocab_size: int,
                       chunk_tokens: int = CHUNK_TOKENS) -> Optional[tuple[int, int, int]]:
    """(document, position in it, id) of the first token outside [0, vocab_size), or None."""
    data = np.memmap(dataset.data_path, dtype=dataset.dtype, mode="r", shape=(dataset.num_tokens,))
    for start in range(0, dataset.num_tokens, chunk_tokens):
        chunk = np.asarray(data[start:start + chunk_tokens])
        bad = np.flatnonzero((chunk < 0) | (chunk >= vocab_size))
        if bad.size:
            offset = start + int(bad[0])
            document = int(np.searchsorted(dataset.document_token_offsets, offset, side="right")) - 1
            return document, offset - int(dataset.document_token_offsets[document]), int(chunk[bad[0]])
    return None


def check_token_ids(dataset: IndexedDataset, vocab_size: int, chunk_tokens: int = CHUNK_TOKENS) -> TokenRange:
    """Raise DataError unless every token id of `dataset` is in [0, vocab_size)."""
    if dataset.dtype.kind not in "iu":
        raise DataError(f"{dataset.index_path}: token ids stored as {dataset.dtype}; token ids are integers")
    found = cached_token_range(dataset, chunk_tokens)
    if found.low is None or (found.low >= 0 and found.high < vocab_size):
        return found
    location = first_out_of_range(dataset, vocab_size, chunk_tokens)
    if location is None:  # The cache described an earlier file of the same size and time: all in range.
        return scan_token_range(dataset, chunk_tokens)
    document, position, token = location
    raise DataError(f"{dataset.data_path}: document {document} holds token id {token} at position {position}, "
                    f"outside the tokenizer's vocabulary [0, {vocab_size}) (ids in the file span "
                    f"{found.low}..{found.high}); was it prepared with another tokenizer?")
