"""Megatron-LM's tools/preprocess_data.py flags that change nothing here, or that are refused, each with why, so its
command lines run as written.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from data import DataError

# flag -> (argparse keywords, why it changes no byte of the output)
NO_EFFECT = {
    "--vocab-extra-ids": ({"type": int, "default": 0}, "Megatron's tool sets it to 0 itself (get_args)"),
    "--padded-vocab-size": ({"type": int}, "the model's padded vocabulary is the trainer's, not the data's"),
    "--legacy-tokenizer": ({"action": "store_true"}, "Megatron's legacy HuggingFaceTokenizer writes a text's "
                                                     "special tokens (tokenize: tokenizer(text).input_ids), as is "
                                                     "done here by default"),
    "--trust-remote-code": ({"action": "store_true"}, "tokenizer.json is read as data; no code is run"),
    "--tokenizer-hf-use-fast": ({"action": "store_true"}, "tokenizer.json is the fast tokenizer"),
    "--tokenizer-hf-no-use-fast": ({"action": "store_true"}, "tokenizer.json is the fast tokenizer"),
    "--tiktoken-pattern": ({}, "read only by TikTokenizer, which is refused"),
    "--tiktoken-num-special-tokens": ({"type": int, "default": 1000}, "read only by TikTokenizer, which is refused"),
    "--tiktoken-special-tokens": ({"nargs": "+"}, "read only by TikTokenizer, which is refused"),
    "--keep-newlines": ({"action": "store_true"}, "read only with --split-sentences, which is refused"),
    "--lang": ({"default": "english"}, "read only with --split-sentences, which is refused"),
    "--workers-to-check": ({"nargs": "+", "default": [16, 32, 64]},
                           "read only with --find-optimal-num-workers, which is refused"),
    "--max-documents": ({"type": int, "default": 100_000}, "read only with --find-optimal-num-workers, which is "
                                                           "refused"),
    "--performance-dir": ({}, "read only with --find-optimal-num-workers, which is refused"),
}

# flag -> (argparse keywords, why it is refused)
REFUSED = {
    "--split-sentences": ({"action": "store_true"}, None),  # the reason depends on nltk: _split_sentences_reason
    "--find-optimal-num-workers": ({"action": "store_true"}, "not implemented: it times preprocessing at several "
                                                             "--workers-to-check counts; the output here is the same "
                                                             "for any --workers, so give one"),
    "--tokenizer-special-tokens": ({"nargs": "+"}, "not implemented: it adds tokens to the tokenizer's vocabulary, "
                                                   "which changes its ids; save the tokenizer with them instead"),
    "--tokenizer-metadata": ({}, "not implemented: the tokenizer is named by --tokenizer-type and its files"),
}


def _split_sentences_reason() -> str:
    # Megatron splits with nltk's punkt model (Encoder.initializer) and downloads the model first.
    if importlib.util.find_spec("nltk") is None:
        return "Megatron splits sentences with nltk's punkt model, and nltk is not installed here"
    return "not implemented: Megatron's *_sentence datasets (for BERT) are not written here"


def add_megatron_flags(group: "argparse.ArgumentParser") -> None:
    """Megatron's no-effect and refused preprocessing flags, hidden from --help, into argument group `group`."""
    for flag, (keywords, _) in {**NO_EFFECT, **REFUSED}.items():
        group.add_argument(flag, **{"default": None, **keywords}, help=argparse.SUPPRESS)


def _given(args: argparse.Namespace, flag: str, keywords: dict) -> bool:
    return getattr(args, flag[2:].replace("-", "_")) != keywords.get("default")


def check_megatron_flags(args: argparse.Namespace) -> None:
    """Refuse the first refused flag given (one line); say once each no-effect flag given, with why."""
    for flag, (keywords, reason) in REFUSED.items():
        if _given(args, flag, keywords):
            raise DataError(f"{flag}: {reason or _split_sentences_reason()}")
    for flag, (keywords, reason) in NO_EFFECT.items():
        if _given(args, flag, keywords):
            print(f"preprocess: {flag} has no effect here: {reason}", file=sys.stderr)
