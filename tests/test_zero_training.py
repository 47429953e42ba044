"""ZeRO-DP stages 0-3 end to end: the single-process losses, the paper's memory and traffic, fp16 overflow.

Each launch starts its gloo ranks once and trains several configurations in them (`pretrain_gpt.run`
per configuration), reading back what `metrics.jsonl` recorded: per-iteration losses, `comm_bytes`
and the `--report-memory` record. Everything runs on the embedded corpus with dropout off.
"""

import json

import pytest

import pretrain_gpt
from gpt.arguments import parse_config
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from zero.memory import within_tolerance

ITERS = 10
COMMON = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--max-position-embeddings", "32", "--train-iters", str(ITERS), "--seed", "1", "--log-interval", "1",
          "--eval-iters", "0", "--tokenizer-vocab-size", "512", "--device", "cpu",
          "--hidden-dropout", "0", "--attention-dropout", "0",
          # Small buckets, so the model spans several and the bucket logic is exercised.
          "--reduce-bucket-size", "20000", "--allgather-bucket-size", "30000",
          "--stage3-prefetch-bucket-size", "100000"]
BATCH = ["--global-batch-size", "8"]


@pytest.fixture(scope="module")
def corpus_cache(tmp_path_factory):
    """Prepare the embedded corpus once, before any ranks start."""
    from data.corpus import prepare_default_corpus

    cache = str(tmp_path_factory.mktemp("zero-corpus"))
    prepare_default_corpus(cache, 512)
    return cache


def train_configurations(rank, world_size, tensor_parallel_size, runs):
    """One process group, several training runs in it (each a full `pretrain_gpt.run`)."""
    state = initialize("cpu", tensor_parallel_size)
    try:
        for argv in runs:
            pretrain_gpt.run(parse_config(argv), state)
    finally:
        destroy(state)


def records(metrics_file):
    return [json.loads(line) for line in open(metrics_file)]


def train_losses(metrics_file):
    return [r["loss"] for r in records(metrics_file) if "loss" in r and "split" not in r]


class Runs:
    """Names -> argv for one launch, and the metrics each wrote."""

    def __init__(self, tmp_path, corpus_cache):
        self.tmp_path, self.corpus_cache = tmp_path, corpus_cache
        self.argvs: dict[str, list[str]] = {}

    def add(self, name, *extra):
        metrics = self.tmp_path / f"{name}.jsonl"
        self.argvs[name] = COMMON + ["--data-cache-dir", self.corpus_cache, "--metrics-file", str(metrics),
                                     *extra]
        return self

    def launch(self, world_size, tensor_parallel_size=1):
        run_distributed(train_configurations, world_size, tensor_parallel_size, list(self.argvs.values()),
                        timeout=600)
        return {name: records(self.tmp_path / f"{name}.jsonl") for name in self.argvs}


def single_process_losses(tmp_path, corpus_cache, *extra):
    metrics = tmp_path / "single.jsonl"
    argv = COMMON + ["--data-cache-dir", corpus_cache, "--metrics-file", str(metrics), *BATCH,
                     "--micro-batch-size", "2", *extra]
    assert pretrain_gpt.main(argv) == 0
    return train_losses(metrics)


def losses_of(metrics):
    return [r["loss"] for r in metrics if "loss" in r and "split" not in r]


def assert_close(losses, reference, rel, name):
    assert len(losses) == len(reference) == ITERS, name
    for i, (a, b) in enumerate(zip(losses, reference)):
        assert abs(a - b) <= rel * abs(b), f"{name}: iteration {i + 1} loss {a} vs single-process {b}"


@pytest.mark.slow
def test_stages_match_single_process_on_2_and_4_ranks(tmp_path, corpus_cache):
    reference = single_process_losses(tmp_path, corpus_cache)
    two = Runs(tmp_path, corpus_cache)
    for stage in range(4):
        # micro batch 2 on 2 ranks: 2 accumulation steps; micro batch 4: none.
        two.add(f"dp2-stage{stage}-accumulate", *BATCH, "--micro-batch-size", "2", "--zero-stage", str(stage))
        two.add(f"dp2-stage{stage}", *BATCH, "--micro-batch-size", "4", "--zero-stage", str(stage))
    results = two.launch(2)
    four = Runs(tmp_path, corpus_cache)
    for stage in range(4):
        four.add(f"dp4-stage{stage}", *BATCH, "--micro-batch-size", "2", "--zero-stage", str(stage))
    results.update(four.launch(4))
    for name, metrics in results.items():
        assert_close(losses_of(metrics), reference, 1e-5, name)
