"""ALCF's --data-file-list with --shuffle-sample-in-corpus and --blend-sample-in-corpus (issue 64 item 4): which line
of the list, and which of that line's samples, each sample of a split is, against the fork's own index code copied
below from argonne-lcf/Megatron-DeepSpeed at ffa3456d68b630192fcaefcc3288bd18525b8d95:

- pretrain_gpt_alcf.py train_valid_test_datasets_provider: `w, fname, c = f.split()`, `.bin` cut off;
- megatron/data/dataset_utils.py get_datasets_weights_and_num_samples: normalized weights,
  `int(math.ceil(val * weight * 1.005))` samples per line and split;
- megatron/data/gpt_dataset.py build_train_valid_test_datasets: `corpus_list = sorted(set(corpuses))`, the split's
  size the sum of the lines' counts; BuildCorpusDataset: helpers.cpp build_concat_indices (or, with
  --blend-sample-in-corpus, build_blending_indices with `weights = num_samples_list / self.num_samples`), then
  `np_rng = np.random.RandomState(seed=...); self.shuffle_index = np.arange(self.num_samples)` shuffled under
  --shuffle-sample-in-corpus; `__getitem__`: `id_shuffle = self.shuffle_index[idx]`;
- megatron/data/blendable_dataset.py BlendableDataset: weights / their sum, build_blending_indices over the corpora.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from arguments.parser import parse_arguments
from base.errors import ConfigError
from data import DataError
from data.corpus_list import build_corpus_list_datasets, read_data_file_list
from tests.reliability_helpers import write_dataset

SEQ = 8
SEED = 1234


# ---- the fork's code, copied (see the module docstring) ------------------------------------------------------------

def fork_get_datasets_weights_and_num_samples(data_prefix, train_valid_test_num_samples):
    assert len(data_prefix) % 2 == 0
    num_datasets = len(data_prefix) // 2
    weights = [0] * num_datasets
    prefixes = [0] * num_datasets
    for i in range(num_datasets):
        weights[i] = float(data_prefix[2 * i])
        prefixes[i] = (data_prefix[2 * i + 1]).strip()
    weight_sum = 0.0
    for weight in weights:
        weight_sum += weight
    assert weight_sum > 0.0
    weights = [weight / weight_sum for weight in weights]
    datasets_train_valid_test_num_samples = []
    for weight in weights:
        datasets_train_valid_test_num_samples.append(
            [int(math.ceil(val * weight * 1.005)) for val in train_valid_test_num_samples])
    return prefixes, weights, datasets_train_valid_test_num_samples


def fork_build_concat_indices(num_samples):
    dataset_index, dataset_sample_index = [], []
    for i, n in enumerate(num_samples):
        for j in range(n):
            dataset_index.append(i)
            dataset_sample_index.append(j)
    return dataset_index, dataset_sample_index


def fork_build_blending_indices(weights, size):
    current = [0] * len(weights)
    dataset_index, dataset_sample_index = [], []
    for sample_idx in range(size):
        sample_idx_double = max(float(sample_idx), 1.0)
        max_error_index = 0
        max_error = weights[0] * sample_idx_double - float(current[0])
        for dataset_idx in range(1, len(weights)):
            error = weights[dataset_idx] * sample_idx_double - float(current[dataset_idx])
            if error > max_error:
                max_error = error
                max_error_index = dataset_idx
        dataset_index.append(max_error_index)
        dataset_sample_index.append(current[max_error_index])
        current[max_error_index] += 1
    return dataset_index, dataset_sample_index


def fork_samples(lines, split_index, train_valid_test_num_samples, shuffle, blend):
    """(line, sample of that line) of each sample of the split, as the fork's datasets index them."""
    data_prefix = []
    for line in lines:
        w, fname, c = line.split()
        if fname.find(".bin") != -1:
            fname = fname.split(".bin")[0]
        data_prefix.extend([float(w), fname, c])
    new_prefix, corpuses = [], []
    for i in range(len(data_prefix) // 3):
        new_prefix += [data_prefix[3 * i], data_prefix[3 * i + 1]]
        corpuses.append(data_prefix[3 * i + 2])
    _, _, counts = fork_get_datasets_weights_and_num_samples(new_prefix, train_valid_test_num_samples)
    corpus_list = sorted(set(corpuses))
    split_size = sum(count[split_index] for count in counts)
    corpora = []
    for c in corpus_list:
        members = [i for i in range(len(corpuses)) if corpuses[i] == c]
        num_samples_list = np.array([counts[i][split_index] for i in members])
        num_samples = np.sum(num_samples_list)
        if blend:
            index = fork_build_blending_indices((num_samples_list / num_samples).tolist(), int(num_samples))
        else:
            index = fork_build_concat_indices(num_samples_list.tolist())
        np_rng = np.random.RandomState(seed=SEED)
        shuffle_index = np.arange(num_samples)
        if shuffle:
            np_rng.shuffle(shuffle_index)
        corpora.append((members, index, shuffle_index, int(num_samples)))
    weights = np.array([corpus[3] / split_size for corpus in corpora], dtype=np.float64)
    weights /= np.sum(weights)
    top = fork_build_blending_indices(weights.tolist(), split_size)
    samples = []
    for k in range(split_size):
        members, index, shuffle_index, _ = corpora[top[0][k]]
        id_shuffle = shuffle_index[top[1][k]]
        samples.append((members[index[0][id_shuffle]], index[1][id_shuffle]))
    return samples


# ---- the test ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus-list")
    rng = np.random.default_rng(0)
    prefixes = [write_dataset(root / name, [rng.integers(0, 300, n).tolist() for n in rng.integers(3, 40, docs)])
                for name, docs in (("a", 80), ("b", 40), ("c", 120))]
    # five lines in three corpora, listed out of corpus order; one prefix in two corpora, one with its .bin suffix
    lines = [f"0.2 {prefixes[2]} web", f"0.1 {prefixes[0]}.bin books", f"0.35 {prefixes[1]} web",
             f"0.05 {prefixes[0]} arxiv", f"0.3 {prefixes[2]} books"]
    path = root / "list.txt"
    path.write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n")
    return str(path), lines, root


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
@pytest.mark.parametrize("blend", [False, True], ids=["concatenated", "blended"])
def test_each_sample_is_the_forks_line_and_sample_of_that_line(corpus, shuffle, blend):
    path, lines, root = corpus
    entries = read_data_file_list(path)
    sizes = (60, 12, 0)
    datasets = build_corpus_list_datasets(entries, "90,10,0", SEQ, SEED, sizes, shuffle=shuffle, blended=blend,
                                          cache_dir=str(root / "cache"))
    assert datasets[2] is None
    corpora = sorted({entry.corpus for entry in entries})
    for split, size in ((0, 60), (1, 12)):
        blended = datasets[split]
        ours = []
        for k in range(size):
            corpus_index, j = blended.locate(k)
            line_in_corpus, sample = blended.datasets[corpus_index].locate(j)
            members = [i for i, entry in enumerate(entries) if entry.corpus == corpora[corpus_index]]
            ours.append((members[line_in_corpus], sample))
        assert ours == fork_samples(lines, split, list(sizes), shuffle, blend)[:size], split
    # each line's dataset reads its prefix's documents of the split
    assert datasets[1][0]["tokens"].shape == (SEQ + 1,)


def test_the_list_file_is_read_as_the_fork_reads_it_and_refused_in_one_line_otherwise(corpus, tmp_path):
    path, lines, _ = corpus
    entries = read_data_file_list(path)
    assert [(entry.weight, entry.corpus) for entry in entries] == [(0.2, "web"), (0.1, "books"), (0.35, "web"),
                                                                   (0.05, "arxiv"), (0.3, "books")]
    assert not entries[1].prefix.endswith(".bin")
    bad = tmp_path / "bad.txt"
    bad.write_text("0.5 /data/a_text_document\n")
    with pytest.raises(DataError, match="line 1: .* is not 'weight prefix corpus'"):
        read_data_file_list(str(bad))
    with pytest.raises(ConfigError, match="--data-path and --data-file-list: a single data source") as error:
        parse_arguments(["--data-file-list", path, "--data-path", "/d/a", "--tokenizer-file", "/t.json"])
    assert "\n" not in str(error.value)
    parsed = parse_arguments(["--data-file-list", path, "--shuffle-sample-in-corpus", "--tokenizer-file", "/t.json"])
    assert parsed.config.data.sources().file_list == entries and parsed.config.data.shuffle_sample_in_corpus
