"""Megatron-Core's sample order: the document, sample and shuffle indices its GPTDataset builds, value for value (one
RandomState over all epochs, a short last epoch shuffled apart). A run that writes or reads Megatron-LM checkpoints
reads this order, in which their consumed-samples count is a position.
"""

from __future__ import annotations

import numpy as np

from data.gpt_dataset import GPTDataset, build_sample_index

MEGATRON_ORDER = "megatron"
# Below this share of an epoch the last epoch is shuffled apart.
SEPARATE_FINAL_EPOCH_BELOW = 0.80
EXTRA_TOKEN = 1  # GPTDatasetConfig.add_extra_token_to_sequence: the labels' shifted token


def megatron_epochs(tokens_per_epoch: int, seq_length: int, num_samples: int) -> int:
    """GPTDataset._get_num_epochs."""
    requested = num_samples * seq_length + EXTRA_TOKEN
    return max(1, -(-requested // tokens_per_epoch))


def _document_index(document_ids: np.ndarray, num_epochs: int, rng: np.random.RandomState,
                    separate_final_epoch: bool) -> np.ndarray:
    """_build_document_index."""
    if separate_final_epoch and num_epochs > 1:
        return np.concatenate((_document_index(document_ids, num_epochs - 1, rng, False),
                               _document_index(document_ids, 1, rng, False)))
    document_index = np.tile(document_ids, num_epochs).astype(np.int32)
    rng.shuffle(document_index)
    return document_index


def _shuffle_index(first: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    """_build_shuffle_index: [0, first) permuted, then [first, total) permuted."""
    dtype = np.uint32 if total < np.iinfo(np.uint32).max - 1 else np.int64
    head = np.arange(first, dtype=dtype)
    rng.shuffle(head)
    if first == total:
        return head
    tail = np.arange(first, total, dtype=dtype)
    rng.shuffle(tail)
    return np.concatenate((head, tail))


def build_megatron_indices(document_ids: np.ndarray, document_lengths: np.ndarray, num_samples: int,
                           seq_length: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document index, sample index, shuffle index) as Megatron-Core builds them for a training split."""
    tokens_per_epoch = int(np.asarray(document_lengths)[document_ids].sum())
    epochs = megatron_epochs(tokens_per_epoch, seq_length, num_samples)
    before_final = ((epochs - 1) * tokens_per_epoch - EXTRA_TOKEN) // seq_length
    per_epoch = (tokens_per_epoch - EXTRA_TOKEN) // seq_length
    separate_final_epoch = epochs > 1 and num_samples - before_final < int(SEPARATE_FINAL_EPOCH_BELOW * per_epoch)
    rng = np.random.RandomState(seed)
    document_index = _document_index(np.asarray(document_ids), epochs, rng, separate_final_epoch)
    samples = (epochs * tokens_per_epoch - EXTRA_TOKEN) // seq_length
    sample_index = build_sample_index(document_lengths, document_index, seq_length, samples)
    shuffle_index = _shuffle_index(before_final if separate_final_epoch else samples, samples, rng)
    return document_index, sample_index, shuffle_index


class MegatronOrderGPTDataset(GPTDataset):
    """GPTDataset reading its samples in Megatron-Core's order."""

    order = MEGATRON_ORDER

    def _epochs_needed(self) -> int:
        return megatron_epochs(self.tokens_per_epoch, self.seq_length, self.num_samples)

    def _build_indices(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        document_index, sample_index, shuffle_index = build_megatron_indices(
            self.document_ids, self.document_lengths, self.num_samples, self.seq_length, self.seed)
        return document_index, sample_index, shuffle_index[: self.num_samples].astype(np.int64)
