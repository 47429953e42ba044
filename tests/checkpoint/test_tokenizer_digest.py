"""A checkpoint records its tokenizer's digest (data/tokenizer.py tokenizer_digest), and a resume with another
tokenizer, even one of the same vocabulary size (which every shape check passes), is one line naming both
(checkpoint/tokenizer_check.py); a checkpoint saved before the digest still resumes, without a word."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from base.errors import ConfigError
from checkpoint.tokenizer_check import SavedTokenizer, check_resume_tokenizer
from data.tokenizer import NullTokenizer, load_tokenizer, tokenizer_digest
from tests.reliability_helpers import train


def tokenizer_with_two_ids_swapped(source: Path, target: Path) -> Path:
    """`source`'s tokenizer.json with two ordinary tokens' ids exchanged: the same size, other ids."""
    content = json.loads(source.read_text())
    vocab = content["model"]["vocab"]
    first, second = sorted(vocab, key=vocab.get)[300:302]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    target.write_text(json.dumps(content))
    return target


def test_a_resume_with_another_tokenizer_is_one_line_naming_both(embedded_corpus, tmp_path):
    cache, corpus = embedded_corpus
    ours = Path(corpus.tokenizer_dir) / "tokenizer.json"
    other = tokenizer_with_two_ids_swapped(ours, tmp_path / "other.json")
    assert load_tokenizer(tokenizer_file=str(other)).vocab_size == load_tokenizer(tokenizer_file=str(ours)).vocab_size
    save = tmp_path / "ck"
    common = ["--mock-data", "--lr-decay-iters", "4"]
    first = train(cache, tmp_path, *common, "--tokenizer-file", ours, "--save", save)
    assert first.code == 0, first.err[-2000:]
    metadata_file = save / "iter_0000002" / "metadata.json"
    metadata = json.loads(metadata_file.read_text())
    assert metadata["tokenizer_digest"] == tokenizer_digest(load_tokenizer(tokenizer_file=str(ours)))
    assert metadata["tokenizer_vocab_size"] == 512

    refused = train(cache, tmp_path, *common, "--tokenizer-file", other, "--load", save, "--train-iters", "4")
    line = refused.one_error_line(f"--tokenizer-file {other}", f"the checkpoint's --tokenizer-file {ours}",
                                  "--override-data-on-resume")
    assert metadata["tokenizer_digest"][:19] in line and tokenizer_digest(
        load_tokenizer(tokenizer_file=str(other)))[:19] in line

    # a checkpoint saved before the digest: resumed as before, without a word about the tokenizer
    del metadata["tokenizer_digest"]
    metadata_file.write_text(json.dumps(metadata))
    resumed = train(cache, tmp_path, *common, "--tokenizer-file", other, "--load", save, "--train-iters", "4")
    assert resumed.code == 0 and "tokenizer" not in resumed.err, resumed.err[-2000:]


def run_config(override: bool, **data) -> SimpleNamespace:
    named = {"tokenizer_type": None, "tokenizer_file": None, "vocab_file": None, "merge_file": None,
             "tokenizer_vocab_size": 4096} | data
    return SimpleNamespace(data=SimpleNamespace(**named),
                           checkpoint=SimpleNamespace(override_data_on_resume=override))


def test_override_data_on_resume_turns_the_refusal_into_a_note_and_the_same_tokenizer_passes(tmp_path):
    saved = SavedTokenizer(tokenizer_digest(NullTokenizer(100)), None, "--tokenizer-type NullTokenizer", tmp_path)
    config = run_config(False, tokenizer_type="NullTokenizer")
    assert check_resume_tokenizer(saved, config, NullTokenizer(100)) is None
    assert check_resume_tokenizer(None, config, NullTokenizer(101)) is None
    with pytest.raises(ConfigError, match="this run's tokenizer --tokenizer-type NullTokenizer"):
        check_resume_tokenizer(saved, config, NullTokenizer(101))
    note = check_resume_tokenizer(saved, run_config(True, tokenizer_type="NullTokenizer"), NullTokenizer(101))
    assert note.startswith("> note: resuming") and "--override-data-on-resume allows" in note
    # another size: left to the load's vocabulary line, which names both sizes (tests/checkpoint/
    # test_vocabulary_resume.py)
    sized = SavedTokenizer(saved.digest, 101, saved.named, tmp_path)
    assert check_resume_tokenizer(sized, config, NullTokenizer(150)) is None
