"""A run of 2 iterations continued to 4 reads, iteration for iteration, the samples the 4-iteration run reads: for
every dataloader type (single; cyclic with and without --no-data-sharding), also when the continuation runs at
another data-parallel size where the sampler allows it (single and unsharded cyclic: the global order does not
depend on the DP size; sharded cyclic gives each rank a bucket of DP-size-dependent width, Megatron-LM's design).

Checked through the run's own loaders (training/data_splits.py build_data, each DP rank's loader as a launch makes
it), comparing the tokens read: exact, and without a launch (tests/training/test_cyclic_resume.py has the real
2-rank continuation)."""

from __future__ import annotations

import itertools

import pytest

GLOBAL_BATCH, MICRO_BATCH, FIRST, LAST = 4, 1, 2, 4
TYPES = {"single": [], "cyclic": ["--dataloader-type", "cyclic"],
         "cyclic-unsharded": ["--dataloader-type", "cyclic", "--no-data-sharding"]}
DP_CHANGES = {"single": [(1, 1), (2, 2), (2, 1), (1, 2)], "cyclic": [(1, 1), (2, 2)],
              "cyclic-unsharded": [(1, 1), (2, 2), (2, 1), (1, 2)]}


def iterations_read(corpus_cache, extra: list[str], train_iters: int, dp: int, consumed_iterations: int,
                    count: int) -> list[list[tuple]]:
    """The samples (as token tuples, sorted) each of `count` iterations reads, all DP ranks together, from the
    loaders a run of `train_iters` iterations at DP size `dp` builds after `consumed_iterations`."""
    from arguments.parser import parse_config
    from parallel.state import virtual_state
    from training.data_splits import build_data, load_tokenizer_and_data_sources
    from training.run_settings import resolve_run_settings

    config = parse_config(["--tokenizer-vocab-size", "512", "--data-cache-dir", corpus_cache, "--seq-length", "16",
                           "--max-position-embeddings", "16", "--micro-batch-size", str(MICRO_BATCH),
                           "--global-batch-size", str(GLOBAL_BATCH), "--train-iters", str(train_iters),
                           "--eval-iters", "0"] + extra)
    tokenizer, sources = load_tokenizer_and_data_sources(config.data, config.model)
    settings = resolve_run_settings(config, tokenizer.vocab_size, 1, dp, "cpu")
    per_rank_step = GLOBAL_BATCH // (MICRO_BATCH * dp)
    reads = [[] for _ in range(count)]
    for rank in range(dp):
        data = build_data(settings, virtual_state(dp, rank=rank), sources, tokenizer)
        loader = iter(data.make_train_loader(consumed_iterations * GLOBAL_BATCH))
        for iteration in range(count):
            for batch in itertools.islice(loader, per_rank_step):
                reads[iteration] += [tuple(row.tolist()) for row in batch["tokens"]]
    return [sorted(samples) for samples in reads]


@pytest.mark.parametrize("kind,first_dp,then_dp",
                         [(kind, a, b) for kind, changes in DP_CHANGES.items() for a, b in changes])
def test_a_continued_run_reads_the_uninterrupted_runs_samples(corpus_cache, kind, first_dp, then_dp):
    extra = TYPES[kind]
    straight = iterations_read(corpus_cache, extra, LAST, then_dp, 0, LAST)
    first = iterations_read(corpus_cache, extra, FIRST, first_dp, 0, FIRST)
    continued = iterations_read(corpus_cache, extra, LAST, then_dp, FIRST, LAST - FIRST)
    assert all(len(samples) == GLOBAL_BATCH for samples in straight)
    assert len({sample for samples in straight for sample in samples}) == LAST * GLOBAL_BATCH  # each read once
    # the first run (at its DP size) read the uninterrupted run's first iterations, the continuation the rest
    assert first + continued == straight


@pytest.mark.parametrize("data", [[], ["--mock-data"]], ids=["corpus", "mock"])
def test_the_cyclic_training_split_is_one_epoch_whatever_the_run_asks(corpus_cache, data):
    """The cyclic sampler permutes its dataset's whole length: that length is one epoch of the split's data, not the
    run's sample count."""
    from arguments.parser import parse_config
    from parallel.state import virtual_state
    from training.data_splits import build_data, load_tokenizer_and_data_sources
    from training.run_settings import resolve_run_settings

    lines = []
    for train_iters in (2, 4):
        config = parse_config(["--tokenizer-vocab-size", "512", "--data-cache-dir", corpus_cache, "--seq-length", "16",
                               "--max-position-embeddings", "16", "--micro-batch-size", "1", "--global-batch-size",
                               "4", "--train-iters", str(train_iters), "--eval-iters", "0", "--dataloader-type",
                               "cyclic"] + data)
        tokenizer, sources = load_tokenizer_and_data_sources(config.data, config.model)
        settings = resolve_run_settings(config, tokenizer.vocab_size, 1, 1, "cpu")
        lines.append(build_data(settings, virtual_state(1), sources, tokenizer).summary)
    assert lines[0] == lines[1]
    assert "spans one epoch of the split's data" in lines[0]
    assert "not in Megatron-LM's order (its samples are this project's order)" in lines[0]


def test_a_sharded_cyclic_resume_at_another_dp_size_reads_other_samples_and_says_so(corpus_cache):
    """Data sharding gives each rank a bucket whose width follows the DP size (Megatron-LM's sampler): a continuation
    at another size is not the uninterrupted run's, and the resume says so in one line."""
    from arguments.parser import parse_config
    from training.data_splits import sharded_cyclic_resize_note

    extra = TYPES["cyclic"]
    straight = iterations_read(corpus_cache, extra, LAST, 1, 0, LAST)
    continued = iterations_read(corpus_cache, extra, LAST, 1, FIRST, LAST - FIRST)
    resized = iterations_read(corpus_cache, extra, LAST, 2, FIRST, LAST - FIRST)
    assert continued == straight[FIRST:] and resized != continued
    note = sharded_cyclic_resize_note(parse_config(extra).data, 2, 1)
    assert note.startswith("> note: --dataloader-type cyclic resumed at data-parallel size 1, the checkpoint's 2")
    assert "--no-data-sharding" in note and "\n" not in note
    assert sharded_cyclic_resize_note(parse_config(extra).data, 1, 1) is None
    assert sharded_cyclic_resize_note(parse_config(TYPES["cyclic-unsharded"]).data, 2, 1) is None
    assert sharded_cyclic_resize_note(parse_config(extra).data, None, 1) is None  # a checkpoint recording no size


def test_an_epoch_smaller_than_a_micro_batch_per_rank_is_read_as_that_many_samples(corpus_cache):
    """Sequences so long that one epoch of the split holds fewer samples than a micro-batch on every DP rank: the
    cyclic training split is that many samples (the sampler needs one global micro-batch), said in the data line."""
    from arguments.parser import parse_config
    from parallel.state import virtual_state
    from training.data_splits import build_data, load_tokenizer_and_data_sources
    from training.run_settings import resolve_run_settings

    config = parse_config(["--tokenizer-vocab-size", "512", "--data-cache-dir", corpus_cache, "--seq-length", "16384",
                           "--max-position-embeddings", "16384", "--micro-batch-size", "32", "--global-batch-size",
                           "64", "--train-iters", "2", "--eval-iters", "0", "--dataloader-type", "cyclic"])
    tokenizer, sources = load_tokenizer_and_data_sources(config.data, config.model)
    settings = resolve_run_settings(config, tokenizer.vocab_size, 1, 2, "cpu")
    data = build_data(settings, virtual_state(2, rank=1), sources, tokenizer)
    assert "spans 64 samples (one epoch of the split's data holds less than a micro-batch per data-parallel rank)" \
        in data.summary, data.summary
    batch = next(iter(data.make_train_loader(0)))
    assert batch["tokens"].shape == (32, 16385)
