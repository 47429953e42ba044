"""--fim-data: our FIM samples equal Megatron-LM's GPTFIMDataset run on the same tokens with the same RandomState.

Megatron's code below is copied from Megatron-LM megatron/training/datasets/fim_dataset.py (GPTFIMDataset:
the tail of _query_document_sample_shuffle_indices after the read, _fim_split_and_permute_sequence,
_fim_permute_sequence, _permute) and megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py
(HuggingFaceTokenizer.tokens_to_ids, text_to_ids, ids_to_text), run over transformers' fast tokenizer
wrapping the same tokenizers.Tokenizer ours uses.
"""

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from data.fim import FIMConfig, FIMDataset, FIMTokenizer, FIMTransform, sample_rng
from data.tokenizer import EOD_TOKEN, GPTTokenizer, _byte_level_pipeline

FIM_TOKENS = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]
DOCS = ["def add(a, b):\n    return a + b\n", "<file>x = 1\n<file>y = 2\n<file>print(x + y)\n",
        "# skip me: not permuted\nz = 3\n", "class A:\n    pass\n"]


def _backend(with_fim_tokens=True):
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    merges = [("d", "e"), ("de", "f"), ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("r", "e"), ("Ġ", "b")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    vocab[EOD_TOKEN] = len(vocab)
    tokenizer = _byte_level_pipeline(models.BPE(vocab, merges))
    tokenizer.add_special_tokens([EOD_TOKEN, "<file>"] + (FIM_TOKENS if with_fim_tokens else []))
    return tokenizer


class MegatronHF:
    """megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py, HuggingFaceTokenizer (include_special_tokens
    False: text_to_ids = tokens_to_ids(text_to_tokens))."""

    def __init__(self, backend: Tokenizer, specials):
        self.tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token=EOD_TOKEN, eos_token=EOD_TOKEN,
                                                 additional_special_tokens=specials)

    def tokens_to_ids(self, tokens):
        return self.tokenizer.convert_tokens_to_ids(tokens)

    def text_to_ids(self, text):
        return self.tokens_to_ids(self.tokenizer.tokenize(text))

    def ids_to_text(self, ids, remove_special_tokens=None):
        tokens = self.tokenizer.convert_ids_to_tokens([int(i) for i in ids])
        tokens = [t for t in tokens if t is not None and t not in self.tokenizer.all_special_tokens]
        return self.tokenizer.convert_tokens_to_string(tokens)


class MegatronFIM:
    """GPTFIMDataset's permutation, copied (the read and the shuffle left out)."""

    def __init__(self, tok, seed_array, rate, spm_rate, split_sample=None, fragment_rate=None, no_prefix=None):
        class Cfg:
            _tokenizer = tok
        self.tokenizer = Cfg
        self.np_rng = np.random.RandomState(seed=seed_array)
        self.fim_rate, self.fim_spm_rate, self.fragment_fim_rate = rate, spm_rate, fragment_rate
        self.no_fim_prefix = no_prefix
        if split_sample:
            ids = tok.tokens_to_ids(split_sample)
            self.fim_split_sample = ids if isinstance(ids, int) else ids[0]
        else:
            self.fim_split_sample = None
        (self.prefix_tok_id, self.middle_tok_id, self.suffix_tok_id, self.pad_tok_id,
         self.eod_tok_id) = tok.tokens_to_ids(FIM_TOKENS + [EOD_TOKEN])

    def sample(self, sample):
        sample_len = sample.shape[0]
        segment_breaks = np.argwhere(sample == self.eod_tok_id)
        if segment_breaks.shape != (0, 1):
            curr_start_position = 0
            new_samples = []
            for loc in np.nditer(segment_breaks):
                if loc - curr_start_position > 0:
                    permuted = self._fim_split_and_permute_sequence(sample[curr_start_position:loc])
                    new_samples += [permuted, [self.eod_tok_id]]
                curr_start_position = loc + 1
            permuted = self._fim_split_and_permute_sequence(sample[curr_start_position:])
            new_samples.append(permuted)
            sample = np.concatenate(new_samples)
        else:
            sample = self._fim_split_and_permute_sequence(sample)
        diff = sample.shape[0] - sample_len
        if diff > 0:
            sample = sample[:sample_len]
        elif diff < 0:
            sample = np.concatenate([sample, np.full((-1 * diff), self.pad_tok_id)])
        return np.array(sample, dtype=np.int64)

    def _fim_permute_sequence(self, sequence, rate):
        return self._permute(sequence, rate, self.fim_spm_rate, self.tokenizer, truncate_or_pad=False,
                             suffix_tok_id=self.suffix_tok_id, prefix_tok_id=self.prefix_tok_id,
                             middle_tok_id=self.middle_tok_id, pad_tok_id=self.pad_tok_id,
                             no_fim_prefix=self.no_fim_prefix)

    def _fim_split_and_permute_sequence(self, sequence):
        if self.fim_split_sample is None:
            return self._fim_permute_sequence(sequence, self.fim_rate)
        fragment_breaks = np.argwhere(sequence == self.fim_split_sample)
        if fragment_breaks.shape == (0, 1):
            return self._fim_permute_sequence(sequence, self.fim_rate)
        if not self.np_rng.binomial(1, self.fim_rate):
            return sequence
        curr_start_position = 0
        new_samples = []
        for loc in np.nditer(fragment_breaks):
            if loc - curr_start_position > 0:
                permuted = self._fim_permute_sequence(sequence[curr_start_position:loc], self.fragment_fim_rate)
                new_samples += [permuted, [self.fim_split_sample]]
            curr_start_position = loc + 1
        permuted = self._fim_permute_sequence(sequence[curr_start_position:], self.fragment_fim_rate)
        new_samples.append(permuted)
        return np.concatenate(new_samples)

    def _permute(self, sample, fim_rate, fim_spm_rate, tokenizer, truncate_or_pad=True, suffix_tok_id=None,
                 prefix_tok_id=None, middle_tok_id=None, pad_tok_id=None, no_fim_prefix=None):
        if self.np_rng.binomial(1, fim_rate):
            contents = tokenizer._tokenizer.ids_to_text(sample, remove_special_tokens=True)
            if no_fim_prefix is not None and contents.startswith(no_fim_prefix):
                return sample
            boundaries = list(self.np_rng.randint(low=0, high=len(contents) + 1, size=2))
            boundaries.sort()
            prefix = contents[: boundaries[0]]
            middle = contents[boundaries[0]: boundaries[1]]
            suffix = contents[boundaries[1]:]
            prefix = np.array([*tokenizer._tokenizer.text_to_ids(prefix)], dtype=np.int64)
            middle = np.array([*tokenizer._tokenizer.text_to_ids(middle)], dtype=np.int64)
            suffix = np.array([*tokenizer._tokenizer.text_to_ids(suffix)], dtype=np.int64)
            if self.np_rng.binomial(1, fim_spm_rate):
                new_sample = np.concatenate([[prefix_tok_id, suffix_tok_id], suffix, [middle_tok_id], prefix, middle])
            else:
                new_sample = np.concatenate([[prefix_tok_id], prefix, [suffix_tok_id], suffix, [middle_tok_id], middle])
        else:
            new_sample = sample
        return new_sample


def _samples(tokenizer, count, length):
    """Windows of `length` tokens over the documents joined by EOD, starting at several offsets."""
    stream = []
    for doc in DOCS * 3:
        stream += tokenizer.encode(doc) + [tokenizer.eod_id]
    stream = np.array(stream, dtype=np.int64)
    return [stream[(7 * k) % (len(stream) - length):][:length] for k in range(count)]


@pytest.mark.parametrize("options", [
    dict(rate=1.0, spm_rate=1.0),  # every piece SPM
    dict(rate=1.0, spm_rate=1e-12),  # every piece PSM (Megatron refuses --fim-spm-rate 0)
    dict(rate=0.5, spm_rate=0.5),  # Megatron's defaults, as the functional tests run
    dict(rate=0.9, spm_rate=0.5, split_sample="<file>", fragment_rate=0.7),  # fragments
    dict(rate=1.0, spm_rate=0.5, no_prefix="# skip me"),  # no-prefix
], ids=["spm", "psm", "defaults", "split-sample", "no-prefix"])
def test_fim_samples_equal_megatron(options):
    backend = _backend()
    ours = GPTTokenizer(backend)
    transform = FIMTransform(FIMConfig(**options), FIMTokenizer(ours))
    megatron_tok = MegatronHF(backend, FIM_TOKENS + ["<file>"])
    permuted = 0
    for index, sample in enumerate(_samples(ours, 24, 40)):
        expected = MegatronFIM(megatron_tok, [1234, index], **options).sample(sample.copy())
        got = transform(sample.copy(), sample_rng(1234, index))
        np.testing.assert_array_equal(got, expected)
        assert got.shape == sample.shape
        permuted += not np.array_equal(got, sample)
    assert permuted > 0  # the comparison saw permuted samples, not only untouched ones
    if "no_prefix" in options:
        skipped = [s for s in _samples(ours, 24, 40) if ours.decode(s).startswith("# skip me")]
        assert skipped  # the piece before the first end-of-document is left as it is; rate 1 permutes the rest
        for s in skipped:
            first = int(np.flatnonzero(s == ours.eod_id)[0])
            got = transform(s.copy(), sample_rng(1, 0))
            assert np.array_equal(got[: first + 1], s[: first + 1]) and not np.array_equal(got, s)


def test_fim_formats_psm_and_spm_written_out():
    """One piece of text, both orders, against the layout in GPTFIMDataset._permute."""
    ours = GPTTokenizer(_backend())
    fim = FIMTokenizer(ours)
    p, m, s = (fim.token_to_id(t) for t in ("<fim_prefix>", "<fim_middle>", "<fim_suffix>"))
    sample = np.array(ours.encode("abcdefgh"), dtype=np.int64)
    for spm in (1.0, 1e-12):
        transform = FIMTransform(FIMConfig(rate=1.0, spm_rate=spm), fim)
        rng = sample_rng(5, 3)
        got = transform(sample.copy(), rng)
        draw = np.random.RandomState([5, 3])
        assert draw.binomial(1, 1.0) == 1
        lo, hi = sorted(draw.randint(0, 9, size=2))
        pre, mid, suf = (np.array(ours.encode(t), dtype=np.int64) for t in ("abcdefgh"[:lo], "abcdefgh"[lo:hi],
                                                                           "abcdefgh"[hi:]))
        if draw.binomial(1, spm):
            want = np.concatenate([[p, s], suf, [m], pre, mid])
        else:
            want = np.concatenate([[p], pre, [s], suf, [m], mid])
        np.testing.assert_array_equal(got, want[: sample.size])


def test_missing_fim_tokens_are_the_unknown_token_as_in_megatron_gpt2():
    """GPT-2's vocabulary has no <fim_*> tokens: transformers' convert_tokens_to_ids gives the unknown token,
    which for GPT-2 is <|endoftext|> (what Megatron's GPT2BPETokenizer runs, the functional tests', get)."""
    backend = _backend(with_fim_tokens=False)
    ours = GPTTokenizer(backend)
    megatron_tok = MegatronHF(backend, [])
    fim = FIMTokenizer(ours)
    assert [fim.token_to_id(t) for t in FIM_TOKENS] == megatron_tok.tokens_to_ids(FIM_TOKENS) == [ours.eod_id] * 4


def test_fim_dataset_sample_depends_only_on_index():
    """Resume and data-loader workers read the same sample for an index: its RandomState is (seed, index)."""
    ours = GPTTokenizer(_backend())
    base = [{"tokens": torch.from_numpy(s)} for s in _samples(ours, 6, 40)]
    dataset = FIMDataset(base, FIMTransform(FIMConfig(rate=1.0, spm_rate=0.5), FIMTokenizer(ours)), seed=7)
    forward = [dataset[i]["tokens"] for i in range(6)]
    backward = [dataset[i]["tokens"] for i in reversed(range(6))][::-1]
    for a, b in zip(forward, backward):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b["tokens"]) for a, b in zip(forward, base))


@pytest.mark.parametrize(("argv", "words"), [
    (["--fim-data", "--mock-data"], "--fim-data with --mock-data"),
    (["--fim-data", "--fim-spm-rate", "0"], "--fim-data needs --fim-rate and --fim-spm-rate above 0"),
    (["--fim-data", "--fim-rate", "0"], "--fim-data needs --fim-rate and --fim-spm-rate above 0"),
    (["--fim-data", "--fim-split-sample", "<file>"], "--fim-split-sample needs --fim-fragment-rate"),
])
def test_what_megatron_asserts_is_refused_in_one_line(argv, words):
    """Megatron-LM megatron/training/arguments.py validate_args: `if args.fim_data: assert not args.mock_data;
    assert args.fim_rate; assert args.fim_spm_rate` (a --fim-split-sample without --fim-fragment-rate fails in
    GPTFIMDataset._permute's binomial(1, None))."""
    from arguments.config import ConfigError
    from arguments.parser import parse_config

    with pytest.raises(ConfigError, match=words) as error:
        parse_config(argv + ["--tokenizer-type", "NullTokenizer", "--vocab-size", "512"]
                     if "--mock-data" in argv else argv)
    assert "\n" not in str(error.value)


def test_a_tokenizer_that_cannot_detokenize_is_refused_in_one_line():
    from data import DataError
    from data.tokenizer import NullTokenizer

    with pytest.raises(DataError, match="--fim-data needs a byte-level BPE tokenizer"):
        FIMTokenizer(NullTokenizer(100))


@pytest.mark.slow
def test_fim_training_batches_are_permuted_and_a_resume_reads_the_same_samples(corpus_cache):
    """Through the run's loaders (training/data_splits.py build_data): --fim-data changes the train batches (same
    shape), and the loader a resume builds at 4 consumed samples gives what the first run's loader gave after
    its first 4 samples: each sample's FIM draws come from (--seed, sample index), not from how far a stream ran."""
    from arguments.parser import parse_config
    from parallel.state import virtual_state
    from training.data_splits import build_data, load_tokenizer_and_data_sources
    from training.run_settings import resolve_run_settings

    def batches(extra, consumed):
        config = parse_config(["--tokenizer-vocab-size", "512", "--data-cache-dir", corpus_cache, "--seq-length", "64",
                               "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size",
                               "2", "--train-iters", "6", "--eval-iters", "0"] + extra)
        tokenizer, data_path = load_tokenizer_and_data_sources(config.data, config.model)
        settings = resolve_run_settings(config, tokenizer.vocab_size, 1, 1, "cpu")
        loader = build_data(settings, virtual_state(1), data_path, tokenizer).make_train_loader(consumed)
        return [batch["tokens"] for batch in loader]

    plain = batches([], 0)
    fim = batches(["--fim-data", "--fim-rate", "1.0"], 0)
    resumed = batches(["--fim-data", "--fim-rate", "1.0"], 4)
    assert len(fim) == len(plain) == 6 and all(a.shape == b.shape for a, b in zip(fim, plain))
    assert all(not torch.equal(a, b) for a, b in zip(fim, plain))
    assert len(resumed) == 4 and all(torch.equal(a, b) for a, b in zip(resumed, fim[2:]))
