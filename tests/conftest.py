"""Fixtures every test folder shares.

The embedded corpus with its trained tokenizer takes seconds to prepare (tokenizer training is the
slow part), and the distributed and end-to-end tests of many modules train on the same one, so it is
prepared once per session. Tests only read it, and runs write their dataset index caches beside it
under names keyed by their settings, so sharing it changes no test's data.
"""

from __future__ import annotations

import os

import pytest

SMOKE_MARK = "smoke"
_COMPILED = "_zero_gpt_compiled_caches"


def pytest_configure(config):
    """The repository's bytecode compiled once, before any worker or test starts an interpreter (tests/bytecode.py);
    by the controlling process only, so pytest-xdist's workers find it done."""
    if not hasattr(config, "workerinput"):
        from tests.bytecode import compile_repository
        from tests.readme import ROOT

        setattr(config, _COMPILED, compile_repository(ROOT))


def pytest_unconfigure(config):
    from tests.bytecode import remove

    remove(getattr(config, _COMPILED, []))


def pytest_ignore_collect(collection_path, config):
    """`pytest -m smoke` (the smoke tier, docs/testing.md) imports only the test files that mention the mark:
    collecting the whole suite to deselect all but a few tests took most of its minute."""
    if config.getoption("markexpr", "") != SMOKE_MARK or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return SMOKE_MARK not in collection_path.read_text(errors="replace") or None


@pytest.fixture(autouse=True, scope="session")
def one_intra_op_thread():
    """Every test's models are tiny, so PyTorch's intra-op threads only contend on the 2-core CI
    machine: its default of one thread a core made an 8-iteration run of tests/checkpoint's model
    take 2.5-12 s of CPU against 0.6 s on one thread (measured back to back on the loaded machine).
    The test process runs on one thread, as its distributed children already do (tests/distributed.py),
    and so do the processes tests start (OMP_NUM_THREADS, which torch reads at start-up; torchrun and
    scripts/launch.py set it to 1 too); a value the caller set is kept. No test reads the count."""
    import torch

    if "OMP_NUM_THREADS" in os.environ:  # torch read it at import: the caller's choice stands
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(threads)
    del os.environ["OMP_NUM_THREADS"]


@pytest.fixture(scope="session")
def embedded_corpus(tmp_path_factory):
    """The embedded corpus prepared with a 512-token vocabulary: (cache directory, PreparedCorpus)."""
    from data.corpus import prepare_default_corpus

    cache = str(tmp_path_factory.mktemp("embedded-corpus-512"))
    return cache, prepare_default_corpus(cache, 512)


@pytest.fixture(scope="session")
def corpus_cache(embedded_corpus):
    """The cache directory to pass as --data-cache-dir (holds the prepared corpus and tokenizer)."""
    return embedded_corpus[0]


@pytest.fixture(scope="session")
def corpus_cache_300(tmp_path_factory):
    """A --data-cache-dir holding the embedded corpus prepared with a 300-token vocabulary, for the tests
    that launch with --tokenizer-vocab-size 300: one tokenizer trained per session instead of one per
    test (the corpus is keyed by vocabulary size, so a launch finds it and trains none)."""
    from data.corpus import prepare_default_corpus

    cache = str(tmp_path_factory.mktemp("embedded-corpus-300"))
    prepare_default_corpus(cache, 300)
    return cache


@pytest.fixture(scope="session")
def single_process_reference(tmp_path_factory, corpus_cache) -> tuple:
    """The training losses of tests/zero/test_zero_training.py's model on one process (its COMMON flags, global batch
    8, micro batch 2): the reference that ZeRO's stages, the overlapped gather, stage 3's checkpointing and the
    compiled blocks are held to, trained once per worker instead of once per module (a tuple: no test changes it)."""
    from tests.zero.test_zero_training import single_process_losses

    return tuple(single_process_losses(tmp_path_factory.mktemp("single-process"), corpus_cache))


@pytest.fixture(scope="session")
def installed_clone(tmp_path_factory):
    """The bin/ of a throwaway virtualenv with this clone installed as the README installs it (tests/user_folder.py):
    the docs' commands run with its python from a user's folder, once a worker (about 2.5 s)."""
    from tests.user_folder import install

    return install(tmp_path_factory.mktemp("user-venv") / "venv")


def train_sentencepiece_model(path, documents, vocab_size: int = 512, **options) -> None:
    """A small SentencePiece model trained as Llama-2's was (BPE with byte fallback, digits split, no
    normalisation, unk 0 / bos 1 / eos 2 / no pad; `options` change any of these), written to `path`;
    under a second on the embedded corpus."""
    import sentencepiece

    settings = dict(model_type="bpe", byte_fallback=True, split_digits=True, normalization_rule_name="identity",
                    remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2,
                    pad_id=-1)
    with open(path, "wb") as model:
        sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(documents), model_writer=model,
                                                 vocab_size=vocab_size, num_threads=1, minloglevel=2,
                                                 **{**settings, **options})


@pytest.fixture(scope="session")
def sentencepiece_model(tmp_path_factory) -> str:
    """A Llama-2-style SentencePiece tokenizer.model of 512 pieces trained on the embedded corpus's text."""
    from data.corpus import default_corpus_documents
    from data.sentencepiece_tokenizer import SENTENCEPIECE_MODEL_FILE

    path = str(tmp_path_factory.mktemp("sentencepiece") / SENTENCEPIECE_MODEL_FILE)
    train_sentencepiece_model(path, default_corpus_documents())
    return path


@pytest.fixture(scope="session")
def sentencepiece_corpus(tmp_path_factory, sentencepiece_model):
    """The embedded corpus tokenized with that model as Megatron-DeepSpeed's GPTSentencePieceTokenizer does
    (a PreparedCorpus whose tokenizer_dir holds the tokenizer.model)."""
    from data.corpus import prepare_default_corpus
    from data.sentencepiece_tokenizer import GPT_SENTENCEPIECE, load_sentencepiece_tokenizer

    cache = str(tmp_path_factory.mktemp("embedded-corpus-sentencepiece"))
    return prepare_default_corpus(cache, 512, tokenizer=load_sentencepiece_tokenizer(GPT_SENTENCEPIECE,
                                                                                     sentencepiece_model))
