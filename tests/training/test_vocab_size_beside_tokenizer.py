"""--vocab-size beside a real tokenizer is not read, as in Megatron-LM (issue 34/37).

NVIDIA/Megatron-LM megatron/core/tokenizers/utils/build_tokenizer.py (commit
779c5b748dbcf00ad9e36d539c576b404ab4abe9): build_tokenizer hands args.vocab_size to the tokenizer only in
its TikTokenizer branch (lines 63-64) and its NullTokenizer branch (lines 92-93); the HuggingFaceTokenizer
branch (lines 66-75) and the GPT2BPETokenizer one never read it, and _set_padded_vocab_size (lines 140-143)
pads tokenizer.vocab_size. megatron/training/argument_utils.py gpt_config_from_args (lines 463-468) reads
args.vocab_size only when no padded vocabulary was set, which a built tokenizer always sets. The same
repository's examples/llama/train_llama3_8b_h100_fp8.sh passes "--vocab-size 128256" beside
"--tokenizer-type HuggingFaceTokenizer" (its comment: "might be inferred ... or might need to be explicit")."""

import math

from arguments.parser import parse_arguments, parse_config
from tests.reliability_helpers import metrics_records, train
from training.late_checks import LATE_CHECKS
from training.run_settings import resolve_run_settings


def test_the_tokenizers_vocabulary_is_the_models_and_a_different_vocab_size_is_said_once(embedded_corpus):
    tokenizer_dir = embedded_corpus[1].tokenizer_dir
    config = parse_arguments(["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tokenizer_dir,
                              "--vocab-size", "128256"], late_checks=LATE_CHECKS).config
    settings = resolve_run_settings(config, 512, 1, 1, "cpu")
    assert settings.vocab_size == settings.config.model.vocab_size == 512
    assert settings.padded_vocab_size == 512  # 512 padded to a multiple of 128, never 128256's 128256
    assert [note for note in settings.notes if "--vocab-size" in note] == [
        "> --vocab-size 128256 is not read beside HuggingFaceTokenizer (as in Megatron-LM): the vocabulary is the "
        "tokenizer's 512 tokens"]
    same = resolve_run_settings(parse_config(["--vocab-file", "v.json", "--merge-file", "m.txt",
                                              "--vocab-size", "512"]), 512, 1, 1, "cpu")
    assert not [note for note in same.notes if "--vocab-size" in note]  # equal: nothing to say


def test_a_run_with_vocab_size_beside_its_tokenizer_trains_as_one_without(corpus_cache, embedded_corpus, tmp_path,
                                                                          capsys):
    tokenizer = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", embedded_corpus[1].tokenizer_dir,
                 "--train-iters", "2"]
    losses = []
    for name, extra in (("without", []), ("with", ["--vocab-size", "128256"])):
        (tmp_path / name).mkdir()
        outcome = train(corpus_cache, tmp_path / name, *tokenizer, *extra)
        assert outcome.code == 0, outcome.err[-3000:]
        losses.append([record["loss"] for record in metrics_records(tmp_path / name / "metrics.jsonl")
                       if "loss" in record])
    assert len(losses[0]) == 2 and all(math.isfinite(loss) for loss in losses[0])
    assert losses[1] == losses[0]
    assert "--vocab-size 128256 is not read beside HuggingFaceTokenizer" in outcome.out
