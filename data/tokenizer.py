"""Byte-level BPE tokenizer (GPT-2 style) through the Hugging Face `tokenizers` library.

Byte-level means every string maps to tokens and back without loss: text is first turned into bytes,
each byte has a token, and merges only ever combine tokens. The pipeline matches GPT-2's exactly (no
prefix space, GPT-2's pre-tokenization regex, byte-level decoder), so GPT-2's own `vocab.json` and
`merges.txt` load here with the same token ids transformers gives, and a tokenizer we train or save
loads in transformers' `GPT2TokenizerFast` with no code of ours.

The end-of-document token `<|endoftext|>` separates documents in the training stream; it must exist in
every vocabulary we use.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Iterable, Iterator, Optional, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from base.input_files import check_input_file
from base.progress import ProgressLines
from data import DataError
from data.sentencepiece_tokenizer import SENTENCEPIECE_TYPES, SentencePieceTokenizer, load_sentencepiece_tokenizer

EOD_TOKEN = "<|endoftext|>"

# 256 byte tokens plus the end-of-document token: the smallest byte-level vocabulary there is.
MIN_VOCAB_SIZE = 256 + 1

TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
# Lets transformers' AutoTokenizer pick the right class even in a folder without a model config.
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def _byte_level_pipeline(model: models.BPE) -> Tokenizer:
    """A tokenizer around `model` with GPT-2's pre-tokenizer, decoder and post-processor."""
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    # trim_offsets=False keeps character offsets covering the leading space, as GPT-2's file does.
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


class GPTTokenizer:
    """A byte-level BPE tokenizer with an end-of-document token; thin layer over `tokenizers.Tokenizer`."""

    def __init__(self, tokenizer: Tokenizer):
        eod_id = tokenizer.token_to_id(EOD_TOKEN)
        if eod_id is None:
            raise DataError(f"tokenizer has no {EOD_TOKEN!r} token; it is needed to separate documents")
        self._tokenizer = tokenizer
        self._eod_id = eod_id
        self._vocab_size: int | None = None

    @property
    def vocab_size(self) -> int:
        """Rows the model's embedding needs: the largest token id + 1, special tokens included. For a
        vocabulary whose ids have gaps this is more than the number of tokens, which would leave the
        largest ids outside the embedding."""
        if self._vocab_size is None:
            ids = self._tokenizer.get_vocab(with_added_tokens=True).values()
            counted = self._tokenizer.get_vocab_size(with_added_tokens=True)
            self._vocab_size = max(max(ids, default=-1) + 1, counted)
        return self._vocab_size

    @property
    def eod_id(self) -> int:
        return self._eod_id

    @property
    def backend(self) -> Tokenizer:
        """The wrapped `tokenizers.Tokenizer`, for callers that need its full API."""
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        # No special tokens are added around the text: EOD placement is the caller's decision.
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Same ids as `encode` on each text; the library spreads the batch over its thread pool."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        # Special tokens are kept so decode(encode(text)) == text even when text contains EOD.
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def to_json(self) -> str:
        """The whole tokenizer as a `tokenizer.json` string (how worker processes receive it)."""
        return self._tokenizer.to_str()

    @classmethod
    def from_json(cls, text: str) -> "GPTTokenizer":
        return cls(Tokenizer.from_str(text))

    def save(self, directory: str) -> None:
        """Write `tokenizer.json`, GPT-2 style `vocab.json` + `merges.txt`, and `tokenizer_config.json`.

        The GPT-2 pair is what Megatron-LM's `--vocab-file/--merge-file` and older tools read; the
        `tokenizer.json` is the complete, self-describing form that `load_tokenizer` prefers.
        """
        if not isinstance(self._tokenizer.model, models.BPE):
            raise DataError(f"cannot save {directory}: only BPE tokenizers have vocab.json + merges.txt")
        os.makedirs(directory, exist_ok=True)
        self._tokenizer.save(os.path.join(directory, TOKENIZER_FILE))
        self._tokenizer.model.save(directory)
        config = {
            "tokenizer_class": "GPT2Tokenizer",
            "add_prefix_space": False,
            "bos_token": EOD_TOKEN,
            "eos_token": EOD_TOKEN,
            "unk_token": EOD_TOKEN,
        }
        with open(os.path.join(directory, TOKENIZER_CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
            f.write("\n")


def _require_file(path: str, flag: str) -> None:
    # Regular files only: the tokenizers library would wait on a FIFO or read /dev/zero forever.
    # Any size: the library reads them, and large vocabularies make large files.
    check_input_file(path, flag, max_bytes=None, error=DataError, fix="give the tokenizer's file")


def _load_tokenizer_json(tokenizer_file: str) -> GPTTokenizer:
    if os.path.isdir(tokenizer_file):  # a Hugging Face folder (Megatron's --tokenizer-model names one)
        tokenizer_file = os.path.join(tokenizer_file, TOKENIZER_FILE)
    _require_file(tokenizer_file, "--tokenizer-file")
    try:
        tokenizer = Tokenizer.from_file(tokenizer_file)
    except Exception as error:  # the library raises a bare Exception for malformed files
        # Megatron reads a .model only under a SentencePiece --tokenizer-type; without one, say which to give.
        hint = (f"; a SentencePiece model needs --tokenizer-type {' or '.join(SENTENCEPIECE_TYPES)}"
                if tokenizer_file.endswith(".model") else f" ({error})")
        raise DataError(f"--tokenizer-file {tokenizer_file}: not a valid tokenizer.json{hint}") from error
    if tokenizer.token_to_id(EOD_TOKEN) is None:
        raise DataError(f"--tokenizer-file {tokenizer_file}: vocabulary has no {EOD_TOKEN!r} token")
    return GPTTokenizer(tokenizer)


def _load_gpt2_files(vocab_file: str, merges_file: str) -> GPTTokenizer:
    _require_file(vocab_file, "--vocab-file")
    _require_file(merges_file, "--merge-file")
    try:
        with open(vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise DataError(f"--vocab-file {vocab_file}: not a JSON vocabulary ({type(error).__name__}: {error})") from None
    if not isinstance(vocab, dict):
        raise DataError(f"--vocab-file {vocab_file}: expected a JSON object of token -> id")
    if EOD_TOKEN not in vocab:
        raise DataError(f"--vocab-file {vocab_file}: vocabulary has no {EOD_TOKEN!r} token")
    try:
        model = models.BPE.from_file(vocab_file, merges_file)
    except Exception as error:
        raise DataError(
            f"--merge-file {merges_file}: cannot build BPE from it and {vocab_file} ({error})"
        ) from error
    tokenizer = _byte_level_pipeline(model)
    # Marks the existing vocabulary entry as special, so text containing it maps to the one id.
    tokenizer.add_special_tokens([EOD_TOKEN])
    return GPTTokenizer(tokenizer)


def load_tokenizer(
    tokenizer_file: str | None = None,
    vocab_file: str | None = None,
    merges_file: str | None = None,
) -> GPTTokenizer:
    """Load from a `tokenizer.json`, or from GPT-2's `vocab.json` + `merges.txt` (exactly one of the two)."""
    if tokenizer_file and (vocab_file or merges_file):
        raise DataError(
            "--tokenizer-file cannot be combined with --vocab-file/--merge-file; give one or the other"
        )
    if tokenizer_file:
        return _load_tokenizer_json(tokenizer_file)
    if vocab_file and merges_file:
        return _load_gpt2_files(vocab_file, merges_file)
    if vocab_file:
        raise DataError(f"--vocab-file {vocab_file} needs --merge-file as well (GPT-2 BPE uses both)")
    if merges_file:
        raise DataError(f"--merge-file {merges_file} needs --vocab-file as well (GPT-2 BPE uses both)")
    raise DataError("no tokenizer given: pass --tokenizer-file, or --vocab-file and --merge-file")


class NullTokenizer:
    """Megatron's NullTokenizer: for data tokenized elsewhere. Token ids 0..N-1 are taken as they are,
    and the end-of-document id is N, so the model's vocabulary is N + 1. There is nothing to encode,
    decode or save."""

    def __init__(self, vocab_size: int):
        if vocab_size < 1:
            raise DataError(f"--vocab-size must be at least 1 for NullTokenizer, got {vocab_size}")
        self._vocab_size_without_eod = int(vocab_size)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size_without_eod + 1

    @property
    def eod_id(self) -> int:
        return self._vocab_size_without_eod


# What a run tokenizes with: the vocabulary size and end-of-document id every kind has.
RunTokenizer = GPTTokenizer | SentencePieceTokenizer | NullTokenizer


def load_named_tokenizer(tokenizer_type: str | None, tokenizer_file: str | None, vocab_file: str | None,
                         merges_file: str | None, vocab_size: int = 0) -> RunTokenizer | None:
    """The tokenizer the flags name (Megatron's --tokenizer-type, or the files given), or None when
    they name none (the embedded corpus then brings its own). A SentencePiece type's --tokenizer-model
    (held as tokenizer_file) is its .model file."""
    if tokenizer_type == "NullTokenizer":
        return NullTokenizer(vocab_size)
    if tokenizer_type in SENTENCEPIECE_TYPES:
        return load_sentencepiece_tokenizer(tokenizer_type, tokenizer_file)
    if tokenizer_file or vocab_file or merges_file:
        return load_tokenizer(tokenizer_file=tokenizer_file, vocab_file=vocab_file, merges_file=merges_file)
    return None


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2,
                    progress: Optional[ProgressLines] = None) -> GPTTokenizer:
    """Train a byte-level BPE on `texts`, with all 256 bytes as the initial alphabet and EOD as id 0.

    The result is deterministic: the trainer breaks ties between equally frequent pairs by the pair
    itself, so the same texts give the same vocabulary in every run. On a small corpus the trainer
    stops early once no pair occurs `min_frequency` times, so `vocab_size` of the result may be
    smaller than asked; use the result's `vocab_size`, never the request.

    With `progress`, training a large corpus says what it is doing: a line when it starts, one every
    few seconds while the texts are read, one when reading ends (the merges are computed after that)
    and one at the end.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise DataError(
            f"vocab_size {vocab_size} is too small: byte-level BPE needs at least {MIN_VOCAB_SIZE} "
            f"(256 bytes + {EOD_TOKEN})"
        )
    tokenizer = _byte_level_pipeline(models.BPE())
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # The library's own bars, on a terminal only: in a batch log they are thousands of redraws.
        show_progress=progress is not None and sys.stderr.isatty(),
    )
    if progress is None:
        tokenizer.train_from_iterator(texts, trainer)
        return GPTTokenizer(tokenizer)
    progress.start(f"tokenizer: training a byte-level BPE of up to {vocab_size} tokens")
    counted = _CountedTexts(texts, progress)
    tokenizer.train_from_iterator(counted, trainer)
    result = GPTTokenizer(tokenizer)
    progress.done(f"tokenizer: trained {result.vocab_size} tokens on {counted.describe()}")
    return result


class _CountedTexts:
    """The texts, passed through while their number and size are counted for the progress lines."""

    def __init__(self, texts: Iterable[str], progress: ProgressLines):
        self.texts, self.progress = texts, progress
        self.documents = self.characters = 0

    def describe(self) -> str:
        return f"{self.documents:,} documents ({self.characters / 1e6:,.1f} M characters)"

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            self.documents += 1
            self.characters += len(text)
            self.progress.update(lambda: f"tokenizer: read {self.describe()}")
            yield text
        self.progress.update(lambda: f"tokenizer: read all {self.describe()}; computing the merges")
