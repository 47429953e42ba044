"""Hugging Face `tokenizers` tokenizers: GPT-2's byte-level BPE (trained here or read from vocab.json and merges.txt,
giving transformers' ids exactly) and any other tokenizer.json. Each ends documents with its own eos token, else GPT-2's
`<|endoftext|>`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Iterable, Iterator, Optional, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from base.input_files import check_input_file
from base.progress import ProgressLines
from data import DataError
from data.hf_model_ids import declared_token_ids, folder_token_ids
from data.hf_special_tokens import (
    GPT2_END_OF_DOCUMENT,
    TOKENIZER_CONFIG_FILE,
    end_of_document_token,
    read_json_object,
    read_side_files,
)
from data.sentencepiece_tokenizer import (
    SENTENCEPIECE_MODEL_FILE,
    SENTENCEPIECE_TYPES,
    SentencePieceTokenizer,
    load_sentencepiece_tokenizer,
)

EOD_TOKEN = GPT2_END_OF_DOCUMENT  # what we train and GPT-2's files end documents with

# 256 byte tokens plus the end-of-document token: the smallest byte-level vocabulary there is.
MIN_VOCAB_SIZE = 256 + 1

TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
# tokenizer_config.json lets AutoTokenizer pick the class without a model config; written where none came.
_GPT2_CONFIG = {"tokenizer_class": "GPT2Tokenizer", "add_prefix_space": False, "bos_token": EOD_TOKEN,
                "eos_token": EOD_TOKEN, "unk_token": EOD_TOKEN}


def _byte_level_pipeline(model: models.BPE) -> Tokenizer:
    """A tokenizer around `model` with GPT-2's pre-tokenizer, decoder and post-processor."""
    tokenizer = Tokenizer(model)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


class GPTTokenizer:
    """A `tokenizers.Tokenizer` with the token that ends its documents; thin layer over the library.
    `side_files` are the tokenizer_config.json and special_tokens_map.json it came with, saved beside it."""

    def __init__(self, tokenizer: Tokenizer, eod_token: str = EOD_TOKEN, side_files: Optional[dict] = None,
                 folder_ids: Optional[dict] = None):
        eod_id = tokenizer.token_to_id(eod_token)
        if eod_id is None:
            raise DataError(f"tokenizer has no {eod_token!r} token; it is needed to separate documents")
        self._tokenizer = tokenizer
        self._eod_id = eod_id
        self._side_files = side_files or {}
        self._vocab_size: int | None = None
        self.folder_ids = folder_ids

    @property
    def vocab_size(self) -> int:
        """Rows the embedding needs: the largest token id + 1 (more than the token count where ids have gaps)."""
        if self._vocab_size is None:
            ids = self._tokenizer.get_vocab(with_added_tokens=True).values()
            counted = self._tokenizer.get_vocab_size(with_added_tokens=True)
            self._vocab_size = max(max(ids, default=-1) + 1, counted)
        return self._vocab_size

    @property
    def eod_id(self) -> int:
        return self._eod_id

    def declared_ids(self) -> dict:
        """The bos, eos and pad ids its own files declare (data/hf_model_ids.py declared_token_ids)."""
        return declared_token_ids(self._side_files or {TOKENIZER_CONFIG_FILE: _GPT2_CONFIG},
                                  self._tokenizer.get_vocab(with_added_tokens=True), self._eod_id)

    @property
    def backend(self) -> Tokenizer:
        """The wrapped `tokenizers.Tokenizer`."""
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        # No special tokens around the text: EOD placement is the caller's.
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Same ids as `encode` on each text; the library spreads the batch over its thread pool."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [encoding.ids for encoding in encodings]

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Megatron's HuggingFaceTokenizer.tokenize on each text: with the special tokens the post-processor adds
        (Llama's bos)."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Iterable[int]) -> str:
        # Special tokens kept so decode(encode(text)) == text even with EOD inside.
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def to_json(self) -> str:
        """The whole tokenizer as a `tokenizer.json` string."""
        return self._tokenizer.to_str()

    def save(self, directory: str) -> None:
        """Write `tokenizer.json`, its side files and, for BPE, GPT-2's `vocab.json` + `merges.txt` (what Megatron-LM's
        --vocab-file/--merge-file read)."""
        os.makedirs(directory, exist_ok=True)
        self._tokenizer.save(os.path.join(directory, TOKENIZER_FILE))
        if isinstance(self._tokenizer.model, models.BPE):  # a WordPiece or Unigram model has no merges
            self._tokenizer.model.save(directory)
        for name, content in (self._side_files or {TOKENIZER_CONFIG_FILE: _GPT2_CONFIG}).items():
            with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
                json.dump(content, f, indent=2)
                f.write("\n")


def _require_file(path: str, flag: str) -> None:
    # Regular files only: the library would wait on a FIFO forever. Any size.
    check_input_file(path, flag, max_bytes=None, error=DataError, fix="give the tokenizer's file")


def _load_tokenizer_json(tokenizer_file: str) -> GPTTokenizer:
    if os.path.isdir(tokenizer_file):  # a Hugging Face folder (Megatron's --tokenizer-model names one)
        folder, tokenizer_file = tokenizer_file, os.path.join(tokenizer_file, TOKENIZER_FILE)
        model = os.path.join(folder, SENTENCEPIECE_MODEL_FILE)
        if not os.path.exists(tokenizer_file) and os.path.isfile(model):
            raise DataError(f"--tokenizer-file {folder}: holds no {TOKENIZER_FILE}, only {SENTENCEPIECE_MODEL_FILE}; "
                            f"give --tokenizer-type Llama2Tokenizer (or GPTSentencePieceTokenizer) --tokenizer-model "
                            f"{model}, or save the folder with transformers' save_pretrained to write a {TOKENIZER_FILE}")
    _require_file(tokenizer_file, "--tokenizer-file")
    try:
        tokenizer = Tokenizer.from_file(tokenizer_file)
    except Exception as error:  # the library raises a bare Exception for malformed files
        # Megatron reads a .model only under a SentencePiece --tokenizer-type: say which.
        hint = (f"; a SentencePiece model needs --tokenizer-type {' or '.join(SENTENCEPIECE_TYPES)}"
                if tokenizer_file.endswith(".model") else f" ({error})")
        raise DataError(f"--tokenizer-file {tokenizer_file}: not a valid tokenizer.json{hint}") from error
    side_files = read_side_files(os.path.dirname(tokenizer_file))
    eod_token = end_of_document_token(side_files, tokenizer.get_vocab(with_added_tokens=True),
                                      f"--tokenizer-file {tokenizer_file}")
    return GPTTokenizer(tokenizer, eod_token, side_files, folder_token_ids(os.path.dirname(tokenizer_file)))


def _load_gpt2_files(vocab_file: str, merges_file: str) -> GPTTokenizer:
    _require_file(vocab_file, "--vocab-file")
    _require_file(merges_file, "--merge-file")
    vocab = read_json_object(vocab_file, f"--vocab-file {vocab_file}", "token -> id")
    if EOD_TOKEN not in vocab:
        raise DataError(f"--vocab-file {vocab_file}: vocabulary has no {EOD_TOKEN!r} token")
    try:
        model = models.BPE.from_file(vocab_file, merges_file)
    except Exception as error:
        raise DataError(
            f"--merge-file {merges_file}: cannot build BPE from it and {vocab_file} ({error})"
        ) from error
    tokenizer = _byte_level_pipeline(model)
    # Marks the existing entry special, so text containing it maps to the one id.
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
    """Megatron's NullTokenizer, for data tokenized elsewhere: ids 0..N-1 as they are, end-of-document id N
    (Megatron-LM up to core_v0.17); `ids`, `eod_id` and `reading` give a later release's reading (a checkpoint's,
    or its flags')."""

    def __init__(self, vocab_size: int, *, ids: Optional[int] = None, eod_id: Optional[int] = None,
                 reading: Optional[str] = None):
        if vocab_size < 1:
            raise DataError(f"--vocab-size must be at least 1 for NullTokenizer, got {vocab_size}")
        self._vocab_size_without_eod = int(vocab_size)
        self.reading = reading
        self._ids = int(ids) if ids is not None else self._vocab_size_without_eod + 1
        self._eod_id = int(eod_id) if eod_id is not None else self._vocab_size_without_eod

    @property
    def flag_vocab_size(self) -> int:
        """--vocab-size as given."""
        return self._vocab_size_without_eod

    @property
    def vocab_size(self) -> int:
        return self._ids

    @property
    def eod_id(self) -> int:
        return self._eod_id

    def tokenize_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Megatron's NullTokenizer.tokenize: decimal ids one space apart; an id outside the vocabulary or a non-number
        is refused in one line."""
        return [self._ids_of(text) for text in texts]

    def _ids_of(self, text: str) -> list[int]:
        try:
            ids = [int(word) for word in text.split(" ")]
        except ValueError:
            raise DataError(f"NullTokenizer reads token ids one space apart; a document reads {text[:60]!r}") from None
        wrong = next((i for i in ids if not 0 <= i < self._vocab_size_without_eod), None)
        if wrong is not None:
            raise DataError(f"NullTokenizer: token id {wrong} is outside 0..{self._vocab_size_without_eod - 1} "
                            f"(--vocab-size {self._vocab_size_without_eod}); give the vocabulary the ids were made with")
        return ids


RunTokenizer = GPTTokenizer | SentencePieceTokenizer | NullTokenizer


def megatron_pad(tokenizer: RunTokenizer, null_tokenizer_pad_id: int) -> tuple[Optional[int], str]:
    """The pad id Megatron-Core's tokenizer of this kind reports to its datasets (None: none), and its name in a
    start-up line: NullTokenizer's --null-tokenizer-pad-id, a Hugging Face tokenizer's declared pad token (its
    HuggingFaceTokenizer.pad_id), a SentencePiece model's pad piece."""
    if isinstance(tokenizer, NullTokenizer):
        return (None if null_tokenizer_pad_id == -1 else null_tokenizer_pad_id,
                f"--null-tokenizer-pad-id {null_tokenizer_pad_id}")
    pad = tokenizer.pad_id if isinstance(tokenizer, SentencePieceTokenizer) else \
        tokenizer.declared_ids()["pad_token_id"]
    return pad, f"the tokenizer's pad token (id {pad})"

# The name of core_v0.18.0's reading of NullTokenizer's --vocab-size N (N ids), in start-up lines and saves
NEWER_NULL_READING = "Megatron-LM core_v0.18 on reads it"


def tokenizer_digest(tokenizer: RunTokenizer) -> str:
    """'sha256:<hex>' of what defines a tokenizer's ids (tokenizer.json and EOD, a SentencePiece model's bytes and type,
    or a NullTokenizer's size); a checkpoint records it."""
    if isinstance(tokenizer, NullTokenizer):  # the end-of-document id where it is not the last id
        last = tokenizer.eod_id == tokenizer.vocab_size - 1
        defining = f"NullTokenizer {tokenizer.vocab_size}" + ("" if last else f" eod {tokenizer.eod_id}")
    else:
        defining = f"{tokenizer.to_json()}\n{tokenizer.eod_id}"
    return "sha256:" + hashlib.sha256(defining.encode("utf-8")).hexdigest()


def load_named_tokenizer(tokenizer_type: str | None, tokenizer_file: str | None, vocab_file: str | None,
                         merges_file: str | None, vocab_size: int = 0, newer_null: bool = False,
                         null_eod_id: Optional[int] = None) -> RunTokenizer | None:
    """The tokenizer the flags name, or None (the embedded corpus brings its own). `newer_null`: a launch with
    --null-tokenizer-eod-id or --null-tokenizer-pad-id, flags only core_v0.18.0 on has, so its reading of N ids."""
    if tokenizer_type == "NullTokenizer":
        if not newer_null:
            return NullTokenizer(vocab_size)
        eod = vocab_size - 1 if null_eod_id is None else null_eod_id
        return NullTokenizer(vocab_size, ids=vocab_size, eod_id=eod, reading=NEWER_NULL_READING)
    if tokenizer_type in SENTENCEPIECE_TYPES:
        return load_sentencepiece_tokenizer(tokenizer_type, tokenizer_file)
    if tokenizer_file or vocab_file or merges_file:
        return load_tokenizer(tokenizer_file=tokenizer_file, vocab_file=vocab_file, merges_file=merges_file)
    return None


def train_tokenizer(texts: Iterable[str], vocab_size: int, min_frequency: int = 2,
                    progress: Optional[ProgressLines] = None) -> GPTTokenizer:
    """Train a byte-level BPE on `texts` with all 256 bytes and EOD as id 0; deterministic. A small corpus may stop
    short of `vocab_size`: use the result's. With `progress`, say what it is doing every few seconds."""
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
        # The library's bars only on a terminal.
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
    """The texts, counted as they pass for the progress lines."""

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
