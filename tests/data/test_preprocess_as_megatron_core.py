"""data.preprocess against Megatron-Core's own code (the bench peer, megatron-core 0.16.1, on CPU): its
HuggingFaceTokenizer (megatron/core/tokenizers/text/utils/build_tokenizer.py, as tools/preprocess_data.py builds it)
tokenizes each document and its IndexedDatasetBuilder writes them as tools/preprocess_data.py's Encoder.encode and
process_json_file do (@ 00736f4c: `tokenizer.tokenize(sentence)`, then `tokenizer.eod` with --append-eod, the dtype
`DType.optimal_dtype(tokenizer.vocab_size)`); our files are byte-identical, with the special tokens (the newest
Megatron's default, --tokenizer-hf-include-special-tokens in 0.16.1) and without (0.16.1's default,
--tokenizer-hf-no-include-special-tokens here)."""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest

from data.preprocess import main
from tests.data.hf_tokenizer_shapes import SHAPES, build_tokenizer_folder
from tests.data.test_end_of_document_tokens import documents

pytestmark = pytest.mark.slow  # Megatron-Core's tokenizer loads transformers' for every file


def megatron_core():
    """Megatron-Core's tokenizer builder and dataset writer, imported when a test runs (not when the quick tier
    collects this file); the test is skipped without them."""
    build = pytest.importorskip("megatron.core.tokenizers.text.utils.build_tokenizer",
                                reason="megatron-core is a benchmark-only peer")
    return build, pytest.importorskip("megatron.core.datasets.indexed_dataset")


def megatron_core_writes(prefix: Path, texts: list[str], **tokenizer_args) -> None:
    """tools/preprocess_data.py's get_args (its _add_tokenizer_args defaults) and the loop of Encoder.encode."""
    args = argparse.Namespace(**{"vocab_file": None, "merge_file": None, "tokenizer_special_tokens": None,
                                 "tokenizer_hf_use_fast": False, "trust_remote_code": False,
                                 "tokenizer_metadata": None, "vocab_size": None, **tokenizer_args})
    build, indexed_dataset = megatron_core()
    tokenizer = build.build_tokenizer(args)
    builder = indexed_dataset.IndexedDatasetBuilder(
        f"{prefix}.bin", dtype=indexed_dataset.DType.optimal_dtype(tokenizer.vocab_size))
    for text in texts:
        ids = tokenizer.tokenize(text)
        ids.append(tokenizer.eod)
        builder.add_document(np.array(ids), [len(ids)])
    builder.finalize(f"{prefix}.idx")


def ours_equal_theirs(tmp_path: Path, texts: list[str], *flags: str) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    assert main(["--input", str(corpus), "--output-prefix", str(tmp_path / "ours"), "--append-eod", *flags]) == 0
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"ours_text_document{suffix}").read_bytes() == (tmp_path / f"theirs{suffix}").read_bytes()


@pytest.mark.parametrize("include_special_tokens", [True, False], ids=["with special tokens", "without"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_the_files_are_megatron_cores_byte_for_byte(name, include_special_tokens, tmp_path):
    folder = build_tokenizer_folder(tmp_path / name, name)
    megatron_core_writes(tmp_path / "theirs", documents(), tokenizer_type="HuggingFaceTokenizer",
                         tokenizer_model=str(folder), tokenizer_hf_include_special_tokens=include_special_tokens)
    special = "--tokenizer-hf-include-special-tokens" if include_special_tokens else \
        "--tokenizer-hf-no-include-special-tokens"
    ours_equal_theirs(tmp_path, documents(), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                      str(folder), special)


def test_null_tokenizer_files_are_megatron_cores_byte_for_byte(tmp_path):
    """0.16.1's NullTokenizer: ids one space apart, the end of document --vocab-size (null_tokenizer.py)."""
    texts = [" ".join(str((i * 7 + j) % 300) for j in range(length)) for i, length in enumerate([1, 9, 40, 2])]
    megatron_core_writes(tmp_path / "theirs", texts, tokenizer_type="NullTokenizer", vocab_size=300)
    ours_equal_theirs(tmp_path, texts, "--tokenizer-type", "NullTokenizer", "--vocab-size", "300")
