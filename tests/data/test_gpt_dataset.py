"""GPT samples, splits, shuffles, caching and blending, checked against naive references."""

import os

import numpy as np
import pytest
import torch

from data import DataError, gpt_dataset
from data.gpt_dataset import (
    BlendedDataset,
    GPTDataset,
    build_blending_indices,
    build_document_index,
    build_sample_index,
    build_shuffle_index,
    build_train_valid_test_datasets,
    epoch_sample_boundaries,
    parse_data_path,
    parse_split,
    samples_per_dataset,
    split_document_ranges,
)
from data.indexed import IndexedDataset, IndexedDatasetWriter

# --------------------------------------------------------------------------- naive references


def naive_sample_index(lengths, document_index, seq_length, num_samples):
    """Megatron's C++ helper (build_sample_idx) transcribed into plain Python loops."""
    rows = [(0, 0)]
    position, offset = 0, 0
    for _ in range(num_samples):
        remaining = seq_length + 1
        while remaining != 0:
            available = lengths[document_index[position]] - offset
            remaining -= available
            if remaining <= 0:
                offset += remaining + available - 1  # stay on the sample's last token
                remaining = 0
            else:
                position += 1
                offset = 0
        rows.append((position, offset))
    return np.array(rows, dtype=np.int64)


def naive_blending(weights, num_samples):
    counts = np.zeros(len(weights))
    chosen = []
    for i in range(num_samples):
        # Megatron's helpers.cpp build_blending_indices: weight * max(i, 1) - count; argmax picks the lowest d on ties
        d = int(np.argmax(np.asarray(weights) * max(i, 1) - counts))
        chosen.append(d)
        counts[d] += 1
    return chosen


# --------------------------------------------------------------------------- fixtures


def write_corpus(prefix, document_lengths, first_token=0):
    """Documents whose tokens are consecutive integers, so every token names its own position."""
    with IndexedDatasetWriter(prefix, np.int32) as writer:
        token = first_token
        for length in document_lengths:
            writer.add_document(np.arange(token, token + length))
            token += length
    return IndexedDataset(prefix)


@pytest.fixture
def corpus(tmp_path):
    lengths = np.random.default_rng(0).integers(0, 40, size=60)
    lengths[[3, 17]] = 0
    lengths[[5, 9]] = 1
    lengths[11] = 150
    return write_corpus(str(tmp_path / "corpus"), lengths)


def samples(dataset, count=None):
    return [dataset[i]["tokens"].numpy() for i in range(count if count is not None else len(dataset))]


# --------------------------------------------------------------------------- index builders


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("seq_length", [1, 3, 16, 64])
def test_sample_index_matches_naive_reference(seed, seq_length):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 50, size=80)
    lengths[rng.integers(0, 80, size=10)] = 0
    lengths[rng.integers(0, 80, size=5)] = 1
    lengths[rng.integers(0, 80, size=3)] = 200  # longer than several samples
    document_index = build_document_index(np.arange(80), 3, seed)
    total = int(lengths[document_index].sum())
    num_samples = (total - 1) // seq_length
    got = build_sample_index(lengths, document_index, seq_length, num_samples)
    assert got.dtype == np.int64 and got.shape == (num_samples + 1, 2)
    np.testing.assert_array_equal(got, naive_sample_index(lengths, document_index, seq_length, num_samples))


@pytest.mark.parametrize("seq_length", [5, 8])  # a division and a shift
def test_sample_index_over_many_documents_matches_a_binary_search(seq_length):
    """Long enough to be read in several blocks of documents, with empty documents throughout."""
    rng = np.random.default_rng(seq_length)
    lengths = rng.integers(0, 9, size=300_000)
    document_index = build_document_index(np.arange(lengths.size), 2, seed=3)
    ends = np.cumsum(lengths[document_index])
    for num_samples in (int(ends[-1] - 1) // seq_length, 1000):
        token_positions = np.arange(num_samples + 1) * seq_length
        positions = np.searchsorted(ends, token_positions, side="right")
        offsets = token_positions - (ends[positions] - lengths[document_index[positions]])
        got = build_sample_index(lengths, document_index, seq_length, num_samples)
        np.testing.assert_array_equal(got, np.stack([positions, offsets], axis=1))


def test_orders_are_numpys_permutations_per_epoch():
    """The in-place shuffles (int32 where it fits) draw the same swaps as Generator.permutation, the
    formulation earlier versions used, so caches and resumed runs keep their order."""
    ids = np.arange(5, 1005)
    expected = np.concatenate([np.random.default_rng([7, gpt_dataset._DOCUMENT_ORDER_STREAM, epoch]).permutation(ids)
                               for epoch in range(3)])
    np.testing.assert_array_equal(build_document_index(ids, 3, seed=7), expected)
    boundaries = [0, 300, 650, 1000]
    expected = np.concatenate([start + np.random.default_rng([7, gpt_dataset._SAMPLE_ORDER_STREAM, epoch]).permutation(stop - start)
                               for epoch, (start, stop) in enumerate(zip(boundaries[:-1], boundaries[1:]))])
    got = build_shuffle_index(boundaries, 7)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


def test_sample_index_refuses_more_samples_than_tokens():
    with pytest.raises(ValueError, match="tokens"):
        build_sample_index(np.array([5, 5]), np.array([0, 1]), 5, 2)  # needs 11 tokens, has 10


def test_document_index_is_a_permutation_per_epoch_and_prefix_stable():
    ids = np.arange(10, 30)
    three = build_document_index(ids, 3, seed=7)
    assert three.dtype == np.int32 and len(three) == 60
    for epoch in range(3):
        assert sorted(three[epoch * 20 : (epoch + 1) * 20]) == list(ids)
    np.testing.assert_array_equal(build_document_index(ids, 5, seed=7)[:60], three)
    assert not np.array_equal(three[:20], three[20:40])
    assert not np.array_equal(build_document_index(ids, 3, seed=8), three)


def test_shuffle_index_permutes_within_epoch_blocks_and_is_prefix_stable():
    boundaries = epoch_sample_boundaries(tokens_per_epoch=1000, seq_length=7, num_epochs=4)
    assert boundaries.tolist() == [0, 143, 286, 429, 572]  # ceil(e * 1000 / 7)
    shuffle = build_shuffle_index(boundaries, seed=3)
    for start, stop in zip(boundaries[:-1], boundaries[1:]):
        assert sorted(shuffle[start:stop]) == list(range(start, stop))
    assert not np.array_equal(shuffle, np.arange(len(shuffle)))
    np.testing.assert_array_equal(build_shuffle_index(boundaries[:3], seed=3), shuffle[:286])


# --------------------------------------------------------------------------- GPTDataset


def test_samples_tile_the_shuffled_documents(corpus, tmp_path):
    seq_length = 16
    ids = np.arange(corpus.num_documents)
    tokens_per_epoch = int(corpus.document_lengths.sum())
    # Ask for exactly two epochs' worth of sample starts so the served samples are all built ones.
    num_samples = int(epoch_sample_boundaries(tokens_per_epoch, seq_length, 2)[-1])
    ds = GPTDataset(corpus, ids, num_samples, seq_length, seed=5, name="train", cache_dir=str(tmp_path / "c"))
    assert ds.num_epochs == 2 and len(ds) == num_samples
    served = samples(ds)
    assert all(s.shape == (seq_length + 1,) and s.dtype == np.int64 for s in served)
    assert sorted(ds.shuffle_index.tolist()) == list(range(num_samples))
    in_order = [served[i] for i in np.argsort(ds.shuffle_index)]
    stream = np.concatenate([in_order[0]] + [s[1:] for s in in_order[1:]])
    documents = np.concatenate([corpus.get_document(int(d)) for d in build_document_index(ids, 3, 5)])
    np.testing.assert_array_equal(stream, documents[: len(stream)])
    assert len(stream) == num_samples * seq_length + 1


def test_more_samples_keep_the_first_ones(corpus, tmp_path):
    ids = np.arange(corpus.num_documents)
    small = GPTDataset(corpus, ids, 100, 8, seed=1, name="train", cache_dir=str(tmp_path / "c"))
    large = GPTDataset(corpus, ids, 1000, 8, seed=1, name="train", cache_dir=str(tmp_path / "c"))
    assert large.num_epochs > small.num_epochs
    for a, b in zip(samples(small), samples(large, 100)):
        np.testing.assert_array_equal(a, b)


def test_seed_decides_the_samples(corpus, tmp_path):
    ids = np.arange(corpus.num_documents)

    def build(seed, cache):
        return samples(GPTDataset(corpus, ids, 50, 8, seed=seed, name="train", cache_dir=str(tmp_path / cache)))

    first, again, other = build(1, "a"), build(1, "b"), build(2, "c")
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_short_split_shorter_than_one_sample(tmp_path):
    corpus = write_corpus(str(tmp_path / "tiny"), [3, 0, 2])
    ds = GPTDataset(corpus, np.arange(3), 4, 16, seed=0, name="train", cache_dir=None)
    for sample in samples(ds):
        assert len(sample) == 17 and set(sample.tolist()) <= {0, 1, 2, 3, 4}


def test_cache_is_written_then_reused(corpus, tmp_path, monkeypatch):
    calls = []
    real_builder = gpt_dataset.build_sample_index

    def counting_builder(*args, **kwargs):
        calls.append(1)
        return real_builder(*args, **kwargs)

    monkeypatch.setattr(gpt_dataset, "build_sample_index", counting_builder)
    ids = np.arange(corpus.num_documents)
    cache_dir = tmp_path / "cache"
    first = GPTDataset(corpus, ids, 64, 8, seed=0, name="train", cache_dir=str(cache_dir))
    assert len(calls) == 1 and not first.loaded_from_cache
    assert sorted(os.listdir(cache_dir)) == sorted(os.path.basename(p) for p in first.cache_paths.values())
    second = GPTDataset(corpus, ids, 64, 8, seed=0, name="train", cache_dir=str(cache_dir))
    assert len(calls) == 1 and second.loaded_from_cache
    assert all(np.array_equal(a, b) for a, b in zip(samples(first), samples(second)))
    GPTDataset(corpus, ids, 65, 8, seed=0, name="train", cache_dir=str(cache_dir))  # other key
    assert len(calls) == 2
    stat = os.stat(corpus.index_path)
    os.utime(corpus.index_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # data "changed"
    GPTDataset(corpus, ids, 64, 8, seed=0, name="train", cache_dir=str(cache_dir))
    assert len(calls) == 3


def test_cache_defaults_to_the_data_directory(corpus):
    ds = GPTDataset(corpus, np.arange(corpus.num_documents), 10, 8, seed=0, name="valid")
    directory = os.path.dirname(corpus.index_path)
    assert all(os.path.dirname(p) == directory and os.path.isfile(p) for p in ds.cache_paths.values())
    assert not [name for name in os.listdir(directory) if name.endswith(".tmp")]


def test_unwritable_cache_falls_back_to_no_cache(corpus, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    ids = np.arange(corpus.num_documents)
    ds = GPTDataset(corpus, ids, 10, 8, seed=0, name="train", cache_dir=str(blocker / "sub"))
    assert len(samples(ds)) == 10


def test_empty_inputs_raise_data_error(tmp_path, corpus):
    with pytest.raises(DataError, match="no documents"):
        GPTDataset(corpus, np.arange(0), 10, 8, seed=0, name="train")
    no_tokens = write_corpus(str(tmp_path / "blank"), [0, 0, 0])
    with pytest.raises(DataError, match="no tokens"):
        GPTDataset(no_tokens, np.arange(3), 10, 8, seed=0, name="train")
    with pytest.raises(DataError, match="blank"):
        build_train_valid_test_datasets([str(tmp_path / "blank")], "1,0,0", 8, 0, (10, 0, 0))
    write_corpus(str(tmp_path / "nothing"), [])
    with pytest.raises(DataError, match="nothing: the train split has no documents"):
        build_train_valid_test_datasets([str(tmp_path / "nothing")], "969,30,1", 8, 0, (10, 1, 1))


# --------------------------------------------------------------------------- splits


def test_parse_split():
    assert parse_split("969,30,1") == pytest.approx((0.969, 0.030, 0.001))
    assert parse_split("98,2,0") == pytest.approx((0.98, 0.02, 0.0))
    assert parse_split("1") == (1.0, 0.0, 0.0)
    for bad in ["", "a,b,c", "1,2,3,4", "-1,2,0", "0,0,0", "nan,1,1"]:
        with pytest.raises(DataError, match="--split"):
            parse_split(bad)


def test_split_document_ranges():
    assert split_document_ranges(1000, "969,30,1") == [(0, 969), (969, 999), (999, 1000)]
    assert split_document_ranges(100, "98,2,0") == [(0, 98), (98, 100), (100, 100)]
    assert split_document_ranges(0, "98,2,0") == [(0, 0), (0, 0), (0, 0)]
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 50))
        fractions = parse_split(",".join(str(int(v)) for v in rng.integers(0, 5, size=3) + [1, 0, 0]))
        ranges = split_document_ranges(n, fractions)
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        assert all(start <= end for start, end in ranges)
        assert all(abs((end - start) - f * n) <= 1 for (start, end), f in zip(ranges, fractions))


def test_train_valid_test_follow_the_split(tmp_path):
    write_corpus(str(tmp_path / "c"), [10] * 100)
    train, valid, test = build_train_valid_test_datasets([str(tmp_path / "c")], "80,20,0", 8, 0, (30, 5, 5))
    assert test is None and len(train) == 30 and len(valid) == 5
    assert train.document_ids.tolist() == list(range(80)) and valid.document_ids.tolist() == list(range(80, 100))
    assert all(s.max() < 800 for s in samples(train)) and all(s.min() >= 800 for s in samples(valid))
    _, no_valid, _ = build_train_valid_test_datasets([str(tmp_path / "c")], "80,20,0", 8, 0, (30, 0, 0))
    assert no_valid is None


# --------------------------------------------------------------------------- blending


def test_blending_indices_match_the_greedy_reference():
    weights = [0.2, 0.3, 0.5]
    dataset_index, sample_index = build_blending_indices(weights, 2000)
    assert dataset_index.tolist() == naive_blending(weights, 2000)
    for d in range(3):
        assert sample_index[dataset_index == d].tolist() == list(range(int((dataset_index == d).sum())))


def test_blend_draws_each_dataset_in_proportion_and_in_order(tmp_path):
    prefixes = []
    for k, lengths in enumerate([[30] * 40, [17] * 80, [50] * 20]):
        write_corpus(str(tmp_path / f"d{k}"), lengths, first_token=1_000_000 * k)
        prefixes.append(str(tmp_path / f"d{k}"))
    data_path = ["2", prefixes[0], "3", prefixes[1], "5", prefixes[2]]
    train, _, _ = build_train_valid_test_datasets(data_path, "1", 4, 0, (10000, 0, 0), cache_dir=str(tmp_path / "c"))
    assert isinstance(train, BlendedDataset) and len(train) == 10000
    drawn = np.bincount(train.dataset_index, minlength=3) / 10000
    np.testing.assert_allclose(drawn, [0.2, 0.3, 0.5], atol=0.01)
    for i in range(0, 10000, 97):
        d, k = train.locate(i)
        tokens = train[i]["tokens"].numpy()
        assert tokens.min() // 1_000_000 == d
        np.testing.assert_array_equal(tokens, train.datasets[d][k]["tokens"].numpy())
    counts = samples_per_dataset([0.2, 0.3, 0.5], 10000)
    assert [len(ds) for ds in train.datasets] == counts
    assert all(c > w * 10000 for c, w in zip(counts, [0.2, 0.3, 0.5]))


def test_blend_rejects_constituents_that_are_too_short(corpus):
    short = GPTDataset(corpus, np.arange(corpus.num_documents), 10, 8, seed=0, name="train", cache_dir=None)
    with pytest.raises(ValueError, match="samples_per_dataset"):
        BlendedDataset([short, short], [0.5, 0.5], 100)


def test_parse_data_path():
    assert parse_data_path(["A"]) == (["A"], [1.0])
    prefixes, weights = parse_data_path(["0.3", "A", "0.7", "B"])
    assert prefixes == ["A", "B"] and weights == pytest.approx([0.3, 0.7])
    assert parse_data_path(["3", "A", "1", "B"])[1] == pytest.approx([0.75, 0.25])
    # prefixes without weights are a blend by size (tests/data/test_blend_by_size.py)
    for bad in [[], ["0.3", "A", "B", "C"], ["-1", "A", "2", "B"], ["0", "A", "1", "B"], ["inf", "A", "1", "B"]]:
        with pytest.raises(DataError, match="--data-path"):
            parse_data_path(bad)


def test_data_loader_workers_serve_the_same_samples(corpus, tmp_path):
    ds = GPTDataset(corpus, np.arange(corpus.num_documents), 12, 8, seed=0, name="train", cache_dir=str(tmp_path / "c"))
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="spawn")
    from_workers = torch.cat([batch["tokens"] for batch in loader]).numpy()
    np.testing.assert_array_equal(from_workers, np.stack(samples(ds)))
