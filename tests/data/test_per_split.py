"""Megatron-LM's per-split data flags and list files (issue 64 item 1): --train-data-path, --valid-data-path,
--test-data-path, --data-args-path, --per-split-data-args-path, with Megatron-LM's exclusions (NVIDIA/Megatron-LM at
d98e8a64: megatron/training/arguments.py validate_args, `assert (args.data_path is None) or (args.data_args_path is
None)`, the same for the per-split paths and their file, `A single data source must be provided`;
megatron/core/datasets/blended_megatron_dataset_config.py, `split and blend_per_split are incompatible`;
megatron/training/utils/common_utils.py get_blend_and_blend_per_split reads the files). What each split's samples
are is tests/data/test_per_split_as_megatron.py's."""

from __future__ import annotations

import json

import pytest

import pretrain_gpt
from arguments.parser import parse_arguments
from base.errors import ConfigError
from data.per_split import DataSources, describe_sources
from tests.reliability_helpers import TINY, metrics_records, run_main

TOKENIZER = ["--tokenizer-file", "/nonexistent/tokenizer.json"]  # only parsed: no file is opened by the flags


def sources_of(argv) -> DataSources:
    return parse_arguments(argv + TOKENIZER).config.data.sources()


def test_each_split_takes_its_own_blend_and_the_files_name_the_same_lists(tmp_path):
    sources = sources_of(["--train-data-path", "0.7", "/d/a", "0.3", "/d/b", "--valid-data-path", "/d/v"])
    assert sources.per_split == (("0.7", "/d/a", "0.3", "/d/b"), ("/d/v",), None)
    assert sources.training_blend() == ("0.7", "/d/a", "0.3", "/d/b")
    args = tmp_path / "args.txt"
    args.write_text("0.7 /d/a\n0.3   /d/b\n")
    assert sources_of(["--data-args-path", str(args)]).blend == ("0.7", "/d/a", "0.3", "/d/b")
    per_split = tmp_path / "per_split.json"
    per_split.write_text(json.dumps({"train": "0.7 /d/a 0.3 /d/b", "valid": ["/d/v"], "test": None}))
    from_file = sources_of(["--per-split-data-args-path", str(per_split)])
    assert from_file.per_split == sources.per_split
    assert describe_sources(from_file, "969,30,1").startswith("one blend per split, each read whole (train: "
                                                              f"--per-split-data-args-path {per_split} (train), 2 "
                                                              "prefixes weighted; valid:")


@pytest.mark.parametrize("argv, says", [
    (["--data-path", "/d/a", "--train-data-path", "/d/b"], "a single data source must be provided"),
    (["--mock-data", "--train-data-path", "/d/b"], "--mock-data and per-split data: a single data source"),
    (["--data-path", "/d/a", "--data-args-path", "ARGS"], "--data-path and --data-args-path name the same list"),
    (["--train-data-path", "/d/a", "--per-split-data-args-path", "SPLITS"], "name the same blends: give one"),
    (["--valid-data-path", "/d/a"], "--valid-data-path without a training blend"),
    (["--train-data-path", "0.5", "/d/a", "/d/b", "/d/c"], "--train-data-path: weight"),
    (["--per-split-data-args-path", "SPLITS"], "needs a JSON object with the keys train, valid and test"),
])
def test_what_megatron_refuses_is_refused_in_one_line(argv, says, tmp_path):
    (tmp_path / "args.txt").write_text("/d/a")
    (tmp_path / "splits.json").write_text(json.dumps({"train": ["/d/a"], "valid": None}))
    argv = [str(tmp_path / "args.txt") if a == "ARGS" else str(tmp_path / "splits.json") if a == "SPLITS" else a
            for a in argv]
    with pytest.raises(ConfigError, match=says) as error:
        parse_arguments(argv + TOKENIZER)
    assert "\n" not in str(error.value)


def test_a_default_split_is_not_read_beside_per_split_blends():
    """Only a --split typed by the user is refused: ours, or the default of a Megatron generation that still had
    one ('969, 30, 1' in 23.04, whose legacy builder ignores it for per-split data), is not read."""
    megatron_launch = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
                       "--max-position-embeddings", "16", "--micro-batch-size", "1", "--train-iters", "3"]
    for argv in (["--train-data-path", "/d/a"], megatron_launch + ["--train-data-path", "/d/a", "--data-impl", "mmap"]):
        assert sources_of(argv).per_split[0] == ("/d/a",)


@pytest.mark.slow
def test_a_per_split_launch_trains_caches_each_split_and_says_what_it_reads(corpus_cache, embedded_corpus, tmp_path):
    """One process: the training blend weighted over two copies of the corpus, the validation and test blends by
    size; each split's indices in --data-cache-path under its own name; the start-up and plan lines say which blend
    each split reads; the checkpoint records the training blend's content for the resume check."""
    corpus = embedded_corpus[1]
    prefix = corpus.data_prefix
    argv = TINY + ["--train-iters", "3", "--eval-iters", "1", "--eval-interval", "2",
                   "--tokenizer-file", f"{corpus.tokenizer_dir}/tokenizer.json",
                   "--train-data-path", "0.7", prefix, "0.3", prefix, "--valid-data-path", prefix,
                   "--test-data-path", prefix, "--data-cache-path", str(tmp_path / "cache"),
                   "--save", str(tmp_path / "save"), "--metrics-file", str(tmp_path / "m.jsonl")]
    outcome = run_main(pretrain_gpt.main, argv)
    assert outcome.code == 0, outcome.err[-2000:]
    (line,) = [line for line in outcome.out.splitlines() if line.startswith("> data: ")]
    assert line == ("> data: one blend per split, each read whole (train: --train-data-path, 2 prefixes weighted; "
                    "valid: --valid-data-path, 1 prefix; test: --test-data-path, 1 prefix); samples of 17 tokens: "
                    "train 6, valid 2, test 2")
    cached = [path.name for path in (tmp_path / "cache").glob("*_index.npy")]
    assert {name for name in ("train", "valid", "test") if any(f"_document_{name}_" in file for file in cached)} \
        == {"train", "valid", "test"}
    splits = {record.get("split") for record in metrics_records(tmp_path / "m.jsonl")}
    assert {"valid", "test"} <= splits
    metadata = json.loads(next((tmp_path / "save").glob("iter_*/metadata.json")).read_text())
    assert [entry["weight"] for entry in metadata["data_identity"]] == [0.7, 0.3]
    plan = run_main(pretrain_gpt.main, argv[:-6] + ["--dry-run"])
    assert plan.code == 0, plan.err[-2000:]
    assert "data: one blend per split, each read whole (train: --train-data-path, 2 prefixes weighted" in plan.out


def test_a_split_typed_beside_per_split_blends_is_not_read_and_said():
    """Megatron-Core asserts 'split and blend_per_split are incompatible' (blended_megatron_dataset_config.py,
    since 8d8241a9, 2024-01); LLM360's K2-V2 mid-training launches (mid-train/k2v2_mid_train_stage*.sh) give
    --split beside --train-data-path/--valid-data-path and trained on their container's Megatron-LM: accepted here,
    --split unread, said in one start-up line."""
    parsed = parse_arguments(["--train-data-path", "/d/a", "--split", "99,1,0"] + TOKENIZER)
    assert parsed.config.data.sources().per_split is not None
    said = [note for note in parsed.notes if note.startswith("> --split 99,1,0 beside per-split blends: not read")]
    assert len(said) == 1
    assert parse_arguments(["--train-data-path", "/d/a"] + TOKENIZER).config.split_unread_note() is None  # a default
