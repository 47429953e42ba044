"""--mock-data: Megatron-Core's MockGPTDataset documents (fixed lengths from seed 0, tokens (arange + 1) % vocab, EOD
last) split evenly as its config does, fed to the ordinary GPTDataset, so a mock run takes the real data path.
"""

from __future__ import annotations

import numpy as np
import torch

from data.gpt_dataset import SPLIT_NAMES, GPTDataset, parse_split, split_document_ranges, split_epoch_samples

# MockGPTLowLevelDataset's class attributes
MOCK_SEED, MOCK_DOCUMENTS, MOCK_MAX_SEQUENCE_LENGTH = 0, 100000, 4096
MOCK_SPLIT = "1,1,1"  # BlendedMegatronDatasetConfig's split for mock data (module docstring)


class MockDocuments:
    """What GPTDataset reads of an IndexedDataset, for Megatron's mock documents."""

    def __init__(self, vocab_size: int, eod_id: int) -> None:
        self.vocab_size, self.eod_id = int(vocab_size), int(eod_id)
        self.prefix = f"mock-data-vocab{self.vocab_size}-eod{self.eod_id}"  # messages and cache file names
        rng = np.random.default_rng(seed=MOCK_SEED)
        self.document_lengths = rng.integers(low=1, high=MOCK_MAX_SEQUENCE_LENGTH, size=MOCK_DOCUMENTS,
                                             dtype=np.int32).astype(np.int64)
        self.num_documents = MOCK_DOCUMENTS
        self.cache_identity = {"mock": [MOCK_SEED, MOCK_DOCUMENTS, MOCK_MAX_SEQUENCE_LENGTH, self.vocab_size,
                                        self.eod_id]}

    def document(self, d: int) -> np.ndarray:
        length = int(self.document_lengths[d])
        return np.concatenate([(np.arange(length - 1, dtype=np.int64) + 1) % self.vocab_size,
                               np.array([self.eod_id], dtype=np.int64)])

    def get_document(self, d: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        tokens = self.document(d)
        return tokens[offset:] if length is None else tokens[offset:offset + length]


def build_mock_datasets(seq_length: int, seed: int, num_samples: tuple[int | None, int | None, int | None],
                        vocab_size: int, eod_id: int, cache_dir: str) -> tuple[torch.utils.data.Dataset | None, ...]:
    """Train, valid and test GPTDatasets over the mock documents split evenly; a count of None asks for one epoch."""
    documents = MockDocuments(vocab_size, eod_id)
    ranges = split_document_ranges(documents.num_documents, parse_split(MOCK_SPLIT))
    return tuple(
        GPTDataset(documents, np.arange(*document_range, dtype=np.int64),
                   split_epoch_samples([(documents, document_range)], seq_length) if count is None else count,
                   seq_length, seed, name, cache_dir)
        if count != 0 and document_range[1] > document_range[0] else None
        for name, document_range, count in zip(SPLIT_NAMES, ranges, num_samples))
