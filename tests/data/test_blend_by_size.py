"""--data-path with prefixes and no weights: blended by their sizes, as Megatron-Core does (issue 54; swiss-ai's
Apertus launch lists its prefixes so).

NVIDIA/Megatron-LM (main):
- megatron/core/datasets/utils.py get_blend_from_list: an odd number of entries, or an even number whose weight
  places hold no floats, is a list of prefixes with weights None;
- megatron/core/datasets/blended_megatron_dataset_builder.py _build_blended_dataset_splits: weights None builds
  each prefix's split for one epoch (sizes None) and blends with `weights_i = [len(megatron_dataset) ...]` and
  `size_i = min(self.sizes[i], sum(weights_i))`;
- megatron/core/datasets/gpt_dataset.py GPTDataset.__len__ for one epoch:
  (num_tokens_per_epoch - add_extra_token_to_sequence) // sequence_length;
- megatron/core/datasets/blended_dataset.py _build_indices: the weights normalized, then helpers.cpp
  build_blending_indices (the greedy loop written out below).
"""

import numpy as np
import pytest

from data import DataError
from data.gpt_dataset import build_train_valid_test_datasets, parse_data_path
from tests.reliability_helpers import write_dataset

SEQ = 8


def megatron_blending_indices(weights, size):
    """helpers.cpp build_blending_indices, as written there: the dataset whose error weight * max(i, 1) - drawn
    is largest (the first on a tie) gives sample i."""
    weights = (np.asarray(weights, dtype=np.float64) / np.sum(np.asarray(weights, dtype=np.float64))).tolist()
    drawn = [0] * len(weights)
    index = []
    for sample in range(size):
        at = max(float(sample), 1.0)
        errors = [w * at - c for w, c in zip(weights, drawn)]
        best = max(range(len(weights)), key=lambda d: (errors[d], -d))
        index.append(best)
        drawn[best] += 1
    return index


def prefixes(tmp_path, lengths_per_prefix):
    rng = np.random.default_rng(0)
    out = []
    for name, lengths in zip("ABC", lengths_per_prefix):
        out.append(write_dataset(tmp_path / name, [rng.integers(0, 300, n).tolist() for n in lengths]))
    return out


def test_prefixes_alone_are_megatrons_unweighted_blend():
    assert parse_data_path(["A", "B", "C"]) == (["A", "B", "C"], None)
    assert parse_data_path(["A", "B"]) == (["A", "B"], None)  # even, and no weight is a number
    assert parse_data_path(["0.3", "A", "B"]) == (["0.3", "A", "B"], None)  # odd: prefixes, as Megatron reads it
    assert parse_data_path(["A"]) == (["A"], [1.0])
    assert parse_data_path(["1", "A", "3", "B"]) == (["A", "B"], [0.25, 0.75])
    with pytest.raises(DataError, match="give a weight before every prefix, or prefixes alone"):
        parse_data_path(["0.3", "A", "B", "C"])


def test_an_epoch_of_the_blend_draws_from_each_prefix_as_many_samples_as_megatron_gives_it(tmp_path):
    """Three prefixes of 70, 23 and 150 documents of varied lengths: each weighs its one-epoch sample count,
    (tokens - 1) // seq_length; over that many samples in all, the blend draws exactly those counts, in
    Megatron's blending loop's order, and equals the blend with those counts given as weights."""
    rng = np.random.default_rng(1)
    lengths = [rng.integers(3, 40, 70).tolist(), rng.integers(3, 40, 23).tolist(), rng.integers(3, 40, 150).tolist()]
    paths = prefixes(tmp_path, lengths)
    sizes = [(sum(doc) - 1) // SEQ for doc in lengths]
    epoch = sum(sizes)
    train, _, _ = build_train_valid_test_datasets(paths, "100,0,0", SEQ, 5, (epoch, 0, 0),
                                                  cache_dir=str(tmp_path / "cache"))
    drawn = [train.locate(i)[0] for i in range(epoch)]
    # Megatron's loop draws exactly each prefix's size over the epoch, and ours draws them in its order.
    assert np.bincount(megatron_blending_indices(sizes, epoch), minlength=3).tolist() == sizes
    assert np.bincount(drawn, minlength=3).tolist() == sizes
    assert drawn == megatron_blending_indices(sizes, epoch)
    weighted, _, _ = build_train_valid_test_datasets(
        [token for size, path in zip(sizes, paths) for token in (str(size), path)], "100,0,0", SEQ, 5, (epoch, 0, 0),
        cache_dir=str(tmp_path / "cache"))
    for i in range(0, epoch, 7):
        assert np.array_equal(train[i]["tokens"], weighted[i]["tokens"])
    # Megatron's blend ends at one epoch of every prefix; here it goes on in the same proportions.
    longer, _, _ = build_train_valid_test_datasets(paths, "100,0,0", SEQ, 5, (3 * epoch, 0, 0),
                                                   cache_dir=str(tmp_path / "cache"))
    assert np.bincount([longer.locate(i)[0] for i in range(3 * epoch)], minlength=3).tolist() == \
           [3 * size for size in sizes]


def test_each_split_weighs_its_own_documents(tmp_path):
    """With --split 80,20,0 a prefix's train and valid splits are its documents' first 80% and next 20%: each
    split of the blend weighs each prefix by the samples of its own part (Megatron builds each split's
    mid-level datasets for one epoch and takes their lengths)."""
    rng = np.random.default_rng(2)
    lengths = [rng.integers(3, 40, 50).tolist(), rng.integers(3, 40, 120).tolist()]
    paths = prefixes(tmp_path, lengths)
    train_docs = [round(0.8 * len(doc)) for doc in lengths]
    train_sizes = [(sum(doc[:n]) - 1) // SEQ for doc, n in zip(lengths, train_docs)]
    valid_sizes = [(sum(doc[n:]) - 1) // SEQ for doc, n in zip(lengths, train_docs)]
    train, valid, _ = build_train_valid_test_datasets(paths, "80,20,0", SEQ, 5, (sum(train_sizes), sum(valid_sizes), 0),
                                                      cache_dir=str(tmp_path / "cache"))
    assert np.bincount([train.locate(i)[0] for i in range(len(train))], minlength=2).tolist() == train_sizes
    assert np.bincount([valid.locate(i)[0] for i in range(len(valid))], minlength=2).tolist() == valid_sizes


def test_a_launch_with_prefixes_alone_trains_and_resumes_exactly(corpus_cache_300, tmp_path):
    """pretrain_gpt with `--data-path A B` (two prefixes, no weights) trains, and a save at iteration 2 resumes
    to the straight run's losses (the checkpoint's data identity records the blend as by size)."""
    import json
    from pathlib import Path

    from tests.reliability_helpers import TINY, straight_and_resumed

    tokenizer = str(next(Path(corpus_cache_300).glob("pydoc-topics-v300-*")) / "tokenizer" / "tokenizer.json")
    a = write_dataset(tmp_path / "a_text_document", [[(7 * d + i) % 250 for i in range(40)] for d in range(30)])
    b = write_dataset(tmp_path / "b_text_document", [[(3 * d + i) % 250 for i in range(25)] for d in range(90)])
    argv = TINY + ["--train-iters", "4", "--data-path", a, b, "--tokenizer-file", tokenizer, "--split", "1,0,0"]
    straight, split, save = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert len(straight) == 4
    assert [(r["iteration"], r["loss"]) for r in straight] == [(r["iteration"], r["loss"]) for r in split]
    identity = json.loads((save / "iter_0000002" / "metadata.json").read_text())["data_identity"]
    assert [entry["weight"] for entry in identity] == [None, None]
