"""A resume into another vocabulary is refused in one line, in either direction and in every format that says what
its vocabulary was (issue 90 item 2). Before, a checkpoint of a bigger vocabulary resumed into a smaller run, ours and
torch_dist alike: the rows past the run's size, real tokens of the checkpoint's vocabulary, were dropped as if they
were padding. Megatron-Core's load refuses any vocabulary change (its global shape check); padding that another TP
size changes is not one (checkpoint/global_load.py vocabulary_problem).

- ours: the metadata records each vocabulary tensor's real rows;
- torch_dist (Megatron-LM's own save, tests/fixtures/megatron_tp1, written by its pretrain_gpt.py): its args size a
  NullTokenizer vocabulary (--vocab-size 127: 128 ids), and its rows are padded to a multiple of
  --make-vocab-size-divisible-by x its TP size (32 there)."""

from __future__ import annotations

import shutil

import pytest

from tests.checkpoint.test_megatron_checkpoint import FIXTURES, data_workdir, our_flags
from tests.reliability_helpers import run_main, train

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size", "1",
         "--tokenizer-type", "NullTokenizer", "--mock-data", "--make-vocab-size-divisible-by", "8",
         "--lr-decay-iters", "10"]


@pytest.mark.slow
def test_our_checkpoint_resumes_only_into_its_own_vocabulary(tmp_path, corpus_cache):
    save = tmp_path / "save"
    (tmp_path / "first").mkdir()
    assert train(corpus_cache, tmp_path / "first", *SMALL, "--vocab-size", "200", "--train-iters", "2",
                 "--save", save).code == 0
    for vocabulary, said in (("150", "the checkpoint's vocabulary has 201 tokens, this run's 151"),
                             ("198", "the checkpoint's vocabulary has 201 tokens, this run's 199")):  # same padding
        (tmp_path / vocabulary).mkdir()
        outcome = train(corpus_cache, tmp_path / vocabulary, *SMALL, "--vocab-size", vocabulary, "--train-iters", "4",
                        "--load", save)
        assert outcome.code == 2 and said in outcome.err and "Traceback" not in outcome.err, outcome.err[-2000:]
    (tmp_path / "same").mkdir()
    assert train(corpus_cache, tmp_path / "same", *SMALL, "--vocab-size", "200", "--train-iters", "4",
                 "--load", save).code == 0


@pytest.mark.parametrize("vocabulary, said", [
    ("95", "the checkpoint's vocabulary has 128 tokens, this run's 96"),
    ("100", "the checkpoint's vocabulary has 128 tokens, this run's 101"),  # padded to 128 as well
])
def test_megatron_lms_own_save_resumes_only_into_its_own_vocabulary(tmp_path, monkeypatch, vocabulary, said):
    import pretrain_gpt

    monkeypatch.chdir(data_workdir(tmp_path))
    save = tmp_path / "save"
    shutil.copytree(FIXTURES / "megatron_tp1", save)
    flags = our_flags("megatron_tp1")
    at = flags.index("--vocab-size")
    flags[at + 1] = vocabulary
    at = flags.index("--data-path")  # its documents hold ids past the smaller vocabulary: Megatron's mock data
    flags[at:at + 2] = ["--mock-data", "--override-data-on-resume"]
    outcome = run_main(pretrain_gpt.main, [*flags, "--device", "cpu", "--load", str(save),
                                           "--metrics-file", str(tmp_path / "m.jsonl")])
    assert outcome.code == 2 and said in outcome.err and "Traceback" not in outcome.err, outcome.err[-2000:]
