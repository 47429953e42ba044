"""A run that writes or reads Megatron-LM's checkpoints reads its samples in Megatron-Core's order (issue 78 item 2).

tests/fixtures/megatron_data/megatron_index/ holds the document, sample and shuffle index files Megatron-Core's
GPTDataset (megatron/core/datasets/gpt_dataset.py, _build_document_sample_shuffle_indices, core_v0.16.1) wrote for
the training split of Megatron-LM's own run that made tests/fixtures/megatron_tp1 (scripts/
megatron_checkpoint_fixtures.py: --data-path tests/fixtures/megatron_data/varied_docs, --split 100,0,0, --seq-length
16, --seed 1234, 4 iterations of 4 samples). Its 200 documents have 8-60 tokens, so samples cross document
boundaries at varied places: this project's own order reads other tokens at the same positions, which is what made
a continued Megatron-LM run's iteration 3 differ (4.857099 here against Megatron-LM's 4.848403).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from arguments.checkpoint_config import sample_order
from data.gpt_dataset import APPENDABLE_ORDER, GPTDataset, build_train_valid_test_datasets
from data.indexed import IndexedDataset
from data.megatron_order import MEGATRON_ORDER, MegatronOrderGPTDataset, build_megatron_indices, megatron_epochs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "megatron_data"
PREFIX = str(FIXTURES / "varied_docs")
SEQ_LENGTH, SEED, SAMPLES = 16, 1234, 16


def megatrons(kind: str) -> np.ndarray:
    return np.load(FIXTURES / "megatron_index" / f"{kind}_index.npy")


def test_the_three_indices_are_megatron_cores_value_for_value():
    data = IndexedDataset(PREFIX)
    ours = build_megatron_indices(np.arange(data.num_documents), data.document_lengths, SAMPLES, SEQ_LENGTH, SEED)
    for kind, built in zip(("document", "sample", "shuffle"), ours):
        assert np.array_equal(built, megatrons(kind)), kind


def test_the_training_split_serves_megatrons_samples_in_megatrons_order(tmp_path):
    train, _, _ = build_train_valid_test_datasets([PREFIX], "100,0,0", SEQ_LENGTH, SEED, (SAMPLES, 0, 0),
                                                  cache_dir=str(tmp_path), dataset_class=MegatronOrderGPTDataset)
    documents, samples, shuffle = (megatrons(kind) for kind in ("document", "sample", "shuffle"))
    data = IndexedDataset(PREFIX)
    tokens = np.concatenate([data.get_document(int(d)) for d in documents])
    for i in range(SAMPLES):
        (first_doc, first_offset), (last_doc, last_offset) = samples[shuffle[i]], samples[shuffle[i] + 1]
        start = int(data.document_lengths[documents[:first_doc]].sum()) + first_offset
        end = int(data.document_lengths[documents[:last_doc]].sum()) + last_offset
        assert np.array_equal(train[i]["tokens"].numpy(), tokens[start:end + 1]), i
    own, _, _ = build_train_valid_test_datasets([PREFIX], "100,0,0", SEQ_LENGTH, SEED, (SAMPLES, 0, 0),
                                                cache_dir=str(tmp_path))
    assert not all(np.array_equal(own[i]["tokens"], train[i]["tokens"]) for i in range(SAMPLES))


@pytest.mark.parametrize("tokens,samples,epochs", [(100, 6, 1), (100, 7, 2), (100, 13, 3), (97, 6, 1)])
def test_the_epochs_are_the_fewest_that_hold_the_samples_and_their_extra_token(tokens, samples, epochs):
    """GPTDataset._get_num_epochs: E x tokens >= samples x seq_length + 1."""
    assert megatron_epochs(tokens, SEQ_LENGTH, samples) == epochs


def test_a_short_last_epoch_is_shuffled_apart():
    """With 2 epochs of 16 samples and 17 asked for, the second epoch gives 1 sample, under 80% of an epoch: its
    documents are shuffled on their own after the first epoch's, and so are its samples (separate_final_epoch)."""
    lengths = np.full(17, 16, dtype=np.int32)
    documents, _, shuffle = build_megatron_indices(np.arange(17), lengths, 17, SEQ_LENGTH, SEED)
    assert sorted(documents[:17]) == list(range(17)) and sorted(documents[17:]) == list(range(17))
    assert sorted(shuffle[:16]) == list(range(16)) and sorted(shuffle[16:]) == list(range(16, 33))


def test_the_order_follows_the_checkpoint_format():
    assert sample_order("torch_dist") == MEGATRON_ORDER == MegatronOrderGPTDataset.order
    assert sample_order(None) == sample_order("torch") == APPENDABLE_ORDER == GPTDataset.order
