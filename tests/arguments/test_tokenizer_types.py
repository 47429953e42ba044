"""Megatron's --tokenizer-type, --tokenizer-model and --vocab-size; --tokenizer-file with the embedded
corpus (it used to be ignored without --data-path)."""

import json
import math
import os

import numpy as np
import pytest

import pretrain_gpt
from arguments.config import ConfigError
from arguments.parser import parse_arguments, parse_config
from checkpoint.format import read_metadata, resolve_checkpoint
from data.corpus import default_corpus_documents
from data.indexed import IndexedDataset, IndexedDatasetWriter, best_dtype
from data.tokenizer import NullTokenizer, train_tokenizer
from planner.launch import launch_vocab

TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--max-position-embeddings", "16", "--micro-batch-size", "4", "--global-batch-size", "4", "--device", "cpu",
        "--log-interval", "1", "--eval-iters", "1", "--eval-interval", "100", "--lr-warmup-iters", "0"]
NULL_VOCAB = 200  # ids 0..199 in the data, 200 is the end-of-document id: a 201-token vocabulary


def launch_vocab_of(config):
    return launch_vocab(config.checkpoint, config.data, config.model, config.sources)


def write_pretokenized(prefix, documents=80, high=NULL_VOCAB, seed=0):
    """Data tokenized elsewhere, in Megatron-Core's MMIDIDX format (our writer writes it byte for byte),
    each document ending with NullTokenizer's end-of-document id, `high`."""
    rng = np.random.default_rng(seed)
    with IndexedDatasetWriter(str(prefix), best_dtype(high + 1)) as writer:
        for _ in range(documents):
            tokens = rng.integers(0, high, size=int(rng.integers(20, 60)))
            writer.add_document(np.append(tokens, high))
    return str(prefix)


def train_records(path):
    return [r for r in map(json.loads, path.read_text().splitlines()) if "split" not in r]


def test_null_tokenizer_trains_on_data_tokenized_elsewhere_and_resumes(tmp_path):
    prefix = write_pretokenized(tmp_path / "pretokenized_text_document")
    assert IndexedDataset(prefix).dtype == np.uint16
    metrics, save = tmp_path / "m.jsonl", tmp_path / "ck"
    argv = TINY + ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(NULL_VOCAB), "--data-path", prefix,
                   "--split", "90,10,0", "--metrics-file", str(metrics), "--save", str(save)]
    assert pretrain_gpt.main(argv + ["--train-iters", "3"]) == 0
    first = train_records(metrics)
    # Untrained, the model's loss is near that of a uniform guess over the 201 real ids.
    assert math.isclose(first[0]["loss"], math.log(NULL_VOCAB + 1), rel_tol=0.1)
    metadata = read_metadata(resolve_checkpoint(save))
    assert metadata["config"]["model"]["vocab_size"] == NULL_VOCAB + 1 and metadata["tokenizer"] is None
    assert pretrain_gpt.main(argv + ["--train-iters", "5", "--override-opt_param-scheduler", "--load", str(save)]) == 0
    assert [r["iteration"] for r in train_records(metrics)] == [1, 2, 3, 4, 5]


def test_null_tokenizer_refuses_an_id_past_its_vocabulary(tmp_path, capsys):
    prefix = write_pretokenized(tmp_path / "wide_text_document", high=NULL_VOCAB + 5)
    code = pretrain_gpt.main(TINY + ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(NULL_VOCAB),
                                     "--data-path", prefix, "--train-iters", "1",
                                     "--metrics-file", str(tmp_path / "m.jsonl")])
    assert code == 2
    assert f"outside the tokenizer's vocabulary [0, {NULL_VOCAB + 1})" in capsys.readouterr().err


def test_a_null_tokenizer_launch_of_the_newest_generation_names_the_other_reading_of_vocab_size():
    """Megatron-LM's NullTokenizer read --vocab-size N as N ids plus an end-of-document id N up to core_v0.17
    (megatron/training/tokenizer/tokenizer.py _NullTokenizer, and megatron/core/tokenizers/.../null_tokenizer.py
    @ core_v0.16.1), as data/tokenizer.py does; from core_v0.18.0 on (null_tokenizer.py @ d98e8a64: `self._eod_id =
    vocab_size - 1`, vocab_size as given) as N ids, the last ending a document. A launch of that generation is
    told so in one start-up line with the flag that gives that model here."""
    argv = [*TINY, "--tokenizer-type", "NullTokenizer", "--vocab-size", "1000", "--data-path", "x"]
    parsed = parse_arguments(argv)
    assert parsed.megatron_generation == "megatron-lm"
    line = next(note for note in parsed.notes if "NullTokenizer" in note)
    assert "ids 0-999 and the end-of-document id 1000" in line and "from core_v0.18.0 on it reads 1000 ids" in line
    assert "as Megatron-LM up to core_v0.17 reads it (the flags do not tell the release)" in line
    assert line.endswith("pass --vocab-size 999")
    # a --load is told that a checkpoint of core_v0.18 on gives its own reading (checkpoint/null_tokenizer_reading.py)
    loading = next(note for note in parse_arguments([*argv, "--load", "ckpt"]).notes if "NullTokenizer" in note)
    assert loading.startswith(line) and loading.endswith("a --load takes the reading of the release that wrote its "
                                                         "checkpoint where the checkpoint says it (core_v0.18 on)")
    offered = NullTokenizer(999)  # the line's remedy is the newer reading: 1000 ids, the last (999) ending a document
    assert (offered.vocab_size, offered.eod_id) == (1000, 999)
    # --legacy-tokenizer, which core_v0.18 removed, makes the launch core_v0.15.0's: read as here, no line
    older = parse_arguments([*argv, "--legacy-tokenizer"])
    assert older.megatron_generation == "megatron-lm-core_v0.15.0"
    assert not [note for note in older.notes if "NullTokenizer --vocab-size" in note]


@pytest.mark.parametrize("argv, words", [
    (["--tokenizer-type", "NullTokenizer", "--data-path", "x"], "--tokenizer-type NullTokenizer needs --vocab-size"),
    (["--tokenizer-type", "NullTokenizer", "--vocab-size", "10"], "NullTokenizer needs --data-path"),
    (["--tokenizer-type", "NullTokenizer", "--vocab-size", "10", "--data-path", "x", "--tokenizer-file", "t.json"],
     "NullTokenizer reads token ids as they are: drop --tokenizer-file"),
    (["--tokenizer-type", "GPT2BPETokenizer"], "GPT2BPETokenizer needs --vocab-file and --merge-file"),
    (["--tokenizer-type", "HuggingFaceTokenizer"], "HuggingFaceTokenizer needs --tokenizer-model"),
    (["--tokenizer-type", "TikTokenizer"], "--tokenizer-type TikTokenizer: a tiktoken model is not read here"),
    (["--tokenizer-type", "GPTSentencePieceTokenizer"], "GPTSentencePieceTokenizer needs --tokenizer-model"),
    (["--tokenizer-type", "WordLevel"], "invalid choice"),
    (["--data-path", "x"], "or --tokenizer-type NullTokenizer with --vocab-size"),
])
def test_tokenizer_flags_that_cannot_work_are_refused(argv, words):
    with pytest.raises(ConfigError, match=words):
        parse_config(argv)


def test_vocab_size_below_the_embedded_corpus_tokenizer_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """Without a tokenizer named, --vocab-size is the model's vocabulary (a preset's: llama3-8b's) and the corpus's
    BPE (--tokenizer-vocab-size 4096 here) must fit in it."""
    monkeypatch.setattr("training.prepare.build_data", lambda *args: pytest.fail("data work started"))
    assert pretrain_gpt.main(TINY + ["--vocab-size", "300", "--metrics-file", str(tmp_path / "m.jsonl")]) == 2
    assert "--vocab-size 300 is smaller than the embedded corpus's tokenizer (--tokenizer-vocab-size 4096)" in \
        capsys.readouterr().err


@pytest.fixture(scope="module")
def own_tokenizer(tmp_path_factory):
    """A tokenizer a user has (trained elsewhere), saved as tokenizer.json + GPT-2's vocab/merges."""
    directory = tmp_path_factory.mktemp("own-tokenizer")
    train_tokenizer(default_corpus_documents()[::3], 400).save(str(directory))
    return directory


@pytest.mark.parametrize("flags", [
    lambda d: ["--tokenizer-file", str(d / "tokenizer.json")],
    lambda d: ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(d)],
    lambda d: ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(d / "vocab.json"),
               "--merge-file", str(d / "merges.txt")],
], ids=["tokenizer-file", "HuggingFaceTokenizer folder", "GPT2BPETokenizer"])
def test_a_named_tokenizer_tokenizes_the_embedded_corpus(own_tokenizer, flags, tmp_path):
    """Before: --tokenizer-file without --data-path was ignored and a tokenizer was trained instead."""
    cache = tmp_path / "cache"
    assert pretrain_gpt.main(TINY + flags(own_tokenizer) + ["--train-iters", "1", "--data-cache-dir", str(cache),
                                                            "--metrics-file", str(tmp_path / "m.jsonl")]) == 0
    built = [name for name in os.listdir(cache) if name.startswith("pydoc-topics-")]
    assert len(built) == 1 and built[0].startswith("pydoc-topics-tok")  # keyed by the tokenizer, not trained
    theirs = json.loads((own_tokenizer / "tokenizer.json").read_text())["model"]["vocab"]
    ours = json.loads((cache / built[0] / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    assert ours == theirs


def test_the_planner_plans_the_runs_vocabulary(own_tokenizer):
    assert launch_vocab_of(parse_config(["--tokenizer-type", "NullTokenizer", "--vocab-size", "1000",
                                      "--data-path", "x"]))[0] == 1001
    assert launch_vocab_of(parse_config(["--vocab-size", "5000"]))[0] == 5000  # the model's; the corpus's BPE in it
    assert launch_vocab_of(parse_config(["--tokenizer-file", str(own_tokenizer / "tokenizer.json")]))[0] == 400
    assert launch_vocab_of(parse_config(["--config", "llama3-8b", "--tokenizer-file",
                                      str(own_tokenizer / "tokenizer.json")]))[0] == 400  # a named tokenizer wins
    assert launch_vocab_of(parse_config([]))[0] == 4096  # the embedded corpus's BPE, as pretrain_gpt.py trains


def test_the_planner_plans_a_sentencepiece_vocabulary(sentencepiece_model):
    """Before: the .model was read as a tokenizer.json and refused."""
    assert launch_vocab_of(parse_config(["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model",
                                        sentencepiece_model]))[0] == 512 + 5  # Megatron's special pieces


@pytest.mark.parametrize("tokenizer_type", ["GPTSentencePieceTokenizer", "Llama2Tokenizer", "SentencePieceTokenizer"])
def test_sentencepiece_types_are_taken_with_their_model(tokenizer_type, sentencepiece_model):
    """Before: each was refused ("a SentencePiece or tiktoken model is not read here")."""
    config = parse_config(["--tokenizer-type", tokenizer_type, "--tokenizer-model", sentencepiece_model])
    assert (config.data.tokenizer_type, config.data.tokenizer_file) == (tokenizer_type, sentencepiece_model)


def test_a_sentencepiece_model_tokenizes_the_embedded_corpus_and_trains(sentencepiece_model, tmp_path, capsys):
    """Megatron-LM's SentencePieceTokenizer: its 517 ids (512 pieces and Megatron's five special pieces)
    padded to 640 as Megatron pads any tokenizer's (--make-vocab-size-divisible-by 128 x TP 1)."""
    metrics, save = tmp_path / "m.jsonl", tmp_path / "ck"
    argv = TINY + ["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", sentencepiece_model,
                   "--train-iters", "1", "--data-cache-dir", str(tmp_path / "cache"), "--metrics-file", str(metrics),
                   "--save", str(save)]
    assert pretrain_gpt.main(argv) == 0, capsys.readouterr().err
    assert [r["iteration"] for r in train_records(metrics)] == [1]
    assert "vocab 517 padded to 640" in capsys.readouterr().out
    assert read_metadata(resolve_checkpoint(save))["config"]["model"]["vocab_size"] == 517


@pytest.mark.parametrize("content", [None, b"not a SentencePiece model"], ids=["missing", "unreadable"])
def test_a_missing_or_unreadable_sentencepiece_model_is_refused_in_one_line(content, tmp_path, capsys):
    model = tmp_path / "tokenizer.model"
    if content is not None:
        model.write_bytes(content)
    code = pretrain_gpt.main(TINY + ["--tokenizer-type", "GPTSentencePieceTokenizer", "--tokenizer-model", str(model),
                                     "--train-iters", "1", "--metrics-file", str(tmp_path / "m.jsonl")])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and f"--tokenizer-model {model}" in lines[0], lines
