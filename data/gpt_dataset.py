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

import array
import hashlib
import json
import logging
import math
import os
import tempfile
from typing import Sequence

import numpy as np
import torch

from data import DataError
from data.indexed import IndexedDataset, index_file_path
from data.progress import ProgressLines
from data.token_range import check_token_ids
from gpt.file_modes import apply_umask

logger = logging.getLogger(__name__)

SPLIT_NAMES = ("train", "valid", "test")

# Independent random streams derived from the user's seed. Tagging the purpose keeps the document
# order and the sample order uncorrelated even though both are seeded per epoch.
_DOCUMENT_ORDER_STREAM = 1
_SAMPLE_ORDER_STREAM = 2

# Bump when the meaning of the cached arrays changes, so stale caches are never loaded.
_CACHE_FORMAT = 1


# --------------------------------------------------------------------------- splits


def parse_split(split: str) -> tuple[float, float, float]:
    """``"969,30,1"`` -> train/valid/test fractions summing to 1. Missing trailing parts count as 0."""
    parts = [part.strip() for part in str(split).replace("/", ",").split(",")]
    if not 1 <= len(parts) <= 3:
        raise DataError(f"--split {split!r}: expected up to three comma-separated weights, e.g. 969,30,1")
    try:
        values = [float(part) for part in parts]
    except ValueError:
        raise DataError(f"--split {split!r}: every part must be a number, e.g. 969,30,1") from None
    if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise DataError(f"--split {split!r}: weights must be finite, non-negative and not all zero")
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
    on how many epochs are built.
    """
    document_ids = np.asarray(document_ids)
    dtype = np.int32 if document_ids.size == 0 or document_ids.max() <= np.iinfo(np.int32).max else np.int64
    epochs = [
        np.random.default_rng([seed, _DOCUMENT_ORDER_STREAM, epoch]).permutation(document_ids)
        for epoch in range(num_epochs)
    ]
    if not epochs:
        return np.zeros(0, dtype=dtype)
    return np.concatenate(epochs).astype(dtype, copy=False)


def build_sample_index(
    document_lengths: np.ndarray, document_index: np.ndarray, seq_length: int, num_samples: int
) -> np.ndarray:
    """int64[num_samples + 1, 2]: row k = (position in document_index, offset in that document) of
    token ``k * seq_length`` of the concatenated documents.

    Sample k covers the tokens from row k to row k+1 inclusive (seq_length + 1 tokens). A token is
    located in the first document whose end lies beyond it, so zero-length documents are skipped.
    Vectorised (one cumsum, one searchsorted): billions of tokens take seconds, not hours.
    """
    document_lengths = np.asarray(document_lengths, dtype=np.int64)
    lengths_in_order = document_lengths[np.asarray(document_index)]
    document_ends = np.cumsum(lengths_in_order)
    total_tokens = int(document_ends[-1]) if document_ends.size else 0
    last_needed = num_samples * seq_length  # the inclusive last token of the last sample
    if last_needed >= total_tokens:
        raise ValueError(
            f"{num_samples} samples of {seq_length}+1 tokens need {last_needed + 1} tokens, "
            f"the document index holds {total_tokens}"
        )
    token_positions = np.arange(num_samples + 1, dtype=np.int64) * seq_length
    positions = np.searchsorted(document_ends, token_positions, side="right")
    offsets = token_positions - (document_ends[positions] - lengths_in_order[positions])
    return np.stack([positions.astype(np.int64), offsets], axis=1)


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
    Mixing stays good because each block is a whole pass over the split.
    """
    boundaries = np.asarray(epoch_boundaries, dtype=np.int64)
    blocks = [
        start + np.random.default_rng([seed, _SAMPLE_ORDER_STREAM, epoch]).permutation(stop - start)
        for epoch, (start, stop) in enumerate(zip(boundaries[:-1].tolist(), boundaries[1:].tolist()))
    ]
    return np.concatenate(blocks).astype(np.int64) if blocks else np.zeros(0, dtype=np.int64)


# --------------------------------------------------------------------------- GPT dataset


class GPTDataset(torch.utils.data.Dataset):
    """``num_samples`` samples of ``seq_length + 1`` tokens from the given documents of ``indexed``.

    Documents (not sequences) are the unit of shuffling, so a document split into sentences keeps
    its sentences in order. For data with one sequence per document, as Megatron's preprocessing
    writes for GPT, documents and sequences coincide.
    """

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
        self.num_epochs = epochs_needed(self.tokens_per_epoch, seq_length, num_samples)

        self.cache_paths = self._cache_paths(cache_dir)
        self.loaded_from_cache = False
        indices = self._load_cache()
        if indices is None:  # a large corpus takes minutes here (once: the result is cached)
            progress = ProgressLines()
            progress.start(f"data: building the {name} index of {indexed.prefix}: {num_samples:,} samples "
                           f"of {seq_length + 1} tokens over {self.num_epochs} epoch(s)")
            indices = self._build_indices()
            self._save_cache(indices)
            progress.done(f"data: built the {name} index of {indexed.prefix}")
        else:
            self.loaded_from_cache = True
        self.document_index, self.sample_index, self.shuffle_index = indices

    def _build_indices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        boundaries = epoch_sample_boundaries(self.tokens_per_epoch, self.seq_length, self.num_epochs)
        samples_built = int(boundaries[-1])
        # The last sample of the last epoch may run into later epochs (its tail, or more when the
        # split is shorter than one sample); build the document order far enough to hold it.
        tokens_needed = samples_built * self.seq_length + 1
        document_epochs = -(-tokens_needed // self.tokens_per_epoch)
        document_index = build_document_index(self.document_ids, document_epochs, self.seed)
        sample_index = build_sample_index(self.document_lengths, document_index, self.seq_length, samples_built)
        shuffle_index = build_shuffle_index(boundaries, self.seed)[: self.num_samples]
        return document_index, sample_index, shuffle_index

    def _cache_key(self) -> str:
        index_path = index_file_path(self.indexed.prefix)
        stat = os.stat(index_path)
        description = {
            "format": _CACHE_FORMAT,
            "prefix": os.path.abspath(self.indexed.prefix),
            "index_size": stat.st_size,
            "index_mtime_ns": stat.st_mtime_ns,
            "documents": hashlib.sha256(self.document_ids.tobytes()).hexdigest(),
            "num_samples": self.num_samples,
            "seq_length": self.seq_length,
            "seed": self.seed,
            "name": self.name,
        }
        return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:20]

    def _cache_paths(self, cache_dir: str | None) -> dict[str, str]:
        directory = cache_dir if cache_dir is not None else os.path.dirname(os.path.abspath(self.indexed.prefix))
        stem = f"{os.path.basename(self.indexed.prefix)}_{self.name}_{self._cache_key()}"
        return {kind: os.path.join(directory, f"{stem}_{kind}_index.npy") for kind in ("document", "sample", "shuffle")}

    def _load_cache(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        if not all(os.path.isfile(path) for path in self.cache_paths.values()):
            return None
        try:
            arrays = tuple(np.load(self.cache_paths[kind], mmap_mode="r") for kind in ("document", "sample", "shuffle"))
        except (OSError, ValueError) as error:
            logger.warning("ignoring unreadable index cache for %s (%s); rebuilding", self.name, error)
            return None
        document_index, sample_index, shuffle_index = arrays
        if sample_index.ndim != 2 or sample_index.shape[1] != 2 or shuffle_index.shape != (self.num_samples,):
            logger.warning("ignoring index cache for %s with unexpected shapes; rebuilding", self.name)
            return None
        return arrays  # type: ignore[return-value]

    def _save_cache(self, indices: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Write each array to a temp file and rename it, so readers never see a partial cache.

        Several ranks may build the same cache concurrently; they write identical content and the
        renames are atomic, so whichever lands last is as good as the first.
        """
        directory = os.path.dirname(self.cache_paths["document"])
        try:
            os.makedirs(directory, exist_ok=True)
            for kind, array in zip(("document", "sample", "shuffle"), indices):
                handle, temp_path = tempfile.mkstemp(dir=directory, suffix=".npy.tmp")
                try:
                    with os.fdopen(handle, "wb") as temp_file:
                        np.save(temp_file, array)
                    apply_umask(temp_path)  # mkstemp makes it 0600; the cache is shared by every user of the data
                    os.replace(temp_path, self.cache_paths[kind])
                except BaseException:
                    os.remove(temp_path)
                    raise
        except OSError as error:
            logger.warning("cannot write index cache in %s (%s); continuing without a cache", directory, error)

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


# --------------------------------------------------------------------------- blending


def samples_per_dataset(weights: Sequence[float], num_samples: int) -> list[int]:
    """Samples to build in each blended dataset: its share plus 0.5% and one sample of slack.

    The greedy assignment never runs more than one sample ahead of a dataset's exact share, so the
    slack is a safety margin, not a guess.
    """
    return [int(math.ceil(weight * num_samples * 1.005)) + 1 for weight in weights]


def build_blending_indices(weights: Sequence[float], num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Megatron's greedy error-minimising assignment of global samples to datasets.

    Sample i goes to the dataset d maximising ``weights[d] * (i + 1) - count[d]`` (the one furthest
    behind its share; ties go to the lowest d) and takes that dataset's next sample. Returns
    (dataset id per sample, index within that dataset). The choice depends on the counts so far,
    which makes the loop inherently sequential; it runs on Python floats, about 0.1 us per sample
    and dataset, since per-step numpy calls would be slower than that.
    """
    weights = [float(w) for w in weights]
    if len(weights) == 1:
        return np.zeros(num_samples, dtype=np.int16), np.arange(num_samples, dtype=np.int64)
    counts = [0] * len(weights)
    choices = array.array("h", bytes(2 * num_samples))  # 2 bytes per sample, not a list's ~8+
    candidates = range(1, len(weights))
    for i in range(num_samples):
        steps = i + 1
        best, best_error = 0, weights[0] * steps - counts[0]
        for d in candidates:
            error = weights[d] * steps - counts[d]
            if error > best_error:
                best, best_error = d, error
        choices[i] = best
        counts[best] += 1
    dataset_index = np.frombuffer(choices, dtype=np.int16).copy()
    # Index within the dataset = how many earlier samples went to the same dataset.
    dataset_sample_index = np.zeros(num_samples, dtype=np.int64)
    for d in range(len(weights)):
        mine = dataset_index == d
        dataset_sample_index[mine] = np.arange(int(mine.sum()), dtype=np.int64)
    return dataset_index, dataset_sample_index


class BlendedDataset(torch.utils.data.Dataset):
    """Mixture of datasets in fixed proportions; sample i is a pure function of i."""

    def __init__(self, datasets: Sequence[torch.utils.data.Dataset], weights: Sequence[float], num_samples: int):
        if len(datasets) != len(weights) or not datasets:
            raise ValueError(f"need one weight per dataset, got {len(datasets)} datasets and {len(weights)} weights")
        if any(not math.isfinite(w) or w <= 0 for w in weights):
            raise ValueError(f"blend weights must be positive, got {list(weights)}")
        total = float(sum(weights))
        self.datasets = list(datasets)
        self.weights = [float(w) / total for w in weights]
        self.num_samples = num_samples
        self.dataset_index, self.dataset_sample_index = build_blending_indices(self.weights, num_samples)
        needed = np.bincount(self.dataset_index, minlength=len(datasets))
        for d, dataset in enumerate(self.datasets):
            if len(dataset) < needed[d]:
                raise ValueError(
                    f"blended dataset {d} has {len(dataset)} samples but the blend draws {needed[d]}; "
                    f"build it with samples_per_dataset(weights, num_samples)"
                )

    def __len__(self) -> int:
        return self.num_samples

    def locate(self, i: int) -> tuple[int, int]:
        """(dataset id, index within that dataset) of global sample i."""
        return int(self.dataset_index[i]), int(self.dataset_sample_index[i])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"blended sample {i} out of range [0, {self.num_samples})")
        dataset, index = self.locate(i)
        return self.datasets[dataset][index]


# --------------------------------------------------------------------------- entry point


def parse_data_path(data_path: Sequence[str]) -> tuple[list[str], list[float]]:
    """``["A"]`` -> (["A"], [1.0]); ``["0.3", "A", "0.7", "B"]`` -> (["A", "B"], [0.3, 0.7])."""
    data_path = list(data_path)
    if not data_path:
        raise DataError("--data-path: no dataset given")
    if len(data_path) == 1:
        return data_path, [1.0]
    if len(data_path) % 2:
        raise DataError(
            f"--data-path: {len(data_path)} entries; a blend needs weight/prefix pairs, e.g. 0.3 A 0.7 B"
        )
    prefixes, weights = [], []
    for weight_text, prefix in zip(data_path[0::2], data_path[1::2]):
        try:
            weight = float(weight_text)
        except ValueError:
            raise DataError(f"--data-path: weight {weight_text!r} (before {prefix!r}) is not a number") from None
        if not math.isfinite(weight) or weight <= 0:
            raise DataError(f"--data-path: weight {weight_text!r} of {prefix!r} must be a positive number")
        prefixes.append(prefix)
        weights.append(weight)
    total = sum(weights)
    return prefixes, [w / total for w in weights]


def build_train_valid_test_datasets(
    data_path: Sequence[str],
    split: str,
    seq_length: int,
    seed: int,
    num_samples: tuple[int, int, int],
    cache_dir: str | None = None,
    vocab_size: int | None = None,
) -> tuple[torch.utils.data.Dataset | None, torch.utils.data.Dataset | None, torch.utils.data.Dataset | None]:
    """Train, valid and test datasets, each None when it gets no samples or no documents.

    Every prefix is split by documents with the same ratios; several prefixes are blended. A valid
    or test split that is empty in some blended prefixes blends the others, reweighted. With
    `vocab_size`, every token id of every prefix is checked to be below it (data/token_range.py).
    """
    if len(num_samples) != 3 or any(n < 0 for n in num_samples):
        raise ValueError(f"num_samples must be three non-negative counts, got {num_samples}")
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
            for ds, document_ranges, weight in zip(indexed, ranges, weights)
            if document_ranges[s][1] > document_ranges[s][0]
        ]
        if num_samples[s] == 0 or not members:
            results.append(None)
            continue
        total_weight = sum(weight for _, _, weight in members)
        member_weights = [weight / total_weight for _, _, weight in members]
        counts = [num_samples[s]] if len(members) == 1 else samples_per_dataset(member_weights, num_samples[s])
        parts = [
            GPTDataset(ds, np.arange(*document_range, dtype=np.int64), count, seq_length, seed, split_name, cache_dir)
            for (ds, document_range, _), count in zip(members, counts)
        ]
        results.append(parts[0] if len(parts) == 1 else BlendedDataset(parts, member_weights, num_samples[s]))
    return results[0], results[1], results[2]
