"""Fixed-length GPT samples over an indexed dataset: splits, shuffles, caching and blending.

The documents of a split are laid end to end in a shuffled order, epoch after epoch, and cut into
samples of ``seq_length + 1`` tokens (inputs plus the labels shifted by one); consecutive samples
share their boundary token, as in Megatron. Three index arrays describe this:

- document index: the document ids in reading order, one permutation per epoch;
- sample index:   row k = (position in the document index, token offset) where sample k starts;
- shuffle index:  the order in which samples are served.

Every array is built so that sample ``i`` is a pure function of (data, split, seed, seq_length, i):
asking for more samples only appends to them. A run resumes by skipping its consumed samples, and
the number of samples requested (e.g. a longer schedule) never changes the ones already seen.
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

# Blending lives in data.blending; these names stay importable from here (public API).
from data.blending import BlendedDataset, build_blending_indices, samples_per_dataset  # noqa: F401
from data.index_cache import cache_key, load_cached_arrays, save_cached_arrays
from data.indexed import IndexedDataset, index_file_path
from data.token_range import check_token_ids

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "valid", "test")

# Independent random streams derived from the user's seed. Tagging the purpose keeps the document
# order and the sample order uncorrelated even though both are seeded per epoch.
_DOCUMENT_ORDER_STREAM = 1
_SAMPLE_ORDER_STREAM = 2

# Bump when the meaning of the cached arrays changes, so stale caches are never loaded.
_CACHE_FORMAT = 1
# This module's sample order, whose samples only append as more are asked for; data/megatron_order.py has Megatron's.
APPENDABLE_ORDER = "appendable"
_INDEX_KINDS = ("document", "sample", "shuffle")


# --------------------------------------------------------------------------- splits


# Megatron-LM's reading of --split (megatron/core/datasets/blended_megatron_dataset_config.py,
# parse_and_normalize_split): every run of digits and dots is a weight, whatever lies between them, so
# "99,1,0", "'99,1,0'" (a launch script's unquoted array keeps the quotes), "99 1 0" and "99/1/0" are the same.
SPLIT_WEIGHT = re.compile(r"[.0-9]+")
# Where Megatron's regex would misread a weight rather than separate two (a sign, an exponent, nan/inf),
# the split is refused instead of run with numbers the user did not write.
SPLIT_MISREAD = re.compile(r"[-+A-Za-z]")


def parse_split(split: str) -> tuple[float, float, float]:
    """``"969,30,1"`` -> train/valid/test fractions summing to 1, read as Megatron-LM reads them (SPLIT_WEIGHT).
    Missing trailing parts count as 0."""
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
    """Contiguous [start, end) document ranges for train, valid and test that cover every document.

    Boundaries are the rounded cumulative fractions. Megatron rounds each part and then shifts all
    boundaries by the rounding excess, which can produce a negative boundary on tiny datasets;
    rounding the cumulative sum is equally close to the requested ratios and always monotone.
    """
    fractions = parse_split(split) if isinstance(split, str) else tuple(split)
    if len(fractions) != 3 or abs(sum(fractions) - 1.0) > 1e-6:
        raise DataError(f"split {fractions!r}: need three fractions summing to 1")
    cumulative = np.cumsum(fractions)
    boundaries = [0] + [int(round(c * num_documents)) for c in cumulative]
    boundaries[-1] = num_documents  # guard against 0.9999999 * n rounding down
    return [(boundaries[s], boundaries[s + 1]) for s in range(3)]


# --------------------------------------------------------------------------- index builders


def build_document_index(document_ids: np.ndarray, num_epochs: int, seed: int) -> np.ndarray:
    """Document ids in reading order: one independent permutation per epoch.

    Epoch ``e`` is drawn from a generator seeded with (seed, e) alone, so its order does not depend
    on how many epochs are built. Each epoch is shuffled in place in the output, in the narrowest
    dtype that holds the ids: numpy's shuffle draws the same swaps for any dtype, so the order is
    that of ``permutation(document_ids)``, with half the memory traffic for int32.
    """
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
    """int64[num_samples + 1, 2]: row k = (position in document_index, offset in that document) of
    token ``k * seq_length`` of the concatenated documents.

    Sample k covers the tokens from row k to row k+1 inclusive (seq_length + 1 tokens). A token is
    located in the first document whose end lies beyond it, so zero-length documents are skipped.
    Vectorised and linear in the documents and samples: billions of tokens take seconds.
    """
    document_index = np.asarray(document_index)
    last_needed = num_samples * seq_length  # the inclusive last token of the last sample
    # bounds[p] = tokens before the document at position p, bounds[p + 1] = tokens through it.
    bounds = _document_bounds_through(document_lengths, document_index, last_needed)
    total_tokens = int(bounds[-1])
    if last_needed >= total_tokens:
        raise ValueError(
            f"{num_samples} samples of {seq_length}+1 tokens need {last_needed + 1} tokens, "
            f"the document index holds {total_tokens}"
        )
    # Row k's position is the number of documents that end at or before token k * seq_length
    # (searchsorted(ends, k * seq_length, side="right")), i.e. whose ceil(end / seq_length) is at
    # most k: a histogram of that value and a running sum give every row in linear time, where a
    # binary search per row would cost log(documents) cache misses each.
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
    """int64: 0, then the running token count at the end of each document of `document_index`, up to
    the first document that holds `token` (through all of them if none does).

    Computed a block of documents at a time: the document index usually holds a whole extra epoch
    for the tail of the last sample, and only its first few documents are needed. Lengths are read
    as int32 where they fit: the read in document order is a random gather, and half the bytes
    miss the cache half as often.
    """
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
    # Samples start at multiples of seq_length; E epochs hold ceil(E*T/L) starts, and
    # ceil(E*T/L) >= n  <=>  E*T > (n-1)*L.
    return (num_samples - 1) * seq_length // tokens_per_epoch + 1


def epoch_sample_boundaries(tokens_per_epoch: int, seq_length: int, num_epochs: int) -> np.ndarray:
    """int64[num_epochs + 1]: sample k belongs to epoch e when its first token lies in epoch e,
    i.e. boundaries[e] <= k < boundaries[e + 1], with boundaries[e] = ceil(e * T / L)."""
    epochs = np.arange(num_epochs + 1, dtype=np.int64)
    return (epochs * tokens_per_epoch + seq_length - 1) // seq_length


def build_shuffle_index(epoch_boundaries: Sequence[int], seed: int) -> np.ndarray:
    """Serving order of samples: each epoch's block of samples, permuted on its own.

    A global permutation of all samples would change completely when more samples are requested.
    Shuffling each epoch's *complete* block with a generator seeded by (seed, epoch) keeps the order
    of every earlier block, and of the current one, identical however many samples are asked for.
    Mixing stays good because each block is a whole pass over the split. A block is shuffled as
    int32 where it fits (the same swaps as ``permutation(size)``, half the memory traffic).
    """
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


# --------------------------------------------------------------------------- GPT dataset


class GPTDataset(torch.utils.data.Dataset):
    """``num_samples`` samples of ``seq_length + 1`` tokens from the given documents of ``indexed``.

    Documents (not sequences) are the unit of shuffling, so a document split into sentences keeps
    its sentences in order. For data with one sequence per document, as Megatron's preprocessing
    writes for GPT, documents and sequences coincide. This class reads them in this project's order
    (the module docstring); data/megatron_order.py's subclass in Megatron-Core's.
    """

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
        # Seconds spent on each index and on the cache write; empty when the cache had them.
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
        # The last sample of the last epoch may run into later epochs (its tail, or more when the
        # split is shorter than one sample); build the document order far enough to hold it.
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
    """A cache-key description of document ids: the range for the usual contiguous split (hashing a
    million ids costs more than building small indices), else a hash of every id."""
    if ids.size and int(ids[-1]) - int(ids[0]) == ids.size - 1 and bool((np.diff(ids) == 1).all()):
        return f"range({int(ids[0])}, {int(ids[-1]) + 1})"
    return hashlib.sha256(ids.tobytes()).hexdigest()


# --------------------------------------------------------------------------- entry point


def parse_data_path(data_path: Sequence[str]) -> tuple[list[str], list[float] | None]:
    """``["A"]`` -> (["A"], [1.0]); ``["0.3", "A", "0.7", "B"]`` -> (["A", "B"], [0.3, 0.7]); prefixes without
    weights, ``["A", "B", "C"]`` -> (["A", "B", "C"], None): blended by their sizes (`size_weights`).

    Megatron-Core's rule (megatron/core/datasets/utils.py, get_blend_from_list): an odd number of entries is
    prefixes alone; an even number is weight/prefix pairs, unless the weights' places hold no numbers, when
    it is prefixes alone too. A list mixing the two is refused here (Megatron would take a weight for a path).
    """
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
    """Samples in one epoch of documents [start, end) of `indexed`, by Megatron-Core's arithmetic (megatron/core/
    datasets/gpt_dataset.py, GPTDataset.__len__ with one epoch: (tokens - add_extra_token_to_sequence) //
    sequence_length, the extra token 1): what a prefix without a weight weighs in a blend."""
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
    """Train, valid and test datasets, each None when it gets no samples or no documents.

    Every prefix is split by documents with the same ratios; several prefixes are blended. A valid
    or test split that is empty in some blended prefixes blends the others, reweighted. Prefixes given
    without weights weigh, in each split, what one epoch of that split holds (`epoch_samples`), as
    Megatron-Core's BlendedMegatronDatasetBuilder weighs them (megatron/core/datasets/
    blended_megatron_dataset_builder.py, `_build_blended_dataset_splits`: weights None -> `len(megatron_dataset)`
    of each one-epoch dataset); a prefix whose split holds no whole sample is left out of that split. A count of None
    asks for one epoch of that split's data (`blend_split`). With
    `vocab_size`, every token id of every prefix is checked to be below it (data/token_range.py). `dataset_class`
    reads each prefix's samples in its order (data/megatron_order.py's for Megatron-Core's).
    """
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
    """One split's dataset from its members (prefix, its documents in this split, its weight): one member's
    GPTDataset, or the members blended by their weights, or (`weighted` False) by the samples one epoch of each holds
    (`epoch_samples`, Megatron-Core's `len(megatron_dataset)` of one-epoch datasets), a member holding no whole
    sample left out. None when the split gets no samples or has no member. `num_samples` None: one epoch of the
    split's data (`split_epoch_samples`), a count that depends on the data alone (the cyclic sampler's epoch)."""
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
    # The blending indices depend only on the weights and the count; they are cached beside the
    # first member's data unless a cache directory is given.
    blend_cache = cache_dir if cache_dir is not None else os.path.dirname(os.path.abspath(members[0][0].prefix))
    return BlendedDataset(parts, member_weights, num_samples, cache_dir=blend_cache)
