"""Megatron-LM's fill-in-the-middle samples (--fim-data), as its GPTFIMDataset makes them, draw for draw. Megatron draws
from one RandomState in fetch order; here each sample's RandomState is seeded with (--seed, index), so a sample is the
same in any order, worker or resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from data import DataError

FIM_TOKEN_NAMES = ("prefix", "middle", "suffix", "pad", "eod")


@dataclass(frozen=True)
class FIMConfig:
    rate: float = 0.5
    spm_rate: float = 0.5
    split_sample: Optional[str] = None
    fragment_rate: Optional[float] = None
    no_prefix: Optional[str] = None
    prefix_token: str = "<fim_prefix>"
    middle_token: str = "<fim_middle>"
    suffix_token: str = "<fim_suffix>"
    pad_token: str = "<fim_pad>"
    eod_token: str = "<|endoftext|>"


class FIMTokenizer:
    """What the FIM transform needs of a byte-level BPE tokenizer, as Megatron's HuggingFace wrapper gives it."""

    def __init__(self, tokenizer):
        backend = getattr(tokenizer, "backend", None)
        if backend is None:
            raise DataError(f"--fim-data needs a byte-level BPE tokenizer (--vocab-file/--merge-file or "
                            f"--tokenizer-model tokenizer.json) to detokenize samples; "
                            f"{type(tokenizer).__name__} is not one")
        self._backend = backend

    def token_to_id(self, token: str) -> int:
        """The token's id, else the unknown token's, as transformers does (GPT-2's is <|endoftext|>)."""
        found = self._backend.token_to_id(token)
        if found is not None:
            return int(found)
        unk = getattr(self._backend.model, "unk_token", None)
        for name in (unk, "<|endoftext|>"):
            if name is not None and self._backend.token_to_id(name) is not None:
                return int(self._backend.token_to_id(name))
        raise DataError(f"--fim-data: the tokenizer has no {token!r} token and no unknown token to stand for it")

    def text_to_ids(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def ids_to_text(self, ids) -> str:
        return self._backend.decode([int(i) for i in ids], skip_special_tokens=True)


class FIMTransform:
    """Megatron's GPTFIMDataset permutation of one sample's token ids, with a given RandomState."""

    def __init__(self, config: FIMConfig, tokenizer: FIMTokenizer):
        self.config = config
        self.tokenizer = tokenizer
        ids = [tokenizer.token_to_id(getattr(config, f"{name}_token")) for name in FIM_TOKEN_NAMES]
        self.prefix_id, self.middle_id, self.suffix_id, self.pad_id, self.eod_id = ids
        self.split_id = tokenizer.token_to_id(config.split_sample) if config.split_sample else None

    def __call__(self, sample: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        """Permute each piece between end-of-document tokens, then cut or pad to the original length."""
        sample_len = sample.shape[0]
        breaks = np.flatnonzero(sample == self.eod_id)
        if breaks.size:
            start, pieces = 0, []
            for loc in breaks:
                if loc - start > 0:
                    pieces += [self._split_and_permute(sample[start:loc], rng), [self.eod_id]]
                start = loc + 1
            pieces.append(self._split_and_permute(sample[start:], rng))
            sample = np.concatenate(pieces)
        else:
            sample = self._split_and_permute(sample, rng)
        if sample.shape[0] > sample_len:
            sample = sample[:sample_len]
        elif sample.shape[0] < sample_len:
            sample = np.concatenate([sample, np.full(sample_len - sample.shape[0], self.pad_id)])
        return np.asarray(sample, dtype=np.int64)

    def _split_and_permute(self, sequence: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        """GPTFIMDataset._fim_split_and_permute_sequence."""
        rate = self.config.rate
        if self.split_id is None:
            return self._permute(sequence, rate, rng)
        breaks = np.flatnonzero(sequence == self.split_id)
        if not breaks.size:
            return self._permute(sequence, rate, rng)
        if not rng.binomial(1, rate):
            return sequence
        start, pieces = 0, []
        for loc in breaks:
            if loc - start > 0:
                pieces += [self._permute(sequence[start:loc], self.config.fragment_rate, rng), [self.split_id]]
            start = loc + 1
        pieces.append(self._permute(sequence[start:], self.config.fragment_rate, rng))
        return np.concatenate(pieces)

    def _permute(self, sequence: np.ndarray, rate, rng: np.random.RandomState) -> np.ndarray:
        """GPTFIMDataset._permute with truncate_or_pad=False (how GPTFIMDataset calls it)."""
        if not rng.binomial(1, rate):
            return sequence
        text = self.tokenizer.ids_to_text(sequence)
        if self.config.no_prefix is not None and text.startswith(self.config.no_prefix):
            return sequence
        boundaries = sorted(rng.randint(low=0, high=len(text) + 1, size=2))
        encode = self.tokenizer.text_to_ids
        prefix = np.array(encode(text[: boundaries[0]]), dtype=np.int64)
        middle = np.array(encode(text[boundaries[0]: boundaries[1]]), dtype=np.int64)
        suffix = np.array(encode(text[boundaries[1]:]), dtype=np.int64)
        if rng.binomial(1, self.config.spm_rate):
            return np.concatenate([[self.prefix_id, self.suffix_id], suffix, [self.middle_id], prefix, middle])
        return np.concatenate([[self.prefix_id], prefix, [self.suffix_id], suffix, [self.middle_id], middle])


def sample_rng(seed: int, index: int) -> np.random.RandomState:
    """The RandomState for sample `index`: a function of the seed and the index only."""
    return np.random.RandomState([seed, index])


class FIMDataset(torch.utils.data.Dataset):
    """`dataset`'s samples (dicts with "tokens"), each through the FIM transform with its own RandomState."""

    def __init__(self, dataset, transform: FIMTransform, seed: int):
        self.dataset = dataset
        self.transform = transform
        self.seed = seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = dict(self.dataset[i])
        tokens = item["tokens"].numpy()
        item["tokens"] = torch.from_numpy(self.transform(tokens, sample_rng(self.seed, i)))
        return item
