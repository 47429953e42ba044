"""The vectorised blending assignment against the greedy rule, step by step, and the blending cache."""

import os

import numpy as np
import pytest

from data import blending
from data.blending import BlendedDataset, blending_cache_paths, build_blending_indices
from data.gpt_dataset import build_train_valid_test_datasets
from data.indexed import IndexedDataset, IndexedDatasetWriter


def greedy_reference(weights, num_samples):
    """The assignment rule, one step at a time, written independently of data/blending.py: the
    dataset with the largest weight * max(i, 1) - count (float64, the lowest on a tie) takes sample i
    (NVIDIA/Megatron-LM megatron/core/datasets/helpers.cpp build_blending_indices: `sample_idx_double =
    std::max(static_cast<double>(sample_idx), 1.0)`, `if (error > max_error)`)."""
    weights = np.asarray(weights, dtype=np.float64)
    counts = np.zeros(weights.size)
    dataset_index = np.zeros(num_samples, dtype=np.int16)
    dataset_sample_index = np.zeros(num_samples, dtype=np.int64)
    for i in range(num_samples):
        d = int(np.argmax(weights * max(i, 1) - counts))  # argmax returns the first of equal maxima
        dataset_index[i], dataset_sample_index[i] = d, counts[d]
        counts[d] += 1
    return dataset_index, dataset_sample_index


def random_weights(rng, skew):
    count = int(rng.integers(2, 12))
    weights = rng.random(count) ** skew  # larger skew: a few dominant datasets and some tiny ones
    return list(weights / weights.sum())


def assert_same(weights, num_samples):
    expected = greedy_reference(weights, num_samples)
    got = build_blending_indices(weights, num_samples)
    assert got[0].dtype == np.int16 and got[1].dtype == np.int64
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("weights", [[0.5, 0.5], [1 / 3] * 3, [0.2, 0.3, 0.5], [0.999, 0.001],
                                     [0.6, 0.25, 0.1, 0.05], [0.49, 0.49, 0.02]])
def test_chunked_assignment_equals_the_reference(weights):
    num_samples = 3 * blending._MIN_CHUNKS * blending._CHUNK_LENGTH + 17  # the chunked path, a partial last chunk
    assert_same(weights, num_samples)


@pytest.mark.parametrize("seed", range(6))
def test_random_weights_and_sizes_equal_the_reference(seed):
    rng = np.random.default_rng(seed)
    for skew in (1, 4):
        assert_same(random_weights(rng, skew), int(rng.integers(1, 40_000)))


def test_the_sequential_path_equals_the_reference(monkeypatch):
    """Small blends (and what the repairs leave over) run the plain loop."""
    monkeypatch.setattr(blending, "_MIN_CHUNKS", 10**9)
    rng = np.random.default_rng(11)
    for _ in range(5):
        assert_same(random_weights(rng, 3), int(rng.integers(1, 5000)))


@pytest.mark.parametrize("seed", range(40))
def test_short_chunks_and_wrong_guesses_still_equal_the_reference(seed, monkeypatch):
    """Chunks of 8 steps and starting counts guessed at random: the repairs (vectorised, then the
    loop across chunk boundaries) must recover the greedy assignment from any guess."""
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(blending, "_CHUNK_LENGTH", 8)
    monkeypatch.setattr(blending, "_MIN_CHUNKS", 2)
    if seed % 2:
        def random_guess(w, first_samples):
            noise = rng.integers(-3, 4, (w.size, first_samples.size))
            return np.maximum(0.0, np.rint(w[:, None] * first_samples + noise))
        monkeypatch.setattr(blending, "_guess_counts", random_guess)
    assert_same(random_weights(rng, 1 + seed % 5), int(rng.integers(16, 3000)))


def test_from_the_true_starting_counts_no_repair_is_needed(monkeypatch):
    """The vectorised steps alone must reproduce the rule: given every chunk's true starting counts,
    no chunk may come out needing a repair (repairs would otherwise hide a wrong step). Chunks of 4
    steps make the run wider than one block of chunks, where flat indices exceed int16."""
    weights = [0.5, 0.3, 0.2]
    monkeypatch.setattr(blending, "_CHUNK_LENGTH", 4)
    num_samples = 4 * (blending._BLOCK_CHUNKS + 500)
    expected = greedy_reference(weights, num_samples)
    onehot = np.eye(len(weights))[expected[0]]
    true_counts = np.vstack([np.zeros(len(weights)), np.cumsum(onehot, axis=0)])

    def true_guess(w, first_samples):
        return true_counts[first_samples].T.copy()

    def no_repair(*args, **kwargs):
        raise AssertionError("a chunk needed a repair although it started from the true counts")

    monkeypatch.setattr(blending, "_guess_counts", true_guess)
    monkeypatch.setattr(blending, "_repair_in_place", no_repair)
    monkeypatch.setattr(blending, "_repair_sequentially", no_repair)
    got = build_blending_indices(weights, num_samples)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_the_guess_is_usually_right_so_repairs_are_rare():
    """Not a correctness condition (any guess gives the loop's result) but the reason for the speed."""
    w = np.array([0.6, 0.3, 0.1])
    firsts = np.arange(2000, dtype=np.int64) * 64
    guessed = blending._guess_counts(w, firsts)
    dataset_index, _ = greedy_reference(w, int(firsts[-1]))
    onehot = np.eye(3, dtype=np.int64)[dataset_index]
    true_counts = np.vstack([np.zeros(3, np.int64), np.cumsum(onehot, axis=0)])[firsts].T
    assert (guessed.sum(axis=0) == firsts).all()
    assert (guessed == true_counts).all(axis=0).mean() > 0.9


def test_single_dataset_and_empty_blend():
    dataset_index, sample_index = build_blending_indices([1.0], 5)
    assert dataset_index.tolist() == [0] * 5 and sample_index.tolist() == list(range(5))
    assert [a.size for a in build_blending_indices([0.3, 0.7], 0)] == [0, 0]


# --------------------------------------------------------------------------- the cache


class Sized:
    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size


def test_blend_cache_is_written_then_reused_and_keyed_by_its_inputs(tmp_path, monkeypatch):
    calls = []
    real = blending.build_blending_indices

    def counting(weights, num_samples):
        calls.append((tuple(weights), num_samples))
        return real(weights, num_samples)

    monkeypatch.setattr(blending, "build_blending_indices", counting)
    parts = [Sized(10_000), Sized(10_000)]
    first = BlendedDataset(parts, [1, 3], 5000, cache_dir=str(tmp_path))
    assert len(calls) == 1 and not first.loaded_from_cache
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in first.cache_paths.values())
    second = BlendedDataset(parts, [2, 6], 5000, cache_dir=str(tmp_path))  # the same normalised weights
    assert len(calls) == 1 and second.loaded_from_cache
    np.testing.assert_array_equal(second.dataset_index, first.dataset_index)
    np.testing.assert_array_equal(second.dataset_sample_index, first.dataset_sample_index)
    BlendedDataset(parts, [1, 3], 5001, cache_dir=str(tmp_path))
    BlendedDataset(parts, [1, 2], 5000, cache_dir=str(tmp_path))
    assert len(calls) == 3
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_a_damaged_or_mismatched_blend_cache_is_rebuilt(tmp_path):
    parts = [Sized(1000), Sized(1000)]
    paths = blending_cache_paths(str(tmp_path), [0.25, 0.75], 600)
    os.makedirs(tmp_path, exist_ok=True)
    with open(paths["dataset"], "wb") as damaged:
        damaged.write(b"not an npy file")
    np.save(paths["dataset_sample"], np.arange(600))
    rebuilt = BlendedDataset(parts, [0.25, 0.75], 600, cache_dir=str(tmp_path))
    assert not rebuilt.loaded_from_cache
    np.save(paths["dataset"], np.zeros(599, dtype=np.int16))  # the wrong length
    assert not BlendedDataset(parts, [0.25, 0.75], 600, cache_dir=str(tmp_path)).loaded_from_cache
    assert BlendedDataset(parts, [0.25, 0.75], 600, cache_dir=str(tmp_path)).loaded_from_cache


def write_corpus(prefix, lengths):
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        for length in lengths:
            writer.add_document(np.arange(length))
    return IndexedDataset(prefix)


def test_blend_of_prefixes_caches_beside_the_first_prefix(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_corpus(str(tmp_path / "a" / "one"), [20] * 50)
    write_corpus(str(tmp_path / "b" / "two"), [30] * 50)
    data_path = ["0.3", str(tmp_path / "a" / "one"), "0.7", str(tmp_path / "b" / "two")]
    train, _, _ = build_train_valid_test_datasets(data_path, "1", 8, 0, (400, 0, 0))
    assert isinstance(train, BlendedDataset) and not train.loaded_from_cache
    assert all(os.path.dirname(path) == str(tmp_path / "a") for path in train.cache_paths.values())
    again, _, _ = build_train_valid_test_datasets(data_path, "1", 8, 0, (400, 0, 0))
    assert again.loaded_from_cache and all(d.loaded_from_cache for d in again.datasets)
    assert [again[i]["tokens"].tolist() for i in range(0, 400, 37)] == [train[i]["tokens"].tolist() for i in range(0, 400, 37)]
