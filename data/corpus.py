"""The embedded default corpus: CPython's reference documentation (`pydoc_data.topics`) cut into ~1,200 paragraph
documents, so `python pretrain_gpt.py` trains with no download and no data flags; its tokenizer and dataset are cached
by vocabulary size and text hash.
"""

from __future__ import annotations

import hashlib
import os
import pydoc_data.topics
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Optional

from base.file_modes import apply_umask
from base.progress import ProgressLines, print_line
from data import DataError
from data.indexed import IndexedDatasetWriter, best_dtype
from data.sentencepiece_tokenizer import SentencePieceTokenizer
from data.tokenizer import TOKENIZER_FILE, GPTTokenizer, load_tokenizer, train_tokenizer

# A tokenizer the user names: byte-level BPE files, or one of Megatron's SentencePiece types.
NamedTokenizer = GPTTokenizer | SentencePieceTokenizer

# A chunk grows paragraph by paragraph to this many characters (most paragraphs are too short alone).
MIN_DOCUMENT_CHARS = 200

# Bump when chunking or the cached layout changes.
CORPUS_RECIPE_VERSION = 1

DATASET_NAME = "pydoc_topics_text_document"
TOKENIZER_DIR_NAME = "tokenizer"

_BLANK_LINES = re.compile(r"\n(?:[ \t]*\n)+")


def split_on_blank_lines(text: str) -> list[str]:
    """The paragraphs of `text` between blank lines, none empty; only newlines are trimmed (code indentation kept)."""
    pieces = (piece.strip("\n") for piece in _BLANK_LINES.split(text))
    return [piece for piece in pieces if piece.strip()]


def _chunk_paragraphs(paragraphs: list[str], min_chars: int) -> list[str]:
    """Join consecutive paragraphs into chunks of at least `min_chars`; a short tail joins the previous chunk."""
    chunks: list[list[str]] = []
    current: list[str] = []
    current_chars = 0
    for paragraph in paragraphs:
        current_chars += len(paragraph) + (2 if current else 0)
        current.append(paragraph)
        if current_chars >= min_chars:
            chunks.append(current)
            current, current_chars = [], 0
    if current:
        if chunks:
            chunks[-1].extend(current)
        else:
            chunks.append(current)
    return ["\n\n".join(chunk) for chunk in chunks]


def default_corpus_documents() -> list[str]:
    """The default corpus as documents: each topic, in sorted order, in chunks of paragraphs of at least
    `MIN_DOCUMENT_CHARS`; deterministic for a given CPython."""
    documents: list[str] = []
    for name in sorted(pydoc_data.topics.topics):
        paragraphs = split_on_blank_lines(pydoc_data.topics.topics[name])
        documents.extend(_chunk_paragraphs(paragraphs, MIN_DOCUMENT_CHARS))
    return documents


def corpus_fingerprint(documents: list[str]) -> str:
    """Short hash of the documents, the Python version and the recipe: changes when any of them does."""
    digest = hashlib.sha256()
    digest.update(f"recipe={CORPUS_RECIPE_VERSION};python={sys.version_info[:3]}".encode())
    for document in documents:
        # Length-prefixing keeps ["ab", "c"] and ["a", "bc"] apart.
        encoded = document.encode("utf-8")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class PreparedCorpus:
    """Where the cached default corpus lives; pass these to the data and tokenizer loaders."""

    data_prefix: str  # path of the .bin/.idx without extension
    tokenizer_dir: str
    vocab_size: int  # of the trained tokenizer; can be below the requested size on this small corpus


def _build(directory: str, documents: list[str], vocab_size: int, tokenizer: Optional[NamedTokenizer]) -> None:
    """Train the tokenizer (unless given) and write the dataset into `directory`."""
    if tokenizer is None:
        tokenizer = train_tokenizer(documents, vocab_size, progress=ProgressLines())
    tokenizer.save(os.path.join(directory, TOKENIZER_DIR_NAME))
    prefix = os.path.join(directory, DATASET_NAME)
    with IndexedDatasetWriter(prefix, best_dtype(tokenizer.vocab_size)) as writer:
        for tokens in tokenizer.encode_batch(documents):
            writer.add_document(tokens + [tokenizer.eod_id])


def _prepared(directory: str, tokenizer: Optional[NamedTokenizer]) -> PreparedCorpus:
    """The prepared corpus in `directory`; its vocabulary is the given tokenizer's, else the trained one's."""
    tokenizer_dir = os.path.join(directory, TOKENIZER_DIR_NAME)
    if tokenizer is None:
        tokenizer = load_tokenizer(tokenizer_file=os.path.join(tokenizer_dir, TOKENIZER_FILE))
    return PreparedCorpus(
        data_prefix=os.path.join(directory, DATASET_NAME),
        tokenizer_dir=tokenizer_dir,
        vocab_size=tokenizer.vocab_size,
    )


def prepare_default_corpus(cache_dir: str, vocab_size: int,
                           tokenizer: Optional[NamedTokenizer] = None) -> PreparedCorpus:
    """Tokenizer + indexed dataset of the default corpus under `cache_dir`, built on first use (with the user's
    `tokenizer` if given). Safe for concurrent ranks and interruption: each builds in a temporary directory renamed into
    place; the first rename wins."""
    documents = default_corpus_documents()
    if tokenizer is None:
        name = f"pydoc-topics-v{vocab_size}-{corpus_fingerprint(documents)}"
    else:
        name = f"pydoc-topics-tok{hashlib.sha256(tokenizer.to_json().encode()).hexdigest()[:12]}-" \
               f"{corpus_fingerprint(documents)}"
    final_dir = os.path.join(cache_dir, name)
    if os.path.isdir(final_dir):
        return _prepared(final_dir, tokenizer)

    os.makedirs(cache_dir, exist_ok=True)
    which = f"tokenizer vocab {vocab_size}" if tokenizer is None else f"your tokenizer, {tokenizer.vocab_size} tokens"
    print_line(f"corpus: building the default corpus ({len(documents)} documents of CPython's pydoc topics, "
               f"{which}) in {final_dir}")
    work_dir = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=cache_dir)
    try:
        apply_umask(work_dir)  # mkdtemp makes it 0700; renamed into place it is the shared cache
        try:
            _build(work_dir, documents, vocab_size, tokenizer)
        except OSError as error:
            if error.filename is not None:
                raise
            # A full disk names no file: say which directory.
            raise DataError(f"--data-cache-dir {cache_dir}: cannot build the default corpus there "
                            f"({error.strerror or error}); free space or choose another directory") from None
        try:
            os.rename(work_dir, final_dir)
        except OSError:
            if not os.path.isdir(final_dir):
                raise
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return _prepared(final_dir, tokenizer)
