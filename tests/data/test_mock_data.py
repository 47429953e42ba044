"""--mock-data: Megatron-Core's MockGPTDataset (github:NVIDIA/Megatron-LM megatron/core/datasets/gpt_dataset.py at
d98e8a64). MockGPTLowLevelDataset.__init__ draws sequence_lengths = numpy.random.default_rng(seed=0).integers(
low=1, high=4096, size=100000, dtype=numpy.int32), and __getitem__(idx) is numpy.int64(numpy.concatenate([
(numpy.arange(length - 1) + 1) % vocab_size, [eod]])); MockGPTDataset is a GPTDataset over those documents, so
--split divides the 100000 documents and samples are --seq-length + 1 tokens read across documents."""

from __future__ import annotations

import json

import numpy as np
import pytest

from arguments.parser import parse_config
from base.errors import ConfigError
from data.mock import MockDocuments, build_mock_datasets


def _megatron_document(idx: int, vocab_size: int, eod: int) -> np.ndarray:
    lengths = np.random.default_rng(seed=0).integers(low=1, high=4096, size=100000, dtype=np.int32)
    length = lengths[idx]
    return np.int64(np.concatenate([(np.arange(length - 1) + 1) % vocab_size, [eod]]))


def test_mock_documents_are_megatrons():
    documents = MockDocuments(vocab_size=300, eod_id=299)
    assert documents.num_documents == 100000
    for idx in (0, 1, 7, 12345, 99999):
        expected = _megatron_document(idx, 300, 299)
        assert np.array_equal(documents.get_document(idx), expected)
        assert documents.document_lengths[idx] == len(expected)
        assert np.array_equal(documents.get_document(idx, 3, 5), expected[3:8])  # IndexedDataset.get's slicing


def test_mock_samples_split_the_documents_evenly_and_read_through_them(tmp_path):
    """Megatron-Core splits mock documents "1,1,1" whatever --split says (BlendedMegatronDatasetConfig.__post_init__:
    `self.split = "1,1,1"`, "an arbitrarily even split, as mock is True"): of 100000 documents 33333, 33334 and
    33333 (Megatron rounds each bound: the same here), and each sample is seq_length + 1 tokens read through the
    shuffled documents."""
    vocab, eod, seq = 1000, 999, 64
    train, valid, test = build_mock_datasets(seq, 1234, (50, 20, 10), vocab, eod, str(tmp_path))
    assert [(int(s.document_ids[0]), int(s.document_ids[-1]) + 1) for s in (train, valid, test)] == \
        [(0, 33333), (33333, 66667), (66667, 100000)]
    assert (len(train), len(valid), len(test)) == (50, 20, 10)
    for dataset in (train, valid, test):
        for i in range(len(dataset)):
            tokens = dataset[i]["tokens"].numpy()
            assert tokens.shape == (seq + 1,)
            # inside a document the next id; a document ends in eod; after eod the next document starts at 1 (or is
            # a one-token document, its eod alone)
            follows = (tokens[1:] == (tokens[:-1] + 1) % vocab) | (tokens[1:] == eod) | \
                (tokens[:-1] == eod) & (tokens[1:] == 1)
            assert follows.all()
    # a sample is the documents the dataset's indices name, end to end
    j = int(train.shuffle_index[0])
    position, offset = (int(v) for v in train.sample_index[j])
    start = _megatron_document(int(train.document_index[position]), vocab, eod)[offset:]
    assert np.array_equal(train[0]["tokens"].numpy()[:min(len(start), seq + 1)], start[:seq + 1])


def test_mock_data_replaces_data_path_and_refuses_both():
    assert parse_config(["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512"]).data.mock_data
    # Megatron-LM's validate_args: `args.mock_data + bool(args.data_path) + any([...per-split paths]) <= 1`
    with pytest.raises(ConfigError, match="--mock-data and --data-path: a single data source must be provided"):
        parse_config(["--mock-data", "--data-path", "x", "--tokenizer-type", "NullTokenizer", "--vocab-size", "9"])


@pytest.mark.slow
def test_a_mock_data_run_trains_without_data_path(tmp_path):
    """Megatron's usual mock launch (--mock-data --tokenizer-type NullTokenizer --vocab-size N): the ids count up
    inside each document, so the loss falls quickly (measured 5.56 -> 3.57 in 30 iterations)."""
    import pretrain_gpt

    metrics = tmp_path / "metrics.jsonl"
    assert pretrain_gpt.main([
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "255", "--num-layers", "2",
        "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64", "--max-position-embeddings", "64",
        "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", "30", "--lr", "3e-3",
        "--log-interval", "1", "--eval-iters", "1", "--eval-interval", "30", "--device", "cpu",
        "--data-cache-dir", str(tmp_path / "cache"), "--metrics-file", str(metrics)]) == 0
    losses = [record["loss"] for record in map(json.loads, open(metrics)) if "loss" in record
              and record.get("split") is None]
    assert len(losses) == 30 and losses[-1] < 0.75 * losses[0]


@pytest.mark.slow
def test_mock_data_without_a_named_tokenizer_uses_the_embedded_corpus_tokenizers_ids(corpus_cache):
    """No tokenizer named: the mock documents take the vocabulary and end-of-document id of the tokenizer trained
    on the embedded corpus (512 ids here), and the corpus itself is not read."""
    from arguments.parser import parse_config
    from data.per_split import DataSources
    from parallel.state import virtual_state
    from training.data_splits import build_data, load_tokenizer_and_data_sources
    from training.run_settings import resolve_run_settings

    config = parse_config(["--mock-data", "--tokenizer-vocab-size", "512", "--data-cache-dir", corpus_cache,
                           "--seq-length", "32", "--max-position-embeddings", "32", "--micro-batch-size", "2",
                           "--global-batch-size", "2", "--train-iters", "2", "--eval-iters", "0"])
    tokenizer, sources = load_tokenizer_and_data_sources(config.data, config.model)
    assert sources == DataSources() and tokenizer.vocab_size == 512  # nothing read: neither the corpus nor a blend
    state = virtual_state(1)
    settings = resolve_run_settings(config, tokenizer.vocab_size, 1, 1, "cpu")
    batch = next(iter(build_data(settings, state, sources, tokenizer).make_train_loader(0)))
    assert batch["tokens"].shape == (2, 33)
    tokens, eod = batch["tokens"], tokenizer.eod_id
    # Megatron's documents in this vocabulary: the next id, a document's eod, or a new document's 1 after an eod
    follows = (tokens[:, 1:] == (tokens[:, :-1] + 1) % 512) | (tokens[:, 1:] == eod) | \
        (tokens[:, :-1] == eod) & (tokens[:, 1:] == 1)
    assert bool(follows.all())
