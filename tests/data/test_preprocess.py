"""`python -m data.preprocess`: every input format round-trips, output is worker-count independent, errors exit 2."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from data.corpus import default_corpus_documents
from data.indexed import IndexedDataset, best_dtype
from data.preprocess import main
from data.tokenizer import EOD_TOKEN, load_tokenizer, train_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]

DOCUMENTS = [
    "The first document.",
    "Second — with ünïcode 🎉\nand two lines",
    "  third, with a blank line\n\ninside and leading spaces",
    'code: print("hi")\n\tindented\n',
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(default_corpus_documents(), 1024).save(str(directory))
    return directory


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return load_tokenizer(tokenizer_file=str(tokenizer_dir / "tokenizer.json"))


@pytest.fixture
def tokenizer_args(tokenizer_dir):
    return ["--tokenizer-file", str(tokenizer_dir / "tokenizer.json")]


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


def decoded_documents(prefix: Path, tokenizer) -> list[str]:
    dataset = IndexedDataset(str(prefix))
    assert dataset.dtype == best_dtype(tokenizer.vocab_size)
    assert dataset.num_documents == len(dataset)  # one sequence per document
    return [tokenizer.decode(dataset.get_document(d).tolist()) for d in range(dataset.num_documents)]


def test_jsonl_round_trips(tmp_path, tokenizer, tokenizer_args, capsys):
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"id": i, "text": text} for i, text in enumerate(DOCUMENTS)])
    assert main(["--input", str(source), "--output-prefix", str(tmp_path / "out"), *tokenizer_args]) == 0
    assert decoded_documents(tmp_path / "out_text_document", tokenizer) == DOCUMENTS
    summary = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{len(DOCUMENTS)} documents (0 empty skipped)" in summary
    assert "tokens" in summary and "MB" in summary and "docs/s" in summary


def test_text_files_one_document_each_in_sorted_order(tmp_path, tokenizer, tokenizer_args):
    corpus = tmp_path / "texts"
    (corpus / "nested").mkdir(parents=True)
    (corpus / "b.txt").write_text(DOCUMENTS[1], encoding="utf-8")
    (corpus / "a.txt").write_text(DOCUMENTS[0], encoding="utf-8")
    (corpus / "nested" / "c.txt").write_text(DOCUMENTS[2], encoding="utf-8")
    (corpus / "README.md").write_text("not a corpus file under --input-format auto")
    assert main(["--input", str(corpus), "--output-prefix", str(tmp_path / "out"), *tokenizer_args]) == 0
    assert decoded_documents(tmp_path / "out_text_document", tokenizer) == DOCUMENTS[:3]


@pytest.mark.parametrize(
    "separator, expected",
    [
        ("blank-line", ["one\nstill one", "two", "  three"]),
        ("\\n---\\n", ["one\nstill one\n\ntwo\n\n\n  three", "four\n"]),
    ],
)
def test_text_document_separator(tmp_path, tokenizer, tokenizer_args, separator, expected):
    source = tmp_path / "paragraphs.txt"
    if separator == "blank-line":
        source.write_text("one\nstill one\n\ntwo\n \n\n  three\n")
    else:
        source.write_text("one\nstill one\n\ntwo\n\n\n  three\n---\nfour\n")
    argv = ["--input", str(source), "--output-prefix", str(tmp_path / "out"), "--text-document-separator", separator]
    assert main(argv + tokenizer_args) == 0
    assert decoded_documents(tmp_path / "out_text_document", tokenizer) == expected


def test_parquet_round_trips(tmp_path, tokenizer, tokenizer_args):
    import pyarrow as pa
    import pyarrow.parquet as pq

    many = DOCUMENTS * 700  # several row groups and read batches
    table = pa.table({"text": many, "id": list(range(len(many)))})
    pq.write_table(table, tmp_path / "corpus.parquet", row_group_size=1000)
    argv = ["--input", str(tmp_path / "corpus.parquet"), "--output-prefix", str(tmp_path / "out")]
    assert main(argv + tokenizer_args) == 0
    assert decoded_documents(tmp_path / "out_text_document", tokenizer) == many


def test_saved_hf_dataset_round_trips(tmp_path, tokenizer, tokenizer_args):
    import datasets

    dataset = datasets.Dataset.from_dict({"text": DOCUMENTS, "id": list(range(len(DOCUMENTS)))})
    dataset.save_to_disk(str(tmp_path / "hf"))
    assert main(["--input", str(tmp_path / "hf"), "--output-prefix", str(tmp_path / "out"), *tokenizer_args]) == 0
    assert decoded_documents(tmp_path / "out_text_document", tokenizer) == DOCUMENTS


def test_dataset_dict_asks_for_one_split(tmp_path, tokenizer_args, capsys):
    import datasets

    splits = {name: datasets.Dataset.from_dict({"text": DOCUMENTS}) for name in ("train", "test")}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "hf"))
    assert main(["--input", str(tmp_path / "hf"), "--output-prefix", str(tmp_path / "out"), *tokenizer_args]) == 2
    assert "several splits (train, test)" in capsys.readouterr().err


def test_several_json_keys_give_one_output_each(tmp_path, tokenizer, tokenizer_args):
    records = [{"title": f"title {i}", "text": text} for i, text in enumerate(DOCUMENTS)]
    source = write_jsonl(tmp_path / "corpus.json", records)
    argv = ["--input", str(source), "--output-prefix", str(tmp_path / "out"), "--json-keys", "text", "title"]
    assert main(argv + tokenizer_args) == 0
    assert decoded_documents(tmp_path / "out_text_document", tokenizer) == DOCUMENTS
    assert decoded_documents(tmp_path / "out_title_document", tokenizer) == [r["title"] for r in records]


def test_append_eod_ends_every_document(tmp_path, tokenizer, tokenizer_args):
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": text} for text in DOCUMENTS])
    for flags, name in (([], "plain"), (["--append-eod"], "eod")):
        assert main(["--input", str(source), "--output-prefix", str(tmp_path / name), *flags, *tokenizer_args]) == 0
    plain = IndexedDataset(str(tmp_path / "plain_text_document"))
    with_eod = IndexedDataset(str(tmp_path / "eod_text_document"))
    for d in range(len(DOCUMENTS)):
        assert tokenizer.eod_id not in plain.get_document(d).tolist()
        assert with_eod.get_document(d).tolist() == plain.get_document(d).tolist() + [tokenizer.eod_id]
    assert decoded_documents(tmp_path / "eod_text_document", tokenizer) == [t + EOD_TOKEN for t in DOCUMENTS]


@pytest.mark.slow
def test_output_is_identical_for_any_worker_count(tmp_path, tokenizer_args, capsys):
    # 600 documents make three batches, so the two workers really do interleave.
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": text} for text in default_corpus_documents()[:600]])
    for workers in (1, 2):
        argv = ["--input", str(source), "--output-prefix", str(tmp_path / f"w{workers}"), "--append-eod",
                "--workers", str(workers), "--log-interval", "200"]
        assert main(argv + tokenizer_args) == 0
    for extension in (".bin", ".idx"):
        one = (tmp_path / f"w1_text_document{extension}").read_bytes()
        assert one == (tmp_path / f"w2_text_document{extension}").read_bytes()
    assert len(IndexedDataset(str(tmp_path / "w2_text_document"))) == 600
    # stderr is not a terminal here, so progress comes as lines every --log-interval documents.
    assert "preprocess: 200 documents" in capsys.readouterr().err


def test_a_progress_line_every_log_interval_documents_with_its_rates(tmp_path, tokenizer_args, capsys):
    """Issue 94 item 6c: as Megatron-LM's tools/preprocess_data.py, a line every --log-interval documents (before,
    only where a batch of 256 ended)."""
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": f"document number {i}"} for i in range(25)])
    assert main(["--input", str(source), "--output-prefix", str(tmp_path / "out"), "--log-interval", "10",
                 *tokenizer_args]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines()
             if re.fullmatch(r"preprocess: \d+ documents, [\d.]+ MB \([\d,]+ docs/s, [\d.]+ MB/s\)", line)]
    assert [int(line.split()[1]) for line in lines] == [10, 20]


def test_gpt2_vocab_and_merges_give_same_output_as_tokenizer_json(tmp_path, tokenizer_dir, tokenizer_args):
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": text} for text in DOCUMENTS])
    gpt2_args = ["--vocab-file", str(tokenizer_dir / "vocab.json"), "--merge-file", str(tokenizer_dir / "merges.txt")]
    for name, args in (("json", tokenizer_args), ("gpt2", gpt2_args)):
        assert main(["--input", str(source), "--output-prefix", str(tmp_path / name), "--append-eod", *args]) == 0
    assert (tmp_path / "json_text_document.bin").read_bytes() == (tmp_path / "gpt2_text_document.bin").read_bytes()


def test_train_tokenizer_on_the_input(tmp_path):
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": text} for text in default_corpus_documents()[:100]])
    argv = ["--input", str(source), "--output-prefix", str(tmp_path / "out"), "--train-tokenizer-vocab-size", "500"]
    assert main(argv) == 0
    trained = load_tokenizer(tokenizer_file=str(tmp_path / "out_tokenizer" / "tokenizer.json"))
    assert trained.vocab_size == 500
    assert decoded_documents(tmp_path / "out_text_document", trained) == default_corpus_documents()[:100]


def test_empty_documents_are_skipped_and_counted(tmp_path, tokenizer, tokenizer_args, capsys):
    records = [{"text": "kept"}, {"text": ""}, {"text": " \n\t"}, {"text": "also kept"}]
    source = write_jsonl(tmp_path / "corpus.jsonl", records)
    assert main(["--input", str(source), "--output-prefix", str(tmp_path / "out"), *tokenizer_args]) == 0
    assert decoded_documents(tmp_path / "out_text_document", tokenizer) == ["kept", "also kept"]
    assert "2 documents (2 empty skipped)" in capsys.readouterr().err


@pytest.mark.slow
def test_script_wrapper_runs_as_a_program_with_workers(tmp_path, tokenizer, tokenizer_args):
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": text} for text in DOCUMENTS])
    argv = ["--input", str(source), "--output-prefix", str(tmp_path / "out"), "--workers", "2", *tokenizer_args]
    # From another directory: the wrapper must find the repo's packages by itself.
    done = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "tools" / "preprocess_data.py"), *argv],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert decoded_documents(tmp_path / "out_text_document", tokenizer) == DOCUMENTS


def error_cases(tmp_path: Path, tokenizer_args: list[str]):
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "fine"}])
    missing_key = tmp_path / "missing_key.jsonl"
    missing_key.write_text('{"text": "a"}\n{"text": "b"}\n{"body": "c"}\n')
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "a"}\n{"text": \n')
    not_text = write_jsonl(tmp_path / "number.jsonl", [{"text": 3}])
    all_empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}, {"text": "  "}])
    unknown = tmp_path / "corpus.csv"
    unknown.write_text("text\nhello\n")
    empty_dir = tmp_path / "empty_dir"
    empty_dir.mkdir()
    text_file = tmp_path / "doc.txt"
    text_file.write_text("hello")
    return [
        ([str(tmp_path / "absent.jsonl")], tokenizer_args, r"--input .*absent\.jsonl: no such file"),
        ([str(unknown)], tokenizer_args, r"corpus\.csv: cannot tell the format from extension '\.csv'"),
        ([str(empty_dir)], tokenizer_args, r"empty_dir: directory holds no input files"),
        ([str(missing_key)], tokenizer_args, r"missing_key\.jsonl:3: missing key 'text'"),
        ([str(bad_json)], tokenizer_args, r"bad\.jsonl:2: not valid JSON"),
        ([str(not_text)], tokenizer_args, r"number\.jsonl:1: key 'text' holds int, not text"),
        ([str(all_empty)], tokenizer_args, r"no non-empty documents for key 'text'"),
        ([str(good)], [], r"choose exactly one tokenizer"),
        ([str(good)], tokenizer_args + ["--train-tokenizer-vocab-size", "500"], r"choose exactly one tokenizer"),
        ([str(good)], ["--vocab-file", str(tmp_path / "vocab.json")], r"--vocab-file .* needs --merge-file"),
        ([str(good)], tokenizer_args + ["--workers", "0"], r"--workers 0: need at least 1"),
        ([str(text_file)], tokenizer_args + ["--json-keys", "a", "b"], r"doc\.txt: plain text has no keys"),
        ([str(text_file)], tokenizer_args + ["--text-document-separator", "\\q"], r"unknown escape '\\q'"),
        ([str(good)], tokenizer_args + ["--input-format", "hf"], r"--input-format hf expects a directory"),
    ]


def test_bad_input_exits_2_with_a_message_and_writes_nothing(tmp_path, tokenizer_args, capsys):
    cases = error_cases(tmp_path, tokenizer_args)
    for index, (inputs, extra, message) in enumerate(cases):
        prefix = tmp_path / "outputs" / f"case{index}"
        assert main(["--input", *inputs, "--output-prefix", str(prefix), *extra]) == 2, message
        err = capsys.readouterr().err
        assert err.startswith("python -m data.preprocess: error: ") and err.count("\n") == 1, err
        assert re.search(message, err), (message, err)
    leftovers = os.listdir(tmp_path / "outputs") if (tmp_path / "outputs").exists() else []
    assert leftovers == []  # no dataset, and no temporary file, from any failed run


def test_unknown_input_format_is_an_argument_error(tmp_path, tokenizer_args, capsys):
    code = main(["--input", "x", "--input-format", "csv", "--output-prefix", str(tmp_path / "out"), *tokenizer_args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "invalid choice: 'csv'" in err, err


def test_a_sentencepiece_model_writes_what_megatrons_tool_writes(tmp_path, sentencepiece_model, capsys):
    """Megatron-DeepSpeed's tools/preprocess_data.py (f4157bea, lines 93-98) writes `tokenizer.tokenize(text)`
    then, with --append-eod, `tokenizer.eod`; Megatron-LM's Llama2Tokenizer's tokenize puts the bos id first
    and its eod is the eos id (megatron/training/tokenizer/tokenizer.py at 6cf285b2, lines 597-605, 622-624).
    Two workers: the model reaches them as the tokenizer's JSON."""
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_model)
    source = write_jsonl(tmp_path / "corpus.jsonl", [{"text": text} for text in DOCUMENTS])
    sentencepiece_args = ["--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", sentencepiece_model]
    assert main(["--input", str(source), "--output-prefix", str(tmp_path / "out"), "--append-eod", "--workers", "2",
                 *sentencepiece_args]) == 0
    dataset = IndexedDataset(str(tmp_path / "out_text_document"))
    assert [dataset.get_document(d).tolist() for d in range(len(DOCUMENTS))] == \
        [[processor.bos_id(), *processor.encode(text), processor.eos_id()] for text in DOCUMENTS]
    capsys.readouterr()
    assert main(["--input", str(source), "--output-prefix", str(tmp_path / "alone"), *sentencepiece_args[:2]]) == 2
    assert "--tokenizer-type and --tokenizer-model go together" in capsys.readouterr().err
