"""Byte-level BPE: lossless round trips, EOD, training determinism, both file formats, transformers parity."""

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models

from data import DataError
from data.corpus import default_corpus_documents
from data.tokenizer import EOD_TOKEN, GPTTokenizer, load_tokenizer, train_tokenizer

VOCAB_SIZE = 1024
REPO_ROOT = Path(__file__).resolve().parents[2]

SAMPLES = [
    "Hello, world!",
    "  leading spaces and trailing  \n\n\ttabs\t",
    "def f(x):\n    return x ** 2  # squares\n",
    "naïve café — “quotes” …",
    "日本語のテキストと中文",
    "emoji 🎉👩‍👩‍👧 flags 🇺🇳 and combining e\u0301",
    "control \x00\x01\x7f and NBSP\u00a0here",
    f"two documents{EOD_TOKEN}joined by the EOD token",
    "",
]


@pytest.fixture(scope="module")
def documents():
    return default_corpus_documents()


@pytest.fixture(scope="module")
def tokenizer(documents):
    return train_tokenizer(documents, VOCAB_SIZE)


def random_unicode(rng: random.Random, length: int) -> str:
    """Code points from the whole range except surrogates (which UTF-8 cannot encode)."""
    chars = []
    while len(chars) < length:
        code_point = rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0, 0x110000)])
        if not 0xD800 <= code_point <= 0xDFFF:
            chars.append(chr(code_point))
    return "".join(chars)


def test_round_trip_is_lossless_on_any_unicode(tokenizer):
    rng = random.Random(0)
    texts = SAMPLES + [random_unicode(rng, rng.randrange(1, 200)) for _ in range(200)]
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert [tokenizer.decode(ids) for ids in tokenizer.encode_batch(texts)] == texts


def test_encode_batch_matches_encode(tokenizer):
    assert tokenizer.encode_batch(SAMPLES) == [tokenizer.encode(text) for text in SAMPLES]


def test_eod_is_one_special_token(tokenizer):
    assert tokenizer.eod_id == tokenizer.backend.token_to_id(EOD_TOKEN)
    assert tokenizer.encode(EOD_TOKEN) == [tokenizer.eod_id]
    assert tokenizer.encode(f"a{EOD_TOKEN}b").count(tokenizer.eod_id) == 1
    assert tokenizer.decode([tokenizer.eod_id]) == EOD_TOKEN
    # Nothing is added around the text: EOD placement is the caller's choice.
    assert tokenizer.eod_id not in tokenizer.encode("plain text")


def test_vocab_size_counts_every_id(tokenizer, documents):
    assert tokenizer.vocab_size == VOCAB_SIZE
    assert tokenizer.vocab_size == len(tokenizer.backend.get_vocab(with_added_tokens=True))
    ids = [i for ids in tokenizer.encode_batch(documents[:50]) for i in ids]
    assert 0 <= min(ids) and max(ids) < tokenizer.vocab_size


def test_training_learns_merges(tokenizer, documents):
    text = documents[100]
    # Pure bytes would give one token per byte; learned merges must compress English text a lot.
    assert len(tokenizer.encode(text)) < 0.5 * len(text.encode("utf-8"))


def test_small_corpus_gives_smaller_vocab_than_requested():
    small = train_tokenizer(["the cat sat on the mat"] * 3, vocab_size=5000)
    assert 257 <= small.vocab_size < 5000


@pytest.mark.slow
def test_training_is_deterministic_within_and_across_processes(tokenizer, documents):
    assert train_tokenizer(documents, VOCAB_SIZE).to_json() == tokenizer.to_json()
    # A fresh interpreter has a different hash seed (Python's and Rust's): the vocab must not depend on it.
    script = (
        "import hashlib; from data.corpus import default_corpus_documents; "
        "from data.tokenizer import train_tokenizer; "
        f"trained = train_tokenizer(default_corpus_documents(), {VOCAB_SIZE}); "
        "print(hashlib.sha256(trained.to_json().encode()).hexdigest())"
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert child.stdout.strip() == hashlib.sha256(tokenizer.to_json().encode()).hexdigest()


def test_vocab_size_below_byte_alphabet_is_rejected():
    with pytest.raises(DataError, match="vocab_size 100"):
        train_tokenizer(["text"], vocab_size=100)


def test_save_then_load_both_formats(tokenizer, tmp_path):
    tokenizer.save(str(tmp_path))
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (tmp_path / name).is_file()
    from_json = load_tokenizer(tokenizer_file=str(tmp_path / "tokenizer.json"))
    from_gpt2_files = load_tokenizer(vocab_file=str(tmp_path / "vocab.json"), merges_file=str(tmp_path / "merges.txt"))
    for loaded in (from_json, from_gpt2_files):
        assert loaded.vocab_size == tokenizer.vocab_size
        assert loaded.eod_id == tokenizer.eod_id
        assert loaded.encode_batch(SAMPLES) == tokenizer.encode_batch(SAMPLES)


def test_transformers_loads_saved_folder_with_same_ids(tokenizer, tmp_path):
    from transformers import GPT2TokenizerFast

    tokenizer.save(str(tmp_path / "full"))
    # Only the GPT-2 pair: what Megatron-era checkpoints ship; transformers must rebuild the same BPE.
    (tmp_path / "gpt2_files").mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(tmp_path / "full" / name, tmp_path / "gpt2_files" / name)
    rng = random.Random(1)
    texts = SAMPLES + [random_unicode(rng, 80) for _ in range(20)] + default_corpus_documents()[:20]
    for folder in ("full", "gpt2_files"):
        theirs = GPT2TokenizerFast.from_pretrained(str(tmp_path / folder))
        assert theirs.eos_token_id == tokenizer.eod_id
        assert len(theirs) == tokenizer.vocab_size
        for text in texts:
            assert theirs(text)["input_ids"] == tokenizer.encode(text), (folder, text)


def test_load_errors_name_the_flag_and_file(tmp_path):
    with pytest.raises(DataError, match=r"--tokenizer-file .*missing\.json: file not found"):
        load_tokenizer(tokenizer_file=str(tmp_path / "missing.json"))
    with pytest.raises(DataError, match="needs --merge-file"):
        load_tokenizer(vocab_file=str(tmp_path / "vocab.json"))
    with pytest.raises(DataError, match="needs --vocab-file"):
        load_tokenizer(merges_file=str(tmp_path / "merges.txt"))
    with pytest.raises(DataError, match="cannot be combined"):
        load_tokenizer(tokenizer_file="a.json", vocab_file="v.json", merges_file="m.txt")
    with pytest.raises(DataError, match="no tokenizer given"):
        load_tokenizer()

    not_json = tmp_path / "broken.json"
    not_json.write_text("{ not json")
    with pytest.raises(DataError, match=r"broken\.json: not a valid tokenizer\.json"):
        load_tokenizer(tokenizer_file=str(not_json))


def test_vocabularies_without_eod_are_rejected(tmp_path):
    no_eod = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")]))
    no_eod.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(DataError, match=r"tokenizer\.json: vocabulary has no '<\|endoftext\|>'"):
        load_tokenizer(tokenizer_file=str(tmp_path / "tokenizer.json"))

    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    with pytest.raises(DataError, match=r"--vocab-file .*vocab\.json: vocabulary has no"):
        load_tokenizer(vocab_file=str(tmp_path / "vocab.json"), merges_file=str(tmp_path / "merges.txt"))
    with pytest.raises(DataError, match="no '<\\|endoftext\\|>' token"):
        GPTTokenizer(no_eod)
