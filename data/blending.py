"""Blending datasets in fixed proportions: Megatron's greedy assignment (sample i to the dataset with the largest
deficit ``weights[d] * max(i, 1) - count[d]``), computed with numpy a chunk of guessed starting counts at a time and
repaired where a guess was wrong, so the result is the loop's, sample for sample, and cached.
"""

from __future__ import annotations

import array
import logging
import math
import os
from typing import Sequence

import numpy as np
import torch

from data.index_cache import cache_key, load_cached_arrays, save_cached_arrays

logger = logging.getLogger(__name__)

# Bump when the cached arrays' meaning changes.
_CACHE_FORMAT = 2  # 2: the step is max(i, 1), Megatron's (1 stepped i + 1)

# Steps per chunk: most wrong guesses meet the true run within a few steps; the loop finishes the rest.
_CHUNK_LENGTH = 64
_MIN_CHUNKS = 64
# Chunks stepped together: keeps the working set in cache.
_BLOCK_CHUNKS = 16384


def samples_per_dataset(weights: Sequence[float], num_samples: int) -> list[int]:
    """Samples to build in each blended dataset: its share plus 0.5% and one of slack (the greedy never runs more than
    one ahead)."""
    return [int(math.ceil(weight * num_samples * 1.005)) + 1 for weight in weights]


def build_blending_indices(weights: Sequence[float], num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(dataset id per sample as int16, index within that dataset as int64) of the greedy assignment."""
    weights = [float(w) for w in weights]
    if len(weights) == 1:
        return np.zeros(num_samples, dtype=np.int16), np.arange(num_samples, dtype=np.int64)
    if num_samples >= _MIN_CHUNKS * _CHUNK_LENGTH:
        return _run_in_chunks(np.asarray(weights, dtype=np.float64), num_samples)
    dataset_index = np.empty(num_samples, dtype=np.int16)
    dataset_sample_index = np.empty(num_samples, dtype=np.int64)
    _run_sequentially(weights, [0] * len(weights), 0, dataset_index, dataset_sample_index)
    return dataset_index, dataset_sample_index


def _run_sequentially(weights: list[float], counts: list[int], first: int,
                      dataset_index: np.ndarray, dataset_sample_index: np.ndarray) -> None:
    """The greedy loop itself, from `counts` before sample `first` to the end of the outputs."""
    total = dataset_index.size - first
    choices = array.array("h", bytes(2 * total))  # 2 bytes per sample, not a list's ~8+
    within = array.array("q", bytes(8 * total))
    candidates = range(1, len(weights))
    for i in range(total):
        steps = max(first + i, 1)
        best, best_error = 0, weights[0] * steps - counts[0]
        for d in candidates:
            error = weights[d] * steps - counts[d]
            if error > best_error:
                best, best_error = d, error
        choices[i] = best
        within[i] = counts[best]
        counts[best] += 1
    dataset_index[first:] = np.frombuffer(choices, dtype=np.int16)
    dataset_sample_index[first:] = np.frombuffer(within, dtype=np.int64)


def _guess_counts(w: np.ndarray, first_samples: np.ndarray) -> np.ndarray:
    """[datasets, chunks] float64: counts summing to each chunk's first sample, by largest remainder."""
    shares = w[:, None] * first_samples[None, :].astype(np.float64)
    counts = np.floor(shares)
    missing = first_samples - counts.sum(axis=0)
    order = np.argsort(counts - shares, axis=0, kind="stable")  # largest remainder first
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(w.size)[:, None], axis=0)
    return counts + (rank < missing)


class _Stepper:
    """One greedy decision for many independent runs at once, with reusable scratch arrays."""

    def __init__(self, w: np.ndarray, width: int):
        self.weights = w[:, None]
        self.deficits = np.empty((w.size, width))
        self.mask = np.empty(width, dtype=bool)
        self.flat = np.empty(width, dtype=np.int64)
        self.columns = np.arange(width, dtype=np.int64)
        self.chosen_counts = np.empty(width)

    def step(self, steps: np.ndarray, counts: np.ndarray, choice: np.ndarray, within: np.ndarray) -> None:
        """steps[k]: run k's step max(i, 1); counts[:, k]: its counts (updated). Writes run k's choice and that
        dataset's prior count."""
        if not counts.flags.c_contiguous:
            raise ValueError("counts must be C-contiguous: its flat view is written through")
        datasets, width = counts.shape
        deficits, mask = self.deficits[:, :width], self.mask[:width]
        flat, chosen = self.flat[:width], self.chosen_counts[:width]
        np.multiply(self.weights, steps, out=deficits)  # the loop's float64 expression, elementwise
        np.subtract(deficits, counts, out=deficits)
        best = deficits[0]
        choice.fill(0)
        for d in range(1, datasets):
            np.greater(deficits[d], best, out=mask)  # strict: a tie keeps the lower dataset, as in the loop
            np.maximum(best, deficits[d], out=best)
            np.copyto(choice, d, where=mask)
        np.multiply(choice, width, out=flat, dtype=np.int64)  # int16 * width would overflow
        np.add(flat, self.columns[:width], out=flat)
        flat_counts = counts.reshape(-1)
        np.take(flat_counts, flat, out=chosen)
        within[:] = chosen
        chosen += 1.0
        np.put(flat_counts, flat, chosen)


def _run_in_chunks(w: np.ndarray, num_samples: int) -> tuple[np.ndarray, np.ndarray]:
    length = _CHUNK_LENGTH
    num_chunks = -(-num_samples // length)
    first_samples = np.arange(num_chunks, dtype=np.int64) * length
    first_steps = first_samples.astype(np.float64)  # sample i's step is max(i, 1) (the module docstring)
    # [step in chunk, chunk]: each step writes one contiguous row; the last chunk's extra steps are dropped.
    choices = np.empty((length, num_chunks), dtype=np.int16)
    within = np.empty((length, num_chunks), dtype=np.int64)
    # Invariant: chunk k's stored choices are the greedy run from starts[:, k], ending at ends[:, k].
    starts = _guess_counts(w, first_samples)
    starts[:, 0] = 0.0  # known, not guessed: the first chunk starts from nothing
    ends = np.empty_like(starts)

    stepper = _Stepper(w, min(num_chunks, _BLOCK_CHUNKS))
    steps = np.empty(min(num_chunks, _BLOCK_CHUNKS))
    for lo in range(0, num_chunks, _BLOCK_CHUNKS):
        hi = min(num_chunks, lo + _BLOCK_CHUNKS)
        counts = starts[:, lo:hi].copy()
        for j in range(length):
            np.add(first_steps[lo:hi], j, out=steps[:hi - lo])
            np.maximum(steps[:hi - lo], 1.0, out=steps[:hi - lo])
            stepper.step(steps[:hi - lo], counts, choices[j, lo:hi], within[j, lo:hi])
        ends[:, lo:hi] = counts

    wrong = _wrong_starts(starts, ends)
    if wrong.size:
        # Every wrong chunk at once, from the end of the chunk before; a chain of wrong chunks is redone below.
        true_starts = ends[:, wrong - 1]
        ends[:, wrong] = _repair_in_place(w, wrong, true_starts, starts[:, wrong], first_steps, choices, within)
        starts[:, wrong] = true_starts
        _repair_sequentially(w.tolist(), starts, ends, choices, within)
    dataset_index = np.empty((num_chunks, length), dtype=np.int16)
    dataset_sample_index = np.empty((num_chunks, length), dtype=np.int64)
    np.copyto(dataset_index, choices.T)
    np.copyto(dataset_sample_index, within.T)
    return dataset_index.reshape(-1)[:num_samples], dataset_sample_index.reshape(-1)[:num_samples]


def _wrong_starts(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Chunks k >= 1 whose start differs from the end of chunk k - 1 (chunk 0's start is known)."""
    return np.flatnonzero((starts[:, 1:] != ends[:, :-1]).any(axis=0)) + 1


def _repair_in_place(w: np.ndarray, chunks: np.ndarray, true_starts: np.ndarray, stored_starts: np.ndarray,
                     first_steps: np.ndarray, choices: np.ndarray, within: np.ndarray) -> np.ndarray:
    """Rerun `chunks` from `true_starts`, all at once, until each run's counts meet its stored run's; returns their end
    counts."""
    counts, stored = true_starts.copy(), stored_starts.copy()
    # A run that meets its stored run ends where the stored run ends...
    ends = stored_starts + np.stack([(choices[:, chunks] == d).sum(axis=0) for d in range(w.size)])
    live = np.arange(chunks.size)
    stepper = _Stepper(w, chunks.size)
    for j in range(choices.shape[0]):
        rows = chunks[live]
        live_counts, live_stored = np.ascontiguousarray(counts[:, live]), stored[:, live]
        choice = np.empty(live.size, dtype=np.int16)
        position = np.empty(live.size, dtype=np.int64)
        stepper.step(np.maximum(first_steps[rows] + j, 1.0), live_counts, choice, position)
        live_stored[choices[j, rows], np.arange(live.size)] += 1
        counts[:, live], stored[:, live] = live_counts, live_stored
        choices[j, rows], within[j, rows] = choice, position
        live = live[(live_counts != live_stored).any(axis=0)]
        if live.size == 0:
            break
    ends[:, live] = counts[:, live]  # ...and one that never met it ends where it ended itself.
    return ends


def _repair_sequentially(weights: list[float], starts: np.ndarray, ends: np.ndarray,
                         choices: np.ndarray, within: np.ndarray) -> None:
    """The chunks still wrong, in order, with the loop, each run crossing chunk boundaries until it meets the stored
    run; at most one pass over the samples in all."""
    length, num_chunks = choices.shape
    settled_until = 0  # chunks below this were rewritten by a run and are right
    for k in _wrong_starts(starts, ends).tolist():
        if k < settled_until:
            continue
        counts = [int(c) for c in ends[:, k - 1]]
        chunk, j = k, 0
        stored = [int(c) for c in starts[:, chunk]]
        while counts != stored:
            steps = max(chunk * length + j, 1)
            best, best_error = 0, weights[0] * steps - counts[0]
            for d in range(1, len(weights)):
                error = weights[d] * steps - counts[d]
                if error > best_error:
                    best, best_error = d, error
            stored[int(choices[j, chunk])] += 1
            choices[j, chunk], within[j, chunk] = best, counts[best]
            counts[best] += 1
            j += 1
            if j == length:
                ends[:, chunk] = counts
                chunk, j = chunk + 1, 0
                if chunk == num_chunks:
                    return
                stored = [int(c) for c in starts[:, chunk]]
        settled_until = chunk + 1


class BlendedDataset(torch.utils.data.Dataset):
    """Mixture of datasets in fixed proportions; sample i is a pure function of i. With `cache_dir` the indices are
    cached as .npy files keyed by what they depend on."""

    def __init__(self, datasets: Sequence[torch.utils.data.Dataset], weights: Sequence[float], num_samples: int,
                 cache_dir: str | None = None, normalized: bool = False):
        """`normalized`: the weights are used as given, not divided by their sum again (an ulp could flip a tie)."""
        if len(datasets) != len(weights) or not datasets:
            raise ValueError(f"need one weight per dataset, got {len(datasets)} datasets and {len(weights)} weights")
        if any(not math.isfinite(w) or w <= 0 for w in weights):
            raise ValueError(f"blend weights must be positive, got {list(weights)}")
        total = 1.0 if normalized else float(sum(weights))
        self.datasets = list(datasets)
        self.weights = [float(w) / total for w in weights]
        self.num_samples = num_samples
        self.cache_paths = blending_cache_paths(cache_dir, self.weights, num_samples) if cache_dir else None
        self.loaded_from_cache = False
        cached = self._load_cache()
        if cached is not None:
            self.dataset_index, self.dataset_sample_index = cached
            self.loaded_from_cache = True
        else:
            self.dataset_index, self.dataset_sample_index = build_blending_indices(self.weights, num_samples)
            if self.cache_paths:
                save_cached_arrays(self.cache_paths, {"dataset": self.dataset_index,
                                                      "dataset_sample": self.dataset_sample_index}, "blend")
        needed = np.bincount(self.dataset_index, minlength=len(datasets))
        for d, dataset in enumerate(self.datasets):
            if len(dataset) < needed[d]:
                raise ValueError(
                    f"blended dataset {d} has {len(dataset)} samples but the blend draws {needed[d]}; "
                    f"build it with samples_per_dataset(weights, num_samples)"
                )

    def _load_cache(self) -> tuple[np.ndarray, np.ndarray] | None:
        if not self.cache_paths:
            return None
        arrays = load_cached_arrays(self.cache_paths, "blend")
        if arrays is None:
            return None
        dataset_index, dataset_sample_index = arrays["dataset"], arrays["dataset_sample"]
        if dataset_index.shape != (self.num_samples,) or dataset_sample_index.shape != (self.num_samples,):
            logger.warning("ignoring blending cache with unexpected shapes; rebuilding")
            return None
        return dataset_index, dataset_sample_index

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


def blending_cache_paths(cache_dir: str, weights: Sequence[float], num_samples: int) -> dict[str, str]:
    """The cache files of one blend, keyed by the normalised weights and the sample count."""
    key = cache_key({"format": _CACHE_FORMAT, "weights": [float(w).hex() for w in weights],
                     "num_samples": num_samples})
    stem = os.path.join(cache_dir, f"blend_{len(weights)}x{num_samples}_{key}")
    return {kind: f"{stem}_{kind}_index.npy" for kind in ("dataset", "dataset_sample")}
