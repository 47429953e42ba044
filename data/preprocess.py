"""Corpus -> Megatron indexed dataset, ``<output-prefix>_<key>_document.{bin,idx}`` per JSON key: Megatron-LM's
tools/preprocess_data.py command lines run as written, over JSONL, text, parquet and saved `datasets` folders.
Tokenization runs in worker processes whose batches come back in order, so the output is identical for any worker count.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import gzip
import itertools
import json
import multiprocessing
import os
import re
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from base.errors import run_tool
from base.input_files import check_input_file
from base.progress import ProgressLines
from data import DataError
from data.corpus import split_on_blank_lines
from data.indexed import IndexedDatasetWriter, best_dtype, data_file_path, index_file_path
from data.preprocess_args import BLANK_LINE_SEPARATOR, FORMATS, PROGRAM, build_parser
from data.preprocess_megatron_flags import check_megatron_flags
from data.preprocess_tokenizer import document_tokenizer, given_tokenizer
from data.tokenizer import GPTTokenizer, train_tokenizer

_FORMAT_OF_EXTENSION = {".jsonl": "jsonl", ".json": "jsonl", ".jsonl.gz": "jsonl", ".json.gz": "jsonl", ".txt": "text",
                        ".parquet": "parquet"}
_GLOB_CHARACTERS = re.compile(r"[*?[]")

# A batch closes at whichever limit comes first: enough documents to amortise a worker trip, few enough characters to
# keep messages small.
_BATCH_DOCUMENTS = 256
_BATCH_CHARACTERS = 4 << 20
_ROW_BATCH = 1024



@dataclass(frozen=True)
class InputSource:
    path: str
    format: str  # one of FORMATS except "auto"


def _is_saved_hf_dataset(directory: str) -> bool:
    """`Dataset.save_to_disk` writes state.json; `DatasetDict.save_to_disk` writes dataset_dict.json."""
    return any(os.path.isfile(os.path.join(directory, name)) for name in ("state.json", "dataset_dict.json"))


def _extension(path: str) -> str:
    """The name's extension, both parts of a compressed one (.jsonl.gz)."""
    root, extension = os.path.splitext(path.lower())
    return os.path.splitext(root)[1] + extension if extension == ".gz" else extension


def _format_of_file(path: str, input_format: str) -> str:
    if input_format != "auto":
        return input_format
    extension = _extension(path)
    if extension not in _FORMAT_OF_EXTENSION:
        known = ", ".join(sorted(_FORMAT_OF_EXTENSION))
        raise DataError(
            f"--input {path}: cannot tell the format from extension {extension!r} (known: {known}); "
            f"pass --input-format"
        )
    return _FORMAT_OF_EXTENSION[extension]


def _walk_directory(directory: str, input_format: str) -> list[InputSource]:
    """Files under `directory` in sorted order, hidden entries skipped, saved datasets whole; with --input-format auto
    only known extensions."""
    sources = []
    for root, dirnames, filenames in os.walk(directory):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for dirname in list(dirnames):
            subdirectory = os.path.join(root, dirname)
            if input_format in ("auto", "hf") and _is_saved_hf_dataset(subdirectory):
                sources.append(InputSource(subdirectory, "hf"))
                dirnames.remove(dirname)
        for filename in sorted(f for f in filenames if not f.startswith(".")):
            path = os.path.join(root, filename)
            if input_format == "auto":
                extension = _extension(filename)
                if extension in _FORMAT_OF_EXTENSION:
                    sources.append(InputSource(path, _FORMAT_OF_EXTENSION[extension]))
            elif input_format != "hf":
                sources.append(InputSource(path, input_format))
    return sorted(sources, key=lambda source: source.path)


def resolve_inputs(paths: Iterable[str], input_format: str) -> list[InputSource]:
    """Expand --input paths into the files (and saved datasets) to read, each with its format."""
    if input_format not in FORMATS:
        raise DataError(f"--input-format {input_format!r} is unknown; choose one of {', '.join(FORMATS)}")
    sources: list[InputSource] = []
    for path in paths:
        if not os.path.exists(path) and _GLOB_CHARACTERS.search(path):
            # A quoted pattern, globbed as Megatron's tool does with --partitions; sorted.
            matched = sorted(glob.glob(path))
            if not matched:
                raise DataError(f"--input {path}: no file matches the pattern")
            sources.extend(resolve_inputs(matched, input_format))
            continue
        if not os.path.exists(path):
            raise DataError(f"--input {path}: no such file or directory")
        if os.path.isdir(path):
            if input_format in ("auto", "hf") and _is_saved_hf_dataset(path):
                sources.append(InputSource(path, "hf"))
                continue
            found = _walk_directory(path, input_format)
            if not found:
                raise DataError(
                    f"--input {path}: directory holds no input files for --input-format {input_format} "
                    f"(auto takes {', '.join(sorted(_FORMAT_OF_EXTENSION))} files and saved datasets)"
                )
            sources.extend(found)
        elif input_format == "hf":
            raise DataError(f"--input {path}: --input-format hf expects a directory written by save_to_disk")
        else:
            sources.append(InputSource(_regular_input(path), _format_of_file(path, input_format)))
    for source in sources:
        if source.format != "hf":
            _regular_input(source.path)
    return sources


def _regular_input(path: str) -> str:
    """A FIFO or /dev/zero would be read forever; a corpus file may be any size."""
    check_input_file(path, "--input", max_bytes=None, error=DataError,
                     fix="inputs are regular files, or directories of them")
    return path


# Each reader yields one {key: text} per document.


def _check_text(value, key: str, where: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: key {key!r} holds {type(value).__name__}, not text")
    return value


def _read_jsonl(path: str, keys: list[str]) -> Iterator[dict[str, str]]:
    compressed = path.endswith(".gz")
    try:
        with (gzip.open if compressed else open)(path, "rt", encoding="utf-8") as lines:
            for line_number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{line_number}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as error:
                    raise DataError(f"{where}: not valid JSON ({error.msg})") from error
                except RecursionError:
                    raise DataError(f"{where}: JSON nested too deeply to be a document") from None
                if not isinstance(record, dict):
                    raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
                for key in keys:
                    if key not in record:
                        raise DataError(f"{where}: missing key {key!r} (--json-keys {' '.join(keys)})")
                yield {key: _check_text(record[key], key, where) for key in keys}
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error})") from error
    except (OSError, EOFError) as error:
        if not compressed:
            raise
        raise DataError(f"{path}: not a readable gzip file ({error})") from None


def _unescape_separator(separator: str) -> str:
    r"""Shell-friendly separators: '\n', '\t', '\r' and '\\' stand for the characters."""
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}

    def replace(match: re.Match) -> str:
        if match.group(1) not in escapes:
            raise DataError(
                f"--text-document-separator: unknown escape '\\{match.group(1)}' (use \\n \\t \\r \\\\)"
            )
        return escapes[match.group(1)]

    return re.sub(r"\\(.)", replace, separator)


def _read_text(path: str, keys: list[str], separator: str | None) -> Iterator[dict[str, str]]:
    if len(keys) != 1:
        raise DataError(
            f"{path}: plain text has no keys, so --json-keys must name exactly one output "
            f"(got {' '.join(keys)})"
        )
    try:
        # Universal newlines: CRLF and LF files give the same tokens.
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: not UTF-8 text ({error})") from error
    if separator is None:
        documents = [text]
    elif separator == BLANK_LINE_SEPARATOR:
        documents = split_on_blank_lines(text)
    else:
        documents = text.split(_unescape_separator(separator))
    for document in documents:
        yield {keys[0]: document}


def _rows_of_columns(
    columns: dict[str, list], keys: list[str], where: str, first_row: int
) -> Iterator[dict[str, str]]:
    for offset in range(len(columns[keys[0]])):
        row_where = f"{where} row {first_row + offset}"
        yield {key: _check_text(columns[key][offset], key, row_where) for key in keys}


def _check_columns(path: str, available: list[str], keys: list[str]) -> None:
    for key in keys:
        if key not in available:
            raise DataError(f"{path}: no column {key!r} (--json-keys); columns are {', '.join(available)}")


def _read_parquet(path: str, keys: list[str]) -> Iterator[dict[str, str]]:
    import pyarrow.parquet

    try:
        parquet = pyarrow.parquet.ParquetFile(path)
    except Exception as error:  # pyarrow raises ArrowInvalid / OSError variants for non-parquet files
        raise DataError(f"{path}: not a readable parquet file ({error})") from error
    _check_columns(path, parquet.schema_arrow.names, keys)
    row = 0
    for batch in parquet.iter_batches(batch_size=_ROW_BATCH, columns=keys):
        columns = {key: batch.column(key).to_pylist() for key in keys}
        yield from _rows_of_columns(columns, keys, path, row)
        row += batch.num_rows


def _read_hf(path: str, keys: list[str]) -> Iterator[dict[str, str]]:
    import datasets  # Imported on use: it takes a second or two.

    try:
        dataset = datasets.load_from_disk(path)
    except Exception as error:  # datasets raises FileNotFoundError or its own errors for foreign folders
        raise DataError(f"{path}: not a dataset saved with save_to_disk ({error})") from error
    if isinstance(dataset, datasets.DatasetDict):
        # Never merge splits silently: a test split folded into training data is costly.
        splits = ", ".join(dataset)
        example = os.path.join(path, next(iter(dataset)))
        raise DataError(f"{path}: holds several splits ({splits}); pass one split's folder, e.g. {example}")
    _check_columns(path, dataset.column_names, keys)
    row = 0
    for columns in dataset.select_columns(keys).iter(batch_size=_ROW_BATCH):
        yield from _rows_of_columns(columns, keys, path, row)
        row += len(columns[keys[0]])


def iter_documents(
    sources: list[InputSource], keys: list[str], text_separator: str | None
) -> Iterator[dict[str, str]]:
    """Every document of every source, in order, as {key: text}."""
    for source in sources:
        if source.format == "jsonl":
            yield from _read_jsonl(source.path, keys)
        elif source.format == "text":
            yield from _read_text(source.path, keys, text_separator)
        elif source.format == "parquet":
            yield from _read_parquet(source.path, keys)
        else:
            yield from _read_hf(source.path, keys)


# ----------------------------------------------------------------------------------- tokenization


@dataclass
class Batch:
    texts: dict[str, list[str]]  # per key, the non-empty documents in input order
    skipped: dict[str, int]  # per key, empty documents left out
    num_bytes: int  # UTF-8 size of the texts, for MB/s


def make_batches(documents: Iterator[dict[str, str]], keys: list[str], log_interval: int = 0) -> Iterator[Batch]:
    """Batches of up to _BATCH_DOCUMENTS documents (or _BATCH_CHARACTERS), also ending at every `log_interval`-th
    document, where Megatron-LM's tool prints progress."""
    def empty_batch() -> Batch:
        return Batch({key: [] for key in keys}, {key: 0 for key in keys}, 0)

    batch, documents_in_batch, characters_in_batch = empty_batch(), 0, 0
    for read, document in enumerate(documents, start=1):
        for key in keys:
            text = document[key]
            if text.strip():
                batch.texts[key].append(text)
                batch.num_bytes += len(text.encode("utf-8"))
                characters_in_batch += len(text)
            else:
                batch.skipped[key] += 1
        documents_in_batch += 1
        at_a_line = log_interval > 0 and read % log_interval == 0
        if documents_in_batch >= _BATCH_DOCUMENTS or characters_in_batch >= _BATCH_CHARACTERS or at_a_line:
            yield batch
            batch, documents_in_batch, characters_in_batch = empty_batch(), 0, 0
    if documents_in_batch:
        yield batch


class BatchEncoder:
    """Turns a batch's texts into token arrays of the dataset dtype (EOD appended if asked); pickles with its tokenizer
    into the workers."""

    def __init__(self, tokenize: Callable[[Sequence[str]], list[list[int]]], eod_id: int, append_eod: bool,
                 dtype: np.dtype):
        self.tokenize = tokenize
        self.eod_id = eod_id
        self.append_eod = append_eod
        self.dtype = np.dtype(dtype)

    def __call__(self, texts: dict[str, list[str]]) -> dict[str, list[np.ndarray]]:
        encoded = {}
        for key, key_texts in texts.items():
            ids_per_text = self.tokenize(key_texts) if key_texts else []
            if self.append_eod:
                for ids in ids_per_text:
                    ids.append(self.eod_id)
            # Dataset-dtype arrays pickle back at 2 bytes a token, not ~30.
            encoded[key] = [np.asarray(ids, dtype=self.dtype) for ids in ids_per_text]
        return encoded


# One encoder per worker, set once by the pool initializer: the tokenizer is too costly to ship per batch.
_worker_encoder: BatchEncoder | None = None


def _init_worker(encoder: BatchEncoder) -> None:
    global _worker_encoder
    # N workers each with an all-core thread pool would oversubscribe the CPU.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_encoder = encoder


def _encode_in_worker(texts: dict[str, list[str]]) -> dict[str, list[np.ndarray]]:
    return _worker_encoder(texts)


def encode_in_order(
    batches: Iterator[Batch], encoder: BatchEncoder, workers: int
) -> Iterator[tuple[Batch, dict[str, list[np.ndarray]]]]:
    """(batch, its token arrays) in input order; with workers > 1, encoding runs in a process pool."""
    if workers == 1:
        for batch in batches:
            yield batch, encoder(batch.texts)
        return
    # spawn, not fork: forking after tokenizers started its threads can deadlock.
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init_worker, initargs=(encoder,)) as pool:
        # A bounded window keeps workers busy without reading the whole corpus.
        pending: deque = deque()
        for batch in batches:
            pending.append((batch, pool.apply_async(_encode_in_worker, (batch.texts,))))
            if len(pending) >= 2 * workers:
                done, result = pending.popleft()
                yield done, result.get()
        while pending:
            done, result = pending.popleft()
            yield done, result.get()



@dataclass
class Totals:
    documents: int = 0
    skipped: int = 0
    tokens: int = 0
    num_bytes: int = 0
    started: float = field(default_factory=time.perf_counter)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def rates(self) -> str:
        seconds = max(self.seconds, 1e-9)
        return f"{self.documents / seconds:,.0f} docs/s, {self.num_bytes / 1e6 / seconds:.2f} MB/s"


class Progress:
    """A tqdm bar on a terminal; a plain line every `log_interval` documents otherwise (batch logs)."""

    def __init__(self, totals: Totals, log_interval: int):
        self.totals = totals
        self.log_interval = log_interval
        self.bar = tqdm(desc="preprocess", unit="docs", file=sys.stderr, disable=None, dynamic_ncols=True)
        self._next_log = log_interval

    def update(self, documents: int) -> None:
        if not self.bar.disable:
            self.bar.update(documents)
            megabytes_per_second = self.totals.num_bytes / 1e6 / max(self.totals.seconds, 1e-9)
            self.bar.set_postfix_str(f"{megabytes_per_second:.2f} MB/s")
        elif self.totals.documents >= self._next_log:
            print(
                f"preprocess: {self.totals.documents:,} documents, {self.totals.num_bytes / 1e6:.1f} MB "
                f"({self.totals.rates()})",
                file=sys.stderr,
                flush=True,
            )
            self._next_log = (self.totals.documents // self.log_interval + 1) * self.log_interval

    def close(self) -> None:
        self.bar.close()



def in_partition_order(documents: Callable[[], Iterator[dict[str, str]]], partitions: int) -> \
        Iterator[dict[str, str]]:
    """Megatron's --partitions N order: line i goes to partition i % N, merged in partition order, one pass per
    partition."""
    for partition in range(partitions):
        yield from itertools.islice(documents(), partition, None, partitions)


def output_prefix_for_key(output_prefix: str, key: str) -> str:
    return f"{output_prefix}_{key}_document"


def _train_tokenizer(args: argparse.Namespace, sources: list[InputSource]) -> GPTTokenizer:
    documents_seen = 0

    def texts() -> Iterator[str]:
        nonlocal documents_seen
        for document in iter_documents(sources, args.json_keys, args.text_document_separator):
            for text in document.values():
                if text.strip():
                    documents_seen += 1
                    yield text

    tokenizer = train_tokenizer(texts(), args.train_tokenizer_vocab_size, progress=ProgressLines())
    if documents_seen == 0:
        raise DataError(f"--input {' '.join(args.input)}: no non-empty documents to train a tokenizer on")
    directory = f"{args.output_prefix}_tokenizer"
    tokenizer.save(directory)
    print(
        f"preprocess: trained a {tokenizer.vocab_size}-token tokenizer, saved to {directory}",
        file=sys.stderr,
    )
    return tokenizer


def _check_options(args: argparse.Namespace) -> None:
    if args.workers < 1:
        raise DataError(f"--workers {args.workers}: need at least 1")
    if args.log_interval < 1:
        raise DataError(f"--log-interval {args.log_interval}: need at least 1")
    if args.partitions < 1 or args.workers % args.partitions:
        raise DataError(f"--partitions {args.partitions}: need at least 1, and --workers {args.workers} a multiple "
                        f"of it (Megatron's tool asserts it)")
    if args.tokenizer_hf_include_special_tokens and args.tokenizer_hf_no_include_special_tokens:
        raise DataError("--tokenizer-hf-include-special-tokens and --tokenizer-hf-no-include-special-tokens: give one")
    check_megatron_flags(args)
    if len(set(args.json_keys)) != len(args.json_keys):
        raise DataError(f"--json-keys {' '.join(args.json_keys)}: a key is repeated")
    if args.train_tokenizer_vocab_size is not None and args.train_tokenizer_vocab_size < 1:
        raise DataError(f"--train-tokenizer-vocab-size {args.train_tokenizer_vocab_size}: must be positive")


def _check_outputs(args: argparse.Namespace, prefixes: dict[str, str]) -> None:
    """Before any input is read: the output directory is writable, and nothing earlier is replaced without --overwrite.
    """
    output_dir = os.path.dirname(os.path.abspath(args.output_prefix))
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise DataError(f"--output-prefix {args.output_prefix}: {output_dir} is a file, not a directory")
    try:
        os.makedirs(output_dir, exist_ok=True)
        probe = os.path.join(output_dir, f".write-test-{os.getpid()}")
        open(probe, "wb").close()
        os.remove(probe)
    except OSError as error:
        raise DataError(f"--output-prefix {args.output_prefix}: cannot write in {output_dir} "
                        f"({error.strerror or error})") from None
    outputs = [path for prefix in prefixes.values() for path in (data_file_path(prefix), index_file_path(prefix))]
    if args.train_tokenizer_vocab_size is not None:
        outputs.append(f"{args.output_prefix}_tokenizer")
    existing = [path for path in outputs if os.path.exists(path)]
    if existing and not args.overwrite:
        raise DataError(f"--output-prefix {args.output_prefix}: {existing[0]} already exists; pass --overwrite "
                        f"to replace it, or choose another prefix")


def preprocess(args: argparse.Namespace) -> Totals:
    """Run the whole conversion for parsed arguments; raises DataError for bad input."""
    _check_options(args)
    sources = resolve_inputs(args.input, args.input_format)
    prefixes = {key: output_prefix_for_key(args.output_prefix, key) for key in args.json_keys}
    tokenizer = given_tokenizer(args)
    _check_outputs(args, prefixes)
    tokenizer = tokenizer or _train_tokenizer(args, sources)
    encoder = BatchEncoder(document_tokenizer(tokenizer, not args.tokenizer_hf_no_include_special_tokens),
                           tokenizer.eod_id, args.append_eod, best_dtype(tokenizer.vocab_size))

    totals = Totals()
    documents_per_key = dict.fromkeys(args.json_keys, 0)
    progress = Progress(totals, args.log_interval)
    # Writers discard their temporaries if anything raises: no half-written dataset remains.
    with contextlib.ExitStack() as stack:
        stack.callback(progress.close)
        writers = {
            key: stack.enter_context(IndexedDatasetWriter(prefix, encoder.dtype))
            for key, prefix in prefixes.items()
        }
        partitions = 1 if args.keep_sequential_samples else args.partitions
        documents = in_partition_order(lambda: iter_documents(sources, args.json_keys, args.text_document_separator),
                                       partitions)
        batches = make_batches(documents, args.json_keys, args.log_interval)
        for batch, encoded in encode_in_order(batches, encoder, args.workers):
            for key, arrays in encoded.items():
                for tokens in arrays:
                    writers[key].add_document(tokens)
                    totals.tokens += tokens.size
                documents_per_key[key] += len(arrays)
                totals.skipped += batch.skipped[key]
            written = sum(len(arrays) for arrays in encoded.values())
            totals.documents += written
            totals.num_bytes += batch.num_bytes
            progress.update(written)
        for key, count in documents_per_key.items():
            if count == 0:
                raise DataError(f"--input {' '.join(args.input)}: no non-empty documents for key {key!r}")

    print(
        f"preprocess: {totals.documents:,} documents ({totals.skipped:,} empty skipped), "
        f"{totals.tokens:,} tokens, {totals.num_bytes / 1e6:.2f} MB in {totals.seconds:.1f} s "
        f"({totals.rates()}) -> {', '.join(prefix + '.{bin,idx}' for prefix in prefixes.values())}",
        file=sys.stderr,
        flush=True,
    )
    return totals


def main(argv: list[str] | None = None) -> int:
    return run_tool(PROGRAM, lambda: preprocess(build_parser().parse_args(argv)), (DataError,))


if __name__ == "__main__":
    sys.exit(main())
