"""Every tokenizer ends documents with its own end-of-document token, not GPT-2's `<|endoftext|>`: Llama 2's and
Mistral's `</s>`, Llama 3's `<|end_of_text|>`, Gemma's `<eos>`; preprocessing writes what Megatron-LM's
tools/preprocess_data.py writes with the same tokenizer, and a run trains on it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import pretrain_gpt
from data import DataError
from data.indexed import IndexedDataset, IndexedDatasetWriter, best_dtype
from data.tokenizer import load_named_tokenizer, load_tokenizer
from tests.data.hf_tokenizer_shapes import SHAPES, build_tokenizer_folder

REPO_ROOT = Path(__file__).resolve().parents[2]
WORDS = "the quick brown fox jumps over the lazy dog pack my box with five dozen liquor jugs".split()


def documents() -> list[str]:
    """Documents of 1 to ~400 words, with punctuation, newlines and characters outside ASCII."""
    texts = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(length))
             for i, length in enumerate([1, 2, 5, 13, 40, 120, 400, 3, 77])]
    return texts + ["Über café — 東京 🎉!", "def f(x):\n    return x * 2\n", "  leading spaces\n\nand a blank line"]


def write_corpus(path: Path) -> Path:
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents()), encoding="utf-8")
    return path


def preprocess_as_a_user_types_it(tmp_path: Path, folder: Path, *extra: str) -> Path:
    prefix = tmp_path / "out"
    command = [sys.executable, "-m", "data.preprocess", "--input", str(write_corpus(tmp_path / "corpus.jsonl")),
               "--output-prefix", str(prefix), "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
               str(folder), "--append-eod", "--workers", "1", *extra]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return Path(f"{prefix}_text_document")


@pytest.mark.slow  # a preprocessing process per tokenizer shape, as a user runs it
@pytest.mark.parametrize("name", list(SHAPES))
def test_preprocessing_ends_every_document_with_the_tokenizers_own_eos(name, tmp_path):
    """Megatron-LM's Encoder.encode (tools/preprocess_data.py @ 00736f4c, lines 86-108) writes
    `tokenizer.tokenize(text)` and, with --append-eod, `tokenizer.eod`; its HuggingFaceTokenizer's are
    `AutoTokenizer(text).input_ids` and `eos_token_id` (megatron/training/tokenizer/tokenizer.py @ core_v0.16.1,
    lines 170-171 and 189-190), its dtype `optimal_dtype(len(tokenizer))` (line 154). The expected files are written
    from transformers' own ids by our writer, byte-compatible with Megatron-Core's (tests/data/test_indexed.py)."""
    from transformers import AutoTokenizer

    folder = build_tokenizer_folder(tmp_path / name, name)
    theirs = AutoTokenizer.from_pretrained(str(folder))
    eos_id = theirs.eos_token_id
    assert theirs.convert_ids_to_tokens(eos_id) == SHAPES[name].eos
    prefix = preprocess_as_a_user_types_it(tmp_path, folder)
    dataset = IndexedDataset(str(prefix))
    written = [dataset.get_document(d).tolist() for d in range(dataset.num_documents)]
    assert len(written) == len(documents()) and all(ids[-1] == eos_id for ids in written)
    assert sorted({len(ids) for ids in written})[-1] > 100 * sorted({len(ids) for ids in written})[0]
    with IndexedDatasetWriter(str(tmp_path / "expected"), best_dtype(len(theirs))) as writer:
        for text in documents():
            writer.add_document(theirs(text).input_ids + [eos_id])
    for suffix in (".bin", ".idx"):
        assert Path(f"{prefix}{suffix}").read_bytes() == (tmp_path / f"expected{suffix}").read_bytes(), suffix


@pytest.mark.slow
def test_without_the_special_tokens_a_llama_document_has_no_bos(tmp_path):
    """--tokenizer-hf-no-include-special-tokens: Megatron-Core's HuggingFaceTokenizer.text_to_ids then converts
    `tokenizer.tokenize(text)` (megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py, text_to_ids)."""
    folder = build_tokenizer_folder(tmp_path / "llama2", "llama2")
    tokenizer = load_tokenizer(tokenizer_file=str(folder))
    prefix = preprocess_as_a_user_types_it(tmp_path, folder, "--tokenizer-hf-no-include-special-tokens")
    dataset = IndexedDataset(str(prefix))
    assert [dataset.get_document(d).tolist() for d in range(dataset.num_documents)] == \
        [ids + [tokenizer.eod_id] for ids in tokenizer.encode_batch(documents())]


@pytest.mark.slow
def test_a_llama3_shaped_tokenizer_trains_two_iterations_on_its_own_data(tmp_path, capsys):
    from tests.arguments.test_tokenizer_types import TINY, train_records

    folder = build_tokenizer_folder(tmp_path / "llama3", "llama3")
    prefix = preprocess_as_a_user_types_it(tmp_path, folder)
    tokenizer = load_named_tokenizer("HuggingFaceTokenizer", str(folder), None, None)
    assert tokenizer.eod_id == tokenizer.backend.token_to_id("<|end_of_text|>") != tokenizer.backend.token_to_id(
        "<|endoftext|>")
    metrics = tmp_path / "m.jsonl"
    argv = TINY + ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(folder), "--data-path",
                   str(prefix), "--split", "100,0,0", "--reset-position-ids", "--eod-mask-loss", "--train-iters", "2",
                   "--metrics-file", str(metrics)]
    assert pretrain_gpt.main(argv) == 0, capsys.readouterr().err
    assert [record["iteration"] for record in train_records(metrics)] == [1, 2]


@pytest.mark.parametrize("files, eos", [
    ({"tokenizer_config.json": {"eos_token": "</s>"}, "special_tokens_map.json": {"eos_token": "<s>"}}, "<s>"),
    ({"tokenizer_config.json": {"eos_token": {"content": "</s>", "special": True}}}, "</s>"),
], ids=["special_tokens_map.json wins, as in transformers", "an AddedToken object"])
def test_the_declared_eos_token_is_read_as_transformers_reads_it(files, eos, tmp_path):
    folder = build_tokenizer_folder(tmp_path / "llama2", "llama2")
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))
    tokenizer = load_tokenizer(tokenizer_file=str(folder / "tokenizer.json"))
    assert tokenizer.eod_id == tokenizer.backend.token_to_id(eos)


def test_an_eos_token_outside_the_vocabulary_is_refused_in_one_line(tmp_path):
    folder = build_tokenizer_folder(tmp_path / "gemma", "gemma")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(DataError, match=r"eos_token '<\|im_end\|>' \(the end-of-document token\) is not in"):
        load_tokenizer(tokenizer_file=str(folder))


def test_a_folder_with_only_a_sentencepiece_model_names_the_types_that_read_it(tmp_path):
    """Older Llama 2 folders hold tokenizer.model and no tokenizer.json; transformers would convert it."""
    (tmp_path / "tokenizer.model").write_bytes(b"not read")
    with pytest.raises(DataError, match=r"holds no tokenizer\.json, only tokenizer\.model; give --tokenizer-type "
                                        r"Llama2Tokenizer"):
        load_named_tokenizer("HuggingFaceTokenizer", str(tmp_path), None, None)


def test_a_saved_copy_keeps_the_tokenizers_own_eos(tmp_path):
    """What a checkpoint's tokenizer/ holds (GPTTokenizer.save) reads back with the same end of document, and
    transformers reads the copy's eos as the original's."""
    from transformers import AutoTokenizer

    tokenizer = load_tokenizer(tokenizer_file=str(build_tokenizer_folder(tmp_path / "mistral", "mistral")))
    tokenizer.save(str(tmp_path / "copy"))
    assert load_tokenizer(tokenizer_file=str(tmp_path / "copy")).eod_id == tokenizer.eod_id
    assert AutoTokenizer.from_pretrained(str(tmp_path / "copy")).eos_token_id == tokenizer.eod_id
