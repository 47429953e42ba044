"""data.preprocess's command line: its own flags, and Megatron-LM's tools/preprocess_data.py's as that tool spells
them (its tokenizer flags from megatron/training/arguments.py _add_tokenizer_args, and get_args's own)."""

from __future__ import annotations

import argparse

from base.errors import OneLineArgumentParser
from data.preprocess_megatron_flags import add_megatron_flags
from data.tokenizer_types import OTHER_TOKENIZER_TYPES, TOKENIZER_TYPE_ALIASES, TOKENIZER_TYPES, tokenizer_type_name

PROGRAM = "python -m data.preprocess"
FORMATS = ("auto", "jsonl", "text", "parquet", "hf")
BLANK_LINE_SEPARATOR = "blank-line"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(
        prog=PROGRAM,
        description="Tokenize a corpus into Megatron .bin/.idx datasets (<output-prefix>_<key>_document).",
    )
    group = parser.add_argument_group("input")
    group.add_argument(
        "--input", nargs="+", required=True, metavar="PATH", help="files or directories, read in order"
    )
    group.add_argument("--input-format", choices=FORMATS, default="auto",
                       help="auto: .jsonl/.json -> jsonl, .txt -> text, .parquet -> parquet, "
                            "save_to_disk folder -> hf")
    group.add_argument("--json-keys", nargs="+", default=["text"], metavar="KEY",
                       help="keys (columns) to tokenize; one output dataset per key")
    group.add_argument("--text-document-separator", default=None, metavar="SEP",
                       help=f"split text files into documents at SEP ('\\n' escapes allowed), or at "
                            f"blank lines with '{BLANK_LINE_SEPARATOR}'; default: one document per file")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer-file", help="a tokenizers tokenizer.json")
    group.add_argument("--vocab-file", help="GPT-2 style vocab.json (with --merge-file)")
    group.add_argument("--merge-file", help="GPT-2 style merges.txt (with --vocab-file)")
    group.add_argument("--tokenizer-type", type=tokenizer_type_name,
                       choices=(*TOKENIZER_TYPES, *TOKENIZER_TYPE_ALIASES, *OTHER_TOKENIZER_TYPES),
                       help="Megatron's: HuggingFaceTokenizer (--tokenizer-model: a tokenizer.json or its folder), "
                            "GPT2BPETokenizer (--vocab-file, --merge-file), NullTokenizer (--vocab-size), "
                            "GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer (--tokenizer-model: "
                            "a SentencePiece .model)")
    group.add_argument("--tokenizer-model", help="with --tokenizer-type: its tokenizer.json (or folder) or .model")
    group.add_argument("--vocab-size", type=int, metavar="N",
                       help="with --tokenizer-type NullTokenizer: documents are ids 0..N-1; the end of document is N")
    group.add_argument("--tokenizer-hf-include-special-tokens", action="store_true",
                       help="a Hugging Face tokenizer writes the special tokens its tokenizer.json puts around a "
                            "text (Llama's bos): the default, as Megatron's")
    group.add_argument("--tokenizer-hf-no-include-special-tokens", action="store_true",
                       help="a Hugging Face tokenizer writes a text's own tokens only")
    group.add_argument("--train-tokenizer-vocab-size", type=int, metavar="N",
                       help="train a byte-level BPE of N tokens on the input; "
                            "saved to <output-prefix>_tokenizer/")
    group.add_argument("--append-eod", action="store_true",
                       help="end every document with the tokenizer's end-of-document id (its eos_token: "
                            "<|endoftext|>, </s>, <|end_of_text|>, <eos>; a SentencePiece type's eod; "
                            "NullTokenizer's N)")
    group = parser.add_argument_group("output and runtime")
    group.add_argument("--output-prefix", required=True, help="path prefix of the output datasets")
    group.add_argument("--overwrite", action="store_true",
                       help="replace datasets (and a trained tokenizer) an earlier run wrote at this prefix")
    group.add_argument("--workers", type=int, default=1,
                       help="tokenizer processes (output is identical for any count)")
    group.add_argument("--partitions", type=int, default=1, metavar="N",
                       help="Megatron's order: document i goes to partition i %% N and the partitions are "
                            "written one after another (the input is read N times)")
    group.add_argument("--keep-sequential-samples", action="store_true",
                       help="with --partitions: each partition a run of consecutive documents, so the input "
                            "order is kept")
    # Megatron-LM's tools/preprocess_data.py default: a line of docs/s and MB/s every 1000 documents
    group.add_argument("--log-interval", type=int, default=1000, metavar="DOCS",
                       help="documents between progress lines (documents, MB, docs/s, MB/s) when stderr is not a "
                            "terminal, which shows a bar with the same rates")
    add_megatron_flags(parser.add_argument_group("Megatron's flags that change nothing here, or are refused"))
    return parser
