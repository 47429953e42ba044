"""The tokenizer data.preprocess tokenizes with, from ours or Megatron-LM's flags, loaded so a bad file fails before any
output exists.
"""

from __future__ import annotations

import argparse
from typing import Callable, Optional, Sequence

from data import DataError
from data.sentencepiece_tokenizer import SENTENCEPIECE_TYPES
from data.tokenizer import GPTTokenizer, RunTokenizer, load_named_tokenizer, load_tokenizer
from data.tokenizer_types import GPT2_BPE, HUGGING_FACE, NULL, tokenizer_type_problem

MODEL_TYPES = (HUGGING_FACE, *SENTENCEPIECE_TYPES)
CHOOSE_ONE = ("choose exactly one tokenizer: --tokenizer-file, --vocab-file with --merge-file, --tokenizer-type with "
              "its files (Megatron's: --tokenizer-model, --vocab-file and --merge-file, or --vocab-size), or "
              "--train-tokenizer-vocab-size")


def given_tokenizer(args: argparse.Namespace) -> Optional[RunTokenizer]:
    """The tokenizer the flags name, loaded, or None when one is to be trained on the input."""
    train = args.train_tokenizer_vocab_size is not None
    if args.tokenizer_type or args.tokenizer_model:
        if args.tokenizer_file or train:
            raise DataError(CHOOSE_ONE)
        return _megatron_tokenizer(args)
    if sum([bool(args.tokenizer_file), bool(args.vocab_file or args.merge_file), train]) != 1:
        raise DataError(CHOOSE_ONE)
    return None if train else load_tokenizer(args.tokenizer_file, args.vocab_file, args.merge_file)


def _megatron_tokenizer(args: argparse.Namespace) -> RunTokenizer:
    kind = args.tokenizer_type
    if kind is None or (kind in MODEL_TYPES and not args.tokenizer_model):
        raise DataError(f"--tokenizer-type and --tokenizer-model go together: one of {', '.join(MODEL_TYPES)} and "
                        f"its file (a tokenizer.json or its folder; a SentencePiece .model)")
    problem = tokenizer_type_problem(kind, args.tokenizer_model, args.vocab_file)
    if problem:
        raise DataError(problem)
    if args.tokenizer_model and kind not in MODEL_TYPES:
        raise DataError(f"--tokenizer-model is read by {', '.join(MODEL_TYPES)}, not by --tokenizer-type {kind}")
    if (args.vocab_file or args.merge_file) and kind != GPT2_BPE:
        raise DataError(f"--vocab-file and --merge-file are GPT2BPETokenizer's, not --tokenizer-type {kind}'s")
    if kind == NULL and args.vocab_size is None:
        raise DataError("--tokenizer-type NullTokenizer needs --vocab-size N (token ids 0..N-1; the end-of-document "
                        "id is N)")
    return load_named_tokenizer(kind, args.tokenizer_model, args.vocab_file, args.merge_file, args.vocab_size or 0)


def document_tokenizer(tokenizer: RunTokenizer, special_tokens: bool) -> Callable[[Sequence[str]], list[list[int]]]:
    """Megatron's tokenize for a batch; with `special_tokens` False a Hugging Face tokenizer adds none
    (--tokenizer-hf-no-include-special-tokens)."""
    if not special_tokens and isinstance(tokenizer, GPTTokenizer):
        return tokenizer.encode_batch
    return tokenizer.tokenize_batch
