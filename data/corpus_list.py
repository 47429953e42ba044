"""ALCF's --data-file-list (`weight prefix corpus` lines), built as its Megatron-DeepSpeed fork builds it: each line
gets ceil(N x w x 1.005) of a split's samples, a corpus's lines form one dataset (concatenated, blended or shuffled),
and the corpora are blended greedily in sorted name order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch

from base.input_files import read_text_file
from data import DataError
from data.blending import BlendedDataset, build_blending_indices
from data.gpt_dataset import SPLIT_NAMES, GPTDataset, parse_split, split_document_ranges, split_epoch_samples
from data.index_cache import cache_key, load_cached_arrays, save_cached_arrays
from data.indexed import IndexedDataset
from data.token_range import check_token_ids

FLAG = "--data-file-list"
# The fork's 0.5% slack, so an uneven blend still has samples left.
SURPLUS = 1.005
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class ListedDataset:
    weight: float
    prefix: str
    corpus: str


def read_data_file_list(path: str) -> tuple[ListedDataset, ...]:
    """The file's `weight prefix corpus` lines; DataError in one line naming a malformed one."""
    entries = []
    for number, line in enumerate(read_text_file(path, FLAG, error=DataError).splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            weight, prefix, corpus = fields
            value = float(weight)
        except ValueError:
            raise DataError(f"{FLAG} {path}, line {number}: {line.strip()[:120]!r} is not 'weight prefix corpus' "
                            f"(ALCF's fork reads three fields a line)") from None
        if not math.isfinite(value) or value < 0:
            raise DataError(f"{FLAG} {path}, line {number}: weight {weight!r} must be a non-negative number")
        entries.append(ListedDataset(value, prefix.split(".bin")[0] if ".bin" in prefix else prefix, corpus))
    if not entries or sum(entry.weight for entry in entries) <= 0:
        raise DataError(f"{FLAG} {path}: no dataset with a positive weight (each line: weight prefix corpus)")
    return tuple(entries)


def samples_per_line(entries: Sequence[ListedDataset], num_samples: int) -> list[int]:
    """get_datasets_weights_and_num_samples: ceil(N x normalized weight x 1.005) for each line."""
    total = 0.0
    for entry in entries:  # the fork sums in a Python loop
        total += entry.weight
    return [int(math.ceil(num_samples * (entry.weight / total) * SURPLUS)) for entry in entries]


class CorpusDataset(torch.utils.data.Dataset):
    """One corpus's lines as one dataset: `counts[i]` samples of `members[i]`, in sequence or `blended`, shuffled with
    `shuffle_seed`."""

    def __init__(self, members: Sequence[torch.utils.data.Dataset], counts: Sequence[int], blended: bool,
                 shuffle_seed: Optional[int], cache_dir: Optional[str]):
        self.members = list(members)
        self.counts = np.asarray(counts, dtype=np.int64)
        self.size = int(self.counts.sum())
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])
        self.blend = None
        if blended:
            self.blend = build_blending_indices((self.counts / self.size).tolist(), self.size)
        self.order = None
        if shuffle_seed is not None:
            self.order = corpus_shuffle(self.size, shuffle_seed, cache_dir)

    def __len__(self) -> int:
        return self.size

    def locate(self, j: int) -> tuple[int, int]:
        """(line within the corpus, sample of that line) of the corpus's sample j."""
        k = int(self.order[j]) if self.order is not None else j
        if self.blend is not None:
            return int(self.blend[0][k]), int(self.blend[1][k])
        line = int(np.searchsorted(self.starts, k, side="right")) - 1
        return line, k - int(self.starts[line])

    def __getitem__(self, j: int) -> dict[str, torch.Tensor]:
        if not 0 <= j < self.size:
            raise IndexError(f"corpus sample {j} out of range [0, {self.size})")
        line, sample = self.locate(j)
        return self.members[line][sample]


def corpus_shuffle(size: int, seed: int, cache_dir: Optional[str]) -> np.ndarray:
    """BuildCorpusDataset's order, `RandomState(seed).shuffle(arange(size))`, as int32 where it fits, cached."""
    paths = None
    if cache_dir is not None:
        key = cache_key({"format": _CACHE_FORMAT, "size": size, "seed": seed})
        paths = {"order": f"{cache_dir}/corpus_shuffle_{size}_{key}.npy"}
        cached = load_cached_arrays(paths, "corpus shuffle")
        if cached is not None and cached["order"].shape == (size,):
            return cached["order"]
    order = np.arange(size, dtype=np.int32 if size < np.iinfo(np.int32).max else np.int64)
    np.random.RandomState(seed).shuffle(order)
    if paths is not None:
        save_cached_arrays(paths, {"order": order}, "corpus shuffle")
    return order


def build_corpus_list_datasets(entries: Sequence[ListedDataset], split: str, seq_length: int, seed: int,
                               num_samples: tuple[int | None, int | None, int | None], shuffle: bool, blended: bool,
                               cache_dir: Optional[str] = None, vocab_size: Optional[int] = None
                               ) -> tuple[Optional[torch.utils.data.Dataset], ...]:
    """Train, valid and test datasets of a --data-file-list; None for a split without share or samples; a count of None
    asks for one epoch."""
    fractions = parse_split(split)
    opened: dict[str, IndexedDataset] = {}
    for entry in entries:
        if entry.prefix not in opened:
            opened[entry.prefix] = IndexedDataset(entry.prefix)
            if vocab_size is not None:
                check_token_ids(opened[entry.prefix], vocab_size)
    corpora = sorted({entry.corpus for entry in entries})
    datasets = []
    for s, (name, count) in enumerate(zip(SPLIT_NAMES, num_samples)):
        if fractions[s] == 0 or count == 0:
            datasets.append(None)
            continue
        if count is None:
            count = split_epoch_samples([(opened[entry.prefix],
                                          split_document_ranges(opened[entry.prefix].num_documents, fractions)[s])
                                         for entry in entries if entry.weight > 0], seq_length)
        counts = samples_per_line(entries, count)
        by_corpus = []
        for corpus in corpora:
            members, member_counts = [], []
            for entry, n in zip(entries, counts):
                if entry.corpus != corpus or n == 0:  # a zero weight: no samples, as in the fork
                    continue
                indexed = opened[entry.prefix]
                start, end = split_document_ranges(indexed.num_documents, fractions)[s]
                if end == start:
                    raise DataError(f"{FLAG}: {entry.prefix} (corpus {corpus}) has no documents in the {name} split "
                                    f"(--split {split}); ALCF's fork would fail on its first sample there")
                members.append(GPTDataset(indexed, np.arange(start, end, dtype=np.int64), n, seq_length, seed,
                                          name, cache_dir))
                member_counts.append(n)
            if members:
                by_corpus.append(CorpusDataset(members, member_counts, blended, seed if shuffle else None,
                                               cache_dir))
        total = sum(len(corpus) for corpus in by_corpus)
        weights = np.array([len(corpus) / total for corpus in by_corpus], dtype=np.float64)
        weights /= np.sum(weights)
        datasets.append(BlendedDataset(by_corpus, weights.tolist(), count, cache_dir=cache_dir, normalized=True))
    return tuple(datasets)
