"""Blending datasets in fixed proportions: Megatron's greedy assignment, computed with numpy, cached.

Global sample i (step t = max(i, 1)) goes to the dataset d with the largest deficit
``weights[d] * t - count[d]`` (ties to the lowest d) and takes that dataset's next sample: Megatron's rule
(megatron/core/datasets/helpers.cpp, build_blending_indices; Megatron-DeepSpeed's the same), so a blend draws
Megatron's samples in Megatron's order. As a Python loop that is 0.4 s per million samples.

The greedy corrects itself: two runs from different counts at the same step agree within a few steps (about
1/w steps when a dataset of weight w was off), and from then on are one run. So:

1. cut the samples into chunks and guess each chunk's starting counts (w * t by largest remainder: usually
   right, exact for the first chunk);
2. run all chunks at once, one vectorised step per position in a chunk;
3. repair: a chunk whose guessed start differs from the previous chunk's end is rerun from that end until
   its counts meet its first run's; one that never meets gets a new end and the next chunk is checked again,
   until every start agrees.

Each decision evaluates the loop's float64 expression with its tie rule, so the result is the loop's, sample
for sample (`tests/data/test_blending.py` compares them)."""

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

# Bump when the meaning of the cached blending arrays changes, so stale caches are never loaded.
_CACHE_FORMAT = 2  # 2: the step is max(i, 1), Megatron's (1 stepped i + 1)

# Steps per chunk. Most runs from a wrong guess meet the true run within a few steps; the few that
# take longer are finished by the loop, and their total length is at most the number of samples.
_CHUNK_LENGTH = 64
# With fewer chunks than this, each numpy call does too little work to beat the plain loop.
_MIN_CHUNKS = 64
# Chunks stepped together: keeps the working set (a few arrays of this many float64) in cache.
_BLOCK_CHUNKS = 16384


def samples_per_dataset(weights: Sequence[float], num_samples: int) -> list[int]:
    """Samples to build in each blended dataset: its share plus 0.5% and one sample of slack.

    The greedy assignment never runs more than one sample ahead of a dataset's exact share, so the
    slack is a safety margin, not a guess.
    """
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
    """The greedy loop itself, from `counts` before sample `first` to the end of the outputs.

    Python floats and ints: each decision costs about 0.1 us per dataset, less than one numpy call.
    """
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
    """One greedy decision for many independent runs at once, with reusable scratch arrays.

    About 14 array operations a step whatever the number of datasets D up to 3, 3 more per extra
    dataset: the deficits of all datasets in two, a running maximum, then one gather and one
    scatter through flat indices for the chosen datasets' counts.
    """

    def __init__(self, w: np.ndarray, width: int):
        self.weights = w[:, None]
        self.deficits = np.empty((w.size, width))
        self.mask = np.empty(width, dtype=bool)
        self.flat = np.empty(width, dtype=np.int64)
        self.columns = np.arange(width, dtype=np.int64)
        self.chosen_counts = np.empty(width)

    def step(self, steps: np.ndarray, counts: np.ndarray, choice: np.ndarray, within: np.ndarray) -> None:
        """steps[k]: run k's step max(i, 1) (float64); counts[:, k]: its counts so far (C-contiguous
        float64, updated). Writes run k's chosen dataset to choice[k] and that dataset's count
        before it to within[k]."""
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
    # [step in chunk, chunk]: each vectorised step writes one contiguous row. The last chunk's steps
    # past num_samples are computed and dropped.
    choices = np.empty((length, num_chunks), dtype=np.int16)
    within = np.empty((length, num_chunks), dtype=np.int64)
    # Invariant: each chunk's stored choices are the greedy run from starts[:, k], ending at ends[:, k].
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
        # Every wrong chunk at once, from the end of the chunk before it. Where that end was itself
        # wrong (a chain), the run is wasted and the loop below redoes the chunk.
        true_starts = ends[:, wrong - 1]
        ends[:, wrong] = _repair_in_place(w, wrong, true_starts, starts[:, wrong], first_steps, choices, within)
        starts[:, wrong] = true_starts
        _repair_sequentially(w.tolist(), starts, ends, choices, within)
    # One transposed copy each into chunk-major order; the views drop the last chunk's extra steps.
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
    """Rerun `chunks` from `true_starts`, all at once, overwriting their choices until each run's
    counts meet those of its stored run (which is right from there on). Returns their end counts."""
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
    """The chunks still wrong after the vectorised repair, in order, with the loop: each run starts
    from a true state (every chunk before it is settled) and goes on across chunk boundaries until its
    counts meet the stored run's, rewriting what it crosses. Runs never overlap, so all of them
    together cost at most one pass of the loop over the samples."""
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
    """Mixture of datasets in fixed proportions; sample i is a pure function of i.

    With `cache_dir`, the blending indices are cached there as .npy files named by a hash of what
    they depend on (the normalised weights, the number of samples and the algorithm's format), and a
    second build with the same inputs loads them instead of recomputing.
    """

    def __init__(self, datasets: Sequence[torch.utils.data.Dataset], weights: Sequence[float], num_samples: int,
                 cache_dir: str | None = None, normalized: bool = False):
        """`normalized`: the weights are used as given (the caller normalized them as its source does), not divided
        by their sum again, which may move a weight by an ulp and a tie of the greedy rule with it."""
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
    """The cache files of one blend: they depend only on the normalised weights and the sample count."""
    key = cache_key({"format": _CACHE_FORMAT, "weights": [float(w).hex() for w in weights],
                     "num_samples": num_samples})
    stem = os.path.join(cache_dir, f"blend_{len(weights)}x{num_samples}_{key}")
    return {kind: f"{stem}_{kind}_index.npy" for kind in ("dataset", "dataset_sample")}
