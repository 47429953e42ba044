"""Fixed-length GPT samples over an indexed dataset: splits, shuffles, caching and blending. Three index arrays
(document order per epoch, sample starts, serving order) make sample ``i`` a pure function of (data, split, seed,
seq_length, i), so asking for more samples only appends and a resume skips its consumed samples.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import time
from typing import Sequence

import numpy as np
import torch

from base.progress import ProgressLines
from data import DataError

# Blending lives in data.blending; these names stay importable from here.
from data.blending import BlendedDataset, build_blending_indices, samples_per_dataset  # noqa: F401
from data.index_cache import cache_key, load_cached_arrays, save_cached_arrays
from data.indexed import IndexedDataset, index_file_path
from data.token_range import check_token_ids

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "valid", "test")

# Separate streams from the seed keep document order and sample order uncorrelated.
_DOCUMENT_ORDER_STREAM = 1
_SAMPLE_ORDER_STREAM = 2

# Bump when the cached arrays' meaning changes.
_CACHE_FORMAT = 1
# This module's sample order (appendable); data/megatron_order.py has Megatron's.
APPENDABLE_ORDER = "appendable"
_INDEX_KINDS = ("document", "sample", "shuffle")



# Megatron-LM's reading of --split: every run of digits and dots is a weight, whatever lies between ("99,1,0", "99 1 0",
# "'99,1,0'" alike).
SPLIT_WEIGHT = re.compile(r"[.0-9]+")
# Where Megatron's regex would misread a weight (a sign, an exponent, nan/inf), the split is refused.
SPLIT_MISREAD = re.compile(r"[-+A-Za-z]")


def parse_split(split: str) -> tuple[float, float, float]:
    """``"969,30,1"`` -> train/valid/test fractions summing to 1, read as Megatron-LM reads them; missing parts are 0.
    """
    text = str(split)
    if SPLIT_MISREAD.search(text):
        raise DataError(f"--split {split!r}: give up to three non-negative weights as plain numbers, e.g. 969,30,1 "
                        f"(signs, exponents and words are not read as Megatron reads --split)")
    parts = SPLIT_WEIGHT.findall(text)
    if len(parts) > 3:
        raise DataError(f"--split {split!r}: expected up to three weights (train, valid, test), e.g. 969,30,1")
    try:
        values = [float(part) for part in parts]
    except ValueError:  # "1.2.3" or a lone "."; Megatron's float() refuses them too
        raise DataError(f"--split {split!r}: every weight must be a number, e.g. 969,30,1") from None
    if not math.isfinite(sum(values)) or sum(values) <= 0:
        raise DataError(f"--split {split!r}: weights must be finite and not all zero, e.g. 969,30,1")
    values += [0.0] * (3 - len(values))
    total = sum(values)
    return tuple(v / total for v in values)  # type: ignore[return-value]


def split_document_ranges(num_documents: int, split: str | Sequence[float]) -> list[tuple[int, int]]:
    """Contiguous [start, end) document ranges for train, valid and test covering every document, at the rounded
    cumulative fractions (Megatron's per-part rounding can go negative on tiny datasets; this is always monotone)."""
    fractions = parse_split(split) if isinstance(split, str) else tuple(split)
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-6:
        raise DataError(f"split {fractions!r}: need three fractions summing to 1")
    cumulative = np.cumsum(fractions)
    boundaries = [0] + [int(round(c * num_documents)) for c in cumulative]
    boundaries[-1] = num_documents  # guard against 0.9999999 * n rounding down
    return [(boundaries[s], boundaries[s + 1]) for s in range(3)]



def build_document_index(document_ids: np.ndarray, num_epochs: int, seed: int) -> np.ndarray:
    """Document ids in reading order: one permutation per epoch, seeded by (seed, epoch) alone, shuffled in the
    narrowest dtype (numpy draws the same swaps for any dtype)."""
    document_ids = np.asarray(document_ids)
    dtype = np.int32 if document_ids.size == 0 or document_ids.max() <= np.iinfo(np.int32).max else np.int64
    size = document_ids.size
    document_index = np.empty(num_epochs * size, dtype=dtype)
    for epoch in range(num_epochs):
        block = document_index[epoch * size:(epoch + 1) * size]
        block[:] = document_ids
        np.random.default_rng([seed, _DOCUMENT_ORDER_STREAM, epoch]).shuffle(block)
    return document_index


def build_sample_index(
    document_lengths: np.ndarray, document_index: np.ndarray, seq_length: int, num_samples: int
) -> np.ndarray:
    """int64[num_samples + 1, 2]: row k = (position in document_index, offset in that document) of token ``k *
    seq_length``; sample k covers rows k to k+1 inclusive. Linear in documents and samples."""
    document_index = np.asarray(document_index)
    last_needed = num_samples * seq_length  # the inclusive last token of the last sample
    bounds = _document_bounds_through(document_lengths, document_index, last_needed)
    total_tokens = int(bounds[-1])
    if last_needed >= total_tokens:
        raise ValueError(
            f"{num_samples} samples of {seq_length}+1 tokens need {last_needed + 1} tokens, "
            f"the document index holds {total_tokens}"
        )
    # Row k's position counts the documents whose ceil(end / seq_length) is at most k: a histogram and a running sum,
    # linear, instead of a binary search per row.
    first_row_after_end = bounds[1:] + (seq_length - 1)
    if seq_length & (seq_length - 1) == 0:  # the usual power of two: a shift, not a division
        np.right_shift(first_row_after_end, seq_length.bit_length() - 1, out=first_row_after_end)
    else:
        np.floor_divide(first_row_after_end, seq_length, out=first_row_after_end)
    positions = np.cumsum(np.bincount(first_row_after_end)[: num_samples + 1])
    sample_index = np.empty((num_samples + 1, 2), dtype=np.int64)
    sample_index[:, 0] = positions
    sample_index[:, 1] = np.arange(num_samples + 1, dtype=np.int64) * seq_length - bounds[positions]
    return sample_index


def _document_bounds_through(document_lengths: np.ndarray, document_index: np.ndarray, token: int) -> np.ndarray:
    """int64: 0, then the running token count at each document's end, up to the first document holding `token`. Built a
    block at a time (the tail epoch is mostly unneeded), reading lengths as int32 where they fit."""
    document_lengths = np.asarray(document_lengths)
    if document_lengths.size and document_lengths.max() <= np.iinfo(np.int32).max:
        document_lengths = document_lengths.astype(np.int32, copy=False)
    bounds = np.empty(document_index.size + 1, dtype=np.int64)  # pages past what is filled stay untouched
    bounds[0] = 0
    block, filled = 1 << 17, 0
    while filled < document_index.size and bounds[filled] <= token:
        stop = min(document_index.size, filled + block)
        ends = bounds[filled + 1:stop + 1]
        np.cumsum(document_lengths[document_index[filled:stop]], dtype=np.int64, out=ends)
        ends += bounds[filled]
        filled = stop
    return bounds[:filled + 1]


def epochs_needed(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """Fewest epochs whose tokens hold the *start* of ``num_samples`` samples."""
    # E epochs hold ceil(E*T/L) sample starts, and ceil(E*T/L) >= n  <=>  E*T > (n-1)*L.
    return (num_samples - 1) * seq_length // tokens_per_epoch + 1


def epoch_sample_boundaries(tokens_per_epoch: int, seq_length: int, num_epochs: int) -> np.ndarray:
    """int64[num_epochs + 1]: sample k is in epoch e when boundaries[e] <= k < boundaries[e + 1] = ceil((e + 1) T / L).
    """
    epochs = np.arange(num_epochs + 1, dtype=np.int64)
    return (epochs * tokens_per_epoch + seq_length - 1) // seq_length


def build_shuffle_index(epoch_boundaries: Sequence[int], seed: int) -> np.ndarray:
    """Serving order: each epoch's complete block of samples permuted on its own, seeded by (seed, epoch), so earlier
    orders never change when more samples are asked for."""
    boundaries = np.asarray(epoch_boundaries, dtype=np.int64)
    shuffle_index = np.empty(int(np.diff(boundaries).sum()) if boundaries.size > 1 else 0, dtype=np.int64)
    filled = 0
    for epoch, (start, stop) in enumerate(zip(boundaries[:-1].tolist(), boundaries[1:].tolist())):
        size = stop - start
        block = np.arange(size, dtype=np.int32 if size <= np.iinfo(np.int32).max else np.int64)
        np.random.default_rng([seed, _SAMPLE_ORDER_STREAM, epoch]).shuffle(block)
        np.add(block, start, out=shuffle_index[filled:filled + size])
        filled += size
    return shuffle_index



class GPTDataset(torch.utils.data.Dataset):
    """``num_samples`` samples of ``seq_length + 1`` tokens from the given documents of ``indexed``, shuffled by
    document, in this project's order (data/megatron_order.py's subclass reads Megatron-Core's)."""

    order = APPENDABLE_ORDER

    def __init__(
        self,
        indexed: IndexedDataset,
        document_ids: np.ndarray,
        num_samples: int,
        seq_length: int,
        seed: int,
        name: str,
        cache_dir: str | None = None,
    ):
        if num_samples < 1 or seq_length < 1 or seed < 0:
            raise ValueError(
                f"{name}: need num_samples >= 1, seq_length >= 1, seed >= 0 "
                f"(got {num_samples}, {seq_length}, {seed})"
            )
        self.indexed = indexed
        self.name = name
        self.num_samples = num_samples
        self.seq_length = seq_length
        self.seed = seed
        self.document_ids = np.asarray(document_ids, dtype=np.int64)
        if self.document_ids.size == 0:
            raise DataError(f"{indexed.prefix}: the {name} split has no documents; adjust --split or add data")
        if self.document_ids.min() < 0 or self.document_ids.max() >= indexed.num_documents:
            raise DataError(f"{indexed.prefix}: {name} document ids outside [0, {indexed.num_documents})")
        self.document_lengths = indexed.document_lengths
        self.tokens_per_epoch = int(self.document_lengths[self.document_ids].sum())
        if self.tokens_per_epoch == 0:
            raise DataError(f"{indexed.prefix}: the {name} split has {self.document_ids.size} documents but no tokens")
        self.num_epochs = self._epochs_needed()

        self.cache_paths = self._cache_paths(cache_dir)
        self.loaded_from_cache = False
        self.build_seconds: dict[str, float] = {}
        indices = self._load_cache()
        if indices is None:  # a large corpus takes minutes here (once: the result is cached)
            progress = ProgressLines()
            progress.start(f"data: building the {name} index of {indexed.prefix}: {num_samples:,} samples "
                           f"of {seq_length + 1} tokens over {self.num_epochs} epoch(s)")
            indices = self._build_indices()
            began = time.perf_counter()
            save_cached_arrays(self.cache_paths, dict(zip(_INDEX_KINDS, indices)), self.name)
            self.build_seconds["cache_write"] = time.perf_counter() - began
            progress.done(f"data: built the {name} index of {indexed.prefix}")
            logger.info("built the %s indices of %s in %.2f s (%s)", self.name, indexed.prefix,
                        sum(self.build_seconds.values()),
                        ", ".join(f"{kind} {seconds:.2f} s" for kind, seconds in self.build_seconds.items()))
        else:
            self.loaded_from_cache = True
        self.document_index, self.sample_index, self.shuffle_index = indices

    def _epochs_needed(self) -> int:
        return epochs_needed(self.tokens_per_epoch, self.seq_length, self.num_samples)

    def _build_indices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        boundaries = epoch_sample_boundaries(self.tokens_per_epoch, self.seq_length, self.num_epochs)
        samples_built = int(boundaries[-1])
        # The last sample may run into later epochs: build the document order far enough to hold it.
        tokens_needed = samples_built * self.seq_length + 1
        document_epochs = -(-tokens_needed // self.tokens_per_epoch)
        began = time.perf_counter()
        document_index = build_document_index(self.document_ids, document_epochs, self.seed)
        documents_done = time.perf_counter()
        sample_index = build_sample_index(self.document_lengths, document_index, self.seq_length, samples_built)
        samples_done = time.perf_counter()
        shuffle_index = build_shuffle_index(boundaries, self.seed)[: self.num_samples]
        self.build_seconds = {"document": documents_done - began, "sample": samples_done - documents_done,
                              "shuffle": time.perf_counter() - samples_done}
        return document_index, sample_index, shuffle_index

    def _cache_key(self) -> str:
        identity = getattr(self.indexed, "cache_identity", None)  # data without an index file (data/mock.py)
        if identity is None:
            stat = os.stat(index_file_path(self.indexed.prefix))
            identity = {"prefix": os.path.abspath(self.indexed.prefix), "index_size": stat.st_size,
                        "index_mtime_ns": stat.st_mtime_ns}
        return cache_key({
            "format": _CACHE_FORMAT,
            **({"order": self.order} if self.order != APPENDABLE_ORDER else {}),  # keys of this order unchanged
            **identity,
            "documents": _describe_ids(self.document_ids),
            "num_samples": self.num_samples,
            "seq_length": self.seq_length,
            "seed": self.seed,
            "name": self.name,
        })

    def _cache_paths(self, cache_dir: str | None) -> dict[str, str]:
        directory = cache_dir if cache_dir is not None else os.path.dirname(os.path.abspath(self.indexed.prefix))
        stem = f"{os.path.basename(self.indexed.prefix)}_{self.name}_{self._cache_key()}"
        return {kind: os.path.join(directory, f"{stem}_{kind}_index.npy") for kind in _INDEX_KINDS}

    def _load_cache(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        arrays = load_cached_arrays(self.cache_paths, self.name)
        if arrays is None:
            return None
        document_index, sample_index, shuffle_index = (arrays[kind] for kind in _INDEX_KINDS)
        if sample_index.ndim != 2 or sample_index.shape[1] != 2 or shuffle_index.shape != (self.num_samples,):
            logger.warning("ignoring index cache for %s with unexpected shapes; rebuilding", self.name)
            return None
        return document_index, sample_index, shuffle_index

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"{self.name}: sample {i} out of range [0, {self.num_samples})")
        j = int(self.shuffle_index[i])
        first_position, first_offset = (int(v) for v in self.sample_index[j])
        last_position, last_offset = (int(v) for v in self.sample_index[j + 1])
        documents = self.document_index
        read = self.indexed.get_document
        if first_position == last_position:
            parts = [read(int(documents[first_position]), first_offset, last_offset - first_offset + 1)]
        else:
            parts = [read(int(documents[first_position]), first_offset)]
            parts += [read(int(documents[p])) for p in range(first_position + 1, last_position)]
            parts.append(read(int(documents[last_position]), 0, last_offset + 1))
        tokens = np.concatenate(parts).astype(np.int64)
        return {"tokens": torch.from_numpy(tokens)}


def _describe_ids(ids: np.ndarray) -> str:
    """A cache-key description of document ids: the range when contiguous, else a hash of every id."""
    if ids.size and int(ids[-1]) - int(ids[0]) == ids.size - 1 and bool((np.diff(ids) == 1).all()):
        return f"range({int(ids[0])}, {int(ids[-1]) + 1})"
    return hashlib.sha256(ids.tobytes()).hexdigest()



def parse_data_path(data_path: Sequence[str]) -> tuple[list[str], list[float] | None]:
    """``["A"]`` -> (["A"], [1.0]); ``["0.3", "A", "0.7", "B"]`` -> (["A", "B"], [0.3, 0.7]); prefixes alone ->
    (prefixes, None), blended by size. Megatron-Core's get_blend_from_list rule; a mixed list is refused."""
    data_path = list(data_path)
    if not data_path:
        raise DataError("--data-path: no dataset given")
    if len(data_path) == 1:
        return data_path, [1.0]
    pairs = list(zip(data_path[0::2], data_path[1::2])) if len(data_path) % 2 == 0 else []
    numbers = [_number(weight_text) for weight_text, _ in pairs]
    if not pairs or all(number is None for number in numbers):
        return data_path, None
    prefixes, weights = [], []
    for (weight_text, prefix), weight in zip(pairs, numbers):
        if weight is None:
            raise DataError(f"--data-path: weight {weight_text!r} (before {prefix!r}) is not a number; give a "
                            f"weight before every prefix, or prefixes alone (blended by their sizes)")
        if not math.isfinite(weight) or weight <= 0:
            raise DataError(f"--data-path: weight {weight_text!r} of {prefix!r} must be a positive number")
        prefixes.append(prefix)
        weights.append(weight)
    total = sum(weights)
    return prefixes, [w / total for w in weights]


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def epoch_samples(indexed: IndexedDataset, document_range: tuple[int, int], seq_length: int) -> int:
    """Samples in one epoch of documents [start, end), by Megatron-Core's GPTDataset arithmetic: what an unweighted
    prefix weighs in a blend."""
    start, end = document_range
    tokens = int(indexed.document_lengths[start:end].sum())
    return max(0, (tokens - 1) // seq_length)


def split_epoch_samples(members: Sequence[tuple[IndexedDataset, tuple[int, int]]], seq_length: int) -> int:
    """One epoch of a split's data: the members' `epoch_samples` summed (at least 1), a function of the data alone."""
    return max(1, sum(epoch_samples(ds, document_range, seq_length) for ds, document_range in members))


def build_train_valid_test_datasets(
    data_path: Sequence[str],
    split: str,
    seq_length: int,
    seed: int,
    num_samples: tuple[int | None, int | None, int | None],
    cache_dir: str | None = None,
    vocab_size: int | None = None,
    dataset_class: type[GPTDataset] = GPTDataset,
) -> tuple[torch.utils.data.Dataset | None, torch.utils.data.Dataset | None, torch.utils.data.Dataset | None]:
    """Train, valid and test datasets, each None when it gets no samples or documents. Every prefix is split by
    documents with the same ratios and blended (unweighted prefixes by one epoch's samples, as Megatron-Core does); a
    count of None asks for one epoch. With `vocab_size`, every token id is checked below it."""
    if len(num_samples) != 3 or any(n is not None and n < 0 for n in num_samples):
        raise ValueError(f"num_samples must be three non-negative counts or None, got {num_samples}")
    prefixes, weights = parse_data_path(data_path)
    fractions = parse_split(split)
    indexed = [IndexedDataset(prefix) for prefix in prefixes]
    for ds in indexed if vocab_size is not None else ():
        check_token_ids(ds, vocab_size)
    ranges = [split_document_ranges(ds.num_documents, fractions) for ds in indexed]

    for ds, document_ranges in zip(indexed, ranges):
        start, end = document_ranges[0]
        if end == start:
            raise DataError(
                f"{ds.prefix}: the train split has no documents ({ds.num_documents} documents in the "
                f"dataset, --split {split!r})"
            )

    results: list[torch.utils.data.Dataset | None] = []
    for s, split_name in enumerate(SPLIT_NAMES):
        members = [
            (ds, document_ranges[s], weight)
            for ds, document_ranges, weight in zip(indexed, ranges, weights or [None] * len(indexed))
            if document_ranges[s][1] > document_ranges[s][0]
        ]
        results.append(blend_split(members, weights is not None, num_samples[s], seq_length, seed, split_name,
                                   cache_dir, dataset_class))
    return results[0], results[1], results[2]


def blend_split(members: list[tuple[IndexedDataset, tuple[int, int], float | None]], weighted: bool,
                num_samples: int | None, seq_length: int, seed: int, split_name: str, cache_dir: str | None,
                dataset_class: type[GPTDataset] = GPTDataset) -> torch.utils.data.Dataset | None:
    """One split's dataset from its members: one GPTDataset, or a blend by weights or (`weighted` False) by one epoch's
    samples each. None when the split gets no samples; `num_samples` None: one epoch of the split's data."""
    if num_samples is None:
        num_samples = split_epoch_samples([(ds, document_range) for ds, document_range, _ in members], seq_length)
    if not weighted:  # blended by size: one epoch's samples each, a member holding none left out
        sized = [(ds, document_range, epoch_samples(ds, document_range, seq_length))
                 for ds, document_range, _ in members]
        members = [member for member in sized if member[2] > 0] or [(ds, r, 1) for ds, r, _ in sized[:1]]
    if num_samples == 0 or not members:
        return None
    total_weight = sum(weight for _, _, weight in members)
    member_weights = [weight / total_weight for _, _, weight in members]
    counts = [num_samples] if len(members) == 1 else samples_per_dataset(member_weights, num_samples)
    parts = [
        dataset_class(ds, np.arange(*document_range, dtype=np.int64), count, seq_length, seed, split_name, cache_dir)
        for (ds, document_range, _), count in zip(members, counts)
    ]
    if len(parts) == 1:
        return parts[0]
    # Blending indices depend only on the weights and the count; cached beside the first member's data by default.
    blend_cache = cache_dir if cache_dir is not None else os.path.dirname(os.path.abspath(members[0][0].prefix))
    return BlendedDataset(parts, member_weights, num_samples, cache_dir=blend_cache)
