"""Fixtures every test folder shares.

The embedded corpus with its trained tokenizer takes seconds to prepare (tokenizer training is the
slow part), and the distributed and end-to-end tests of many modules train on the same one, so it is
prepared once per session. Tests only read it, and runs write their dataset index caches beside it
under names keyed by their settings, so sharing it changes no test's data.
"""

from __future__ import annotations

import pytest


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
