"""Megatron's SentencePiece tokenizer types over a `.model` file (GPTSentencePieceTokenizer, Llama2Tokenizer,
SentencePieceTokenizer), each reproducing Megatron's ids exactly, special pieces included. `sentencepiece` is imported
only when one is asked for.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Iterable, Optional, Sequence

from base.input_files import check_input_file
from data import DataError

GPT_SENTENCEPIECE = "GPTSentencePieceTokenizer"
LLAMA2 = "Llama2Tokenizer"
SENTENCEPIECE = "SentencePieceTokenizer"
SENTENCEPIECE_TYPES = (GPT_SENTENCEPIECE, LLAMA2, SENTENCEPIECE)

SENTENCEPIECE_MODEL_FILE = "tokenizer.model"


def _piece_or(processor, piece_id: int, fallback: str) -> str:
    """The piece of `piece_id`, or `fallback` where the model has none (id -1)."""
    try:
        return processor.id_to_piece(piece_id)
    except IndexError:
        return fallback


class SentencePieceTokenizer:
    """One of Megatron's SentencePiece types, with data/tokenizer.py GPTTokenizer's interface."""

    def __init__(self, tokenizer_type: str, model_proto: bytes, source: str = "--tokenizer-model"):
        if tokenizer_type not in SENTENCEPIECE_TYPES:
            raise DataError(f"--tokenizer-type {tokenizer_type} is not a SentencePiece type "
                            f"({', '.join(SENTENCEPIECE_TYPES)})")
        # An empty proto would crash the library later: refused first.
        if not model_proto:
            raise DataError(f"{source}: an empty file, not a SentencePiece model; give the tokenizer's .model file")
        import sentencepiece

        try:
            processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
        except RuntimeError as error:  # the library's parse and model errors
            reason = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            raise DataError(f"{source}: not a SentencePiece model ({reason}); give the tokenizer's .model "
                            f"file") from None
        if len(processor) == 0:
            raise DataError(f"{source}: a SentencePiece model with no pieces; give the tokenizer's .model file")
        self.tokenizer_type = tokenizer_type
        self._model_proto = model_proto
        self._processor = processor
        pieces = {processor.id_to_piece(i): i for i in range(len(processor))}  # Megatron's _populate_vocab
        self._special_tokens: dict[str, int] = {}
        if tokenizer_type == SENTENCEPIECE:
            self._vocab_size, self._eod_id = self._add_special_tokens(pieces)
        else:
            self._vocab_size, self._eod_id = len(pieces), processor.eos_id()
            if self._eod_id < 0:
                raise DataError(f"{source}: the model has no end-of-sentence piece (eos_id -1), which "
                                f"{tokenizer_type} uses as the end of document; give a model with one")
            if tokenizer_type == LLAMA2 and processor.bos_id() < 0:
                raise DataError(f"{source}: the model has no beginning-of-sentence piece (bos_id -1), which "
                                f"Llama2Tokenizer puts before every text; give a model with one")
        self._inverse_special_tokens = {i: piece for piece, i in self._special_tokens.items()}

    def _add_special_tokens(self, vocab: dict[str, int]) -> tuple[int, int]:
        """Megatron's `_SentencePieceTokenizer._initalize` without extra ids: each missing special piece takes the next
        id. Returns (vocabulary, eod)."""
        processor = self._processor

        def add(piece: str) -> None:
            if piece not in vocab:
                vocab[piece] = len(vocab)
            self._special_tokens[piece] = vocab[piece]

        for piece in ("<CLS>", "<SEP>", "<EOD>", "<MASK>"):
            add(piece)
        add(_piece_or(processor, processor.pad_id(), "<PAD>"))
        add(_piece_or(processor, processor.bos_id(), "<BOS>"))
        add(_piece_or(processor, processor.eos_id(), "<EOS>"))
        return len(vocab), vocab["<EOD>"]

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eod_id(self) -> int:
        return self._eod_id

    @property
    def pad_id(self) -> Optional[int]:
        """The model's pad piece (Megatron-Core's SentencePieceTokenizer.pad_id outside its legacy mode), or None."""
        pad = self._processor.pad_id()
        return pad if pad >= 0 else None

    def encode(self, text: str) -> list[int]:
        """Megatron's `tokenize(text)`: what its preprocess_data.py writes before appending eod."""
        if self.tokenizer_type == LLAMA2:  # Megatron-LM's tokenize(s, bos=True, eos=False)
            return [self._processor.bos_id(), *self._processor.encode_as_ids(text)]
        if self.tokenizer_type == GPT_SENTENCEPIECE:
            return self._processor.encode_as_ids(text)
        return self._encode_with_special_tokens(text)

    def _encode_with_special_tokens(self, text: str) -> list[int]:
        """SentencePieceTokenizer's tokenize: the text cut at the earliest special piece each time, the rest encoded by
        the model."""
        ids: list[int] = []
        start = 0
        while True:
            found = {piece: text.find(piece, start) for piece in self._special_tokens}
            found = {piece: at for piece, at in found.items() if at >= 0}
            if not found:
                break
            piece = min(found, key=found.get)
            ids.extend(self._processor.encode_as_ids(text[start:found[piece]]))
            ids.append(self._special_tokens[piece])
            start = found[piece] + len(piece)
        ids.extend(self._processor.encode_as_ids(text[start:]))
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Same ids as `encode` on each text."""
        if self.tokenizer_type == SENTENCEPIECE:
            return [self._encode_with_special_tokens(text) for text in texts]
        batch = self._processor.encode(list(texts))
        if self.tokenizer_type == LLAMA2:
            return [[self._processor.bos_id(), *ids] for ids in batch]
        return batch

    tokenize_batch = encode_batch

    def decode(self, ids: Iterable[int]) -> str:
        """Megatron's `detokenize`: special ids as their pieces, each followed by a space."""
        ids = list(ids)
        if self.tokenizer_type != SENTENCEPIECE:
            return self._processor.decode_ids(ids)
        text, last = "", 0
        for i, token in enumerate(ids):
            if token in self._inverse_special_tokens:
                text += self._processor.decode_ids(ids[last:i]) + " " + self._inverse_special_tokens[token] + " "
                last = i + 1
        return text + self._processor.decode_ids(ids[last:])

    def to_json(self) -> str:
        """The type and model bytes as one JSON string (two types over one model give different ids)."""
        return json.dumps({"tokenizer_type": self.tokenizer_type,
                           "model": base64.b64encode(self._model_proto).decode("ascii")})

    def __reduce__(self):
        return SentencePieceTokenizer, (self.tokenizer_type, self._model_proto)

    def save(self, directory: str) -> None:
        """The model file as it was read, as `tokenizer.model`."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, SENTENCEPIECE_MODEL_FILE), "wb") as f:
            f.write(self._model_proto)


def load_sentencepiece_tokenizer(tokenizer_type: str, model_file: str) -> SentencePieceTokenizer:
    """The tokenizer of `--tokenizer-type tokenizer_type --tokenizer-model model_file`, the file checked first."""
    flag = f"--tokenizer-model {model_file}"
    check_input_file(model_file, "--tokenizer-model", max_bytes=None, error=DataError,
                     fix=f"{tokenizer_type} reads a SentencePiece .model file")
    try:
        with open(model_file, "rb") as f:
            model_proto = f.read()
    except OSError as error:
        raise DataError(f"{flag}: cannot be read ({error.strerror or error}); give a readable .model file") from None
    return SentencePieceTokenizer(tokenizer_type, model_proto, source=flag)
