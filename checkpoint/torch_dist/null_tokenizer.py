"""NullTokenizer's reading of --vocab-size in a Megatron-LM checkpoint's args: core_v0.18.0 on saves
`null_tokenizer_eod_id` (None: the last id) and reads --vocab-size N as N ids (megatron/core/tokenizers/text/
libraries/null_tokenizer.py); older args lack it, the reading of N + 1 ids this project defaults to."""

from __future__ import annotations

from dataclasses import asdict
from typing import Optional

from checkpoint.global_state import megatron_rows_multiple
from checkpoint.null_tokenizer_reading import NULL_TOKENIZER_KEY, NullTokenizerReading
from data.tokenizer import NEWER_NULL_READING as NEWER_READING


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def megatron_null_tokenizer(args) -> Optional[NullTokenizerReading]:
    """The core_v0.18-on reading a checkpoint was written under, or None. Its vocabulary is the saved rows
    (args.padded_vocab_size): Megatron-Core's cross entropy scores every row, its padding included, so a corpus id
    past the tokenizer's trained there as any other."""
    size = getattr(args, "vocab_size", None)
    if getattr(args, "tokenizer_type", None) != "NullTokenizer" or not hasattr(args, "null_tokenizer_eod_id") \
            or not _whole(size) or size < 1:
        return None
    eod = args.null_tokenizer_eod_id
    rows = getattr(args, "padded_vocab_size", None)
    if not _whole(rows) or rows < size:
        multiple = megatron_rows_multiple(args) or 1
        rows = -(-size // multiple) * multiple
    return NullTokenizerReading(size, rows, eod if _whole(eod) else size - 1, NEWER_READING)


def saved_vocabulary(args) -> Optional[int]:
    """The vocabulary the args size (NullTokenizer's, in the reading of the release that wrote them), or None
    where a tokenizer's files size it."""
    size = getattr(args, "vocab_size", None)
    if getattr(args, "tokenizer_type", None) != "NullTokenizer" or not _whole(size) or size < 1:
        return None
    newer = megatron_null_tokenizer(args)
    return newer.ids if newer is not None else size + 1


def null_tokenizer_view(args) -> dict:
    """The reading as metadata_view's record (checkpoint/null_tokenizer_reading.py), empty for the default one."""
    reading = megatron_null_tokenizer(args)
    return {NULL_TOKENIZER_KEY: asdict(reading)} if reading is not None else {}
