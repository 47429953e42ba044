"""`python -m data.preprocess` takes Megatron-LM's tools/preprocess_data.py command lines as written: its tokenizer
types, --partitions' document order, and its other flags implemented, said to change nothing, or refused in one
line."""

import gzip
import importlib.util
import json
import re
from pathlib import Path

import pytest

from data.indexed import IndexedDataset
from data.preprocess import main
from tests.data.hf_tokenizer_shapes import build_tokenizer_folder

TEXTS = [f"document {i} " + "word " * (i * 3 % 17) for i in range(11)]


def corpus(tmp_path: Path, texts=TEXTS) -> str:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    return str(path)


def written(prefix: Path) -> list[list[int]]:
    dataset = IndexedDataset(f"{prefix}_text_document")
    return [dataset.get_document(d).tolist() for d in range(dataset.num_documents)]


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    return build_tokenizer_folder(tmp_path_factory.mktemp("gpt2"), "gpt2")


def run(tmp_path: Path, name: str, *flags: str, texts=TEXTS) -> list[list[int]]:
    assert main(["--input", corpus(tmp_path, texts), "--output-prefix", str(tmp_path / name), *flags]) == 0
    return written(tmp_path / name)


def test_gpt2_bpe_tokenizer_type_writes_what_the_tokenizer_json_writes(tmp_path, gpt2_folder):
    """Megatron's GPT2BPETokenizer reads --vocab-file and --merge-file and ends documents with `<|endoftext|>`
    (megatron/training/tokenizer/tokenizer.py @ core_v0.16.1, lines 346 and 360-361)."""
    build_tokenizer_folder(tmp_path / "files", "gpt2")
    from data.tokenizer import load_tokenizer

    load_tokenizer(tokenizer_file=str(tmp_path / "files")).save(str(tmp_path / "files"))  # adds vocab.json, merges
    by_type = run(tmp_path, "typed", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                  str(tmp_path / "files" / "vocab.json"), "--merge-file", str(tmp_path / "files" / "merges.txt"),
                  "--append-eod")
    assert by_type == run(tmp_path, "file", "--tokenizer-file", str(gpt2_folder / "tokenizer.json"), "--append-eod")
    assert all(ids[-1] == 0 for ids in by_type)  # <|endoftext|> is the shape's first token


def test_null_tokenizer_reads_ids_and_ends_documents_with_vocab_size(tmp_path, capsys):
    """Megatron's NullTokenizer: tokenize is `[int(x) for x in text.split(' ')]`, eod is --vocab-size
    (megatron/training/tokenizer/tokenizer.py @ core_v0.16.1, lines 817-820)."""
    texts = ["3 1 4 1 5", "9", "2 6 5 3 5 8 9 7"]
    assert run(tmp_path, "null", "--tokenizer-type", "NullTokenizer", "--vocab-size", "10", "--append-eod",
               texts=texts) == [[3, 1, 4, 1, 5, 10], [9, 10], [2, 6, 5, 3, 5, 8, 9, 7, 10]]
    capsys.readouterr()
    for bad, words in [("3 12", "token id 12 is outside 0..9"), ("3  4", "token ids one space apart")]:
        code = main(["--input", corpus(tmp_path, [bad]), "--output-prefix", str(tmp_path / "bad"), "--tokenizer-type",
                     "NullTokenizer", "--vocab-size", "10"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and words in err, err


def test_partitions_write_megatrons_order(tmp_path, gpt2_folder):
    """tools/preprocess_data.py main (@ 00736f4c): with --partitions N, line i goes to partition i % N
    (`index = (index + 1) % args.partitions`) and the partitions' datasets are merged in order (`add_index`);
    with --keep-sequential-samples each partition is a run of consecutive lines, so the order is kept."""
    tokenizer = ["--tokenizer-file", str(gpt2_folder / "tokenizer.json"), "--append-eod"]
    plain = run(tmp_path, "plain", *tokenizer)
    assert run(tmp_path, "three", *tokenizer, "--partitions", "3", "--workers", "3") == \
        [plain[i] for p in range(3) for i in range(p, len(plain), 3)]
    assert run(tmp_path, "kept", *tokenizer, "--partitions", "2", "--workers", "2", "--keep-sequential-samples") == \
        plain


def test_a_quoted_input_pattern_reads_its_files_in_sorted_order(tmp_path, gpt2_folder):
    """Megatron's tool takes --input as a pattern with --partitions (`glob.glob(args.input)`), in the file system's
    order; here the files are sorted."""
    tokenizer = ["--tokenizer-file", str(gpt2_folder / "tokenizer.json")]
    (tmp_path / "shards").mkdir()
    for index, half in enumerate((TEXTS[:5], TEXTS[5:])):
        (tmp_path / "shards" / f"part-{index}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in half))
    assert main(["--input", str(tmp_path / "shards" / "part-*.jsonl"), "--output-prefix", str(tmp_path / "globbed"),
                 *tokenizer]) == 0
    assert written(tmp_path / "globbed") == run(tmp_path, "whole", *tokenizer)


def test_gzipped_jsonl_reads_as_the_plain_file(tmp_path, gpt2_folder, capsys):
    """Megatron's tool opens `.gz` inputs with gzip.open (main, with --partitions)."""
    tokenizer = ["--tokenizer-file", str(gpt2_folder / "tokenizer.json")]
    with gzip.open(tmp_path / "corpus.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps({"text": text}) + "\n" for text in TEXTS))
    assert main(["--input", str(tmp_path / "corpus.jsonl.gz"), "--output-prefix", str(tmp_path / "gz"),
                 *tokenizer]) == 0
    assert written(tmp_path / "gz") == run(tmp_path, "plain", *tokenizer)
    (tmp_path / "broken.jsonl.gz").write_bytes(b"not gzip")
    capsys.readouterr()
    assert main(["--input", str(tmp_path / "broken.jsonl.gz"), "--output-prefix", str(tmp_path / "b"), *tokenizer]) == 2
    assert "broken.jsonl.gz: not a readable gzip file" in capsys.readouterr().err


@pytest.mark.parametrize("flags, words", [
    (["--split-sentences"], "--split-sentences: Megatron splits sentences with nltk's punkt model, and nltk is "
                            "not installed here"),
    (["--tokenizer-type", "TikTokenizer", "--tokenizer-model", "t.json"], "tiktoken library, not installed"),
    (["--tokenizer-type", "Llama3Tokenizer", "--tokenizer-model", "t.model"], "tiktoken library, not installed"),
    (["--tokenizer-type", "BertWordPieceCase", "--vocab-file", "v.txt"], "does not pretrain a GPT"),
    (["--tokenizer-type", "NullTokenizer"], "NullTokenizer needs --vocab-size"),
    (["--tokenizer-type", "HuggingFaceTokenizer"], "--tokenizer-type and --tokenizer-model go together"),
    (["--partitions", "2", "--workers", "3"], "--workers 3 a multiple of it"),
    (["--find-optimal-num-workers"], "--find-optimal-num-workers: not implemented"),
])
def test_what_cannot_be_done_is_refused_in_one_line(flags, words, tmp_path, gpt2_folder, capsys):
    if flags == ["--split-sentences"] and importlib.util.find_spec("nltk") is not None:
        words = "--split-sentences: not implemented: Megatron's *_sentence datasets (for BERT) are not written here"
    if "--tokenizer-type" not in flags:
        flags = [*flags, "--tokenizer-file", str(gpt2_folder / "tokenizer.json")]
    code = main(["--input", corpus(tmp_path), "--output-prefix", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not list(tmp_path.glob("out*"))


def test_flags_that_change_nothing_are_said_once_and_change_nothing(tmp_path, gpt2_folder, capsys):
    tokenizer = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(gpt2_folder), "--append-eod"]
    plain = run(tmp_path, "plain", *tokenizer)
    capsys.readouterr()
    megatrons = ["--keep-newlines", "--lang", "german", "--vocab-extra-ids", "100", "--trust-remote-code",
                 "--legacy-tokenizer", "--tokenizer-hf-include-special-tokens", "--log-interval", "1000"]
    assert run(tmp_path, "megatrons", *tokenizer, *megatrons) == plain
    said = [line for line in capsys.readouterr().err.splitlines() if "has no effect here" in line]
    assert [re.match(r"preprocess: (--[\w-]+)", line).group(1) for line in said] == \
        ["--vocab-extra-ids", "--legacy-tokenizer", "--trust-remote-code", "--keep-newlines", "--lang"]
