"""Tensor parallel training with dropout is reproducible and its TP traffic is what it should be (its losses against
one rank's: the combination table, tests/training/combinations.py).

Each rank runs `pretrain_gpt.main` in its own process with torchrun's environment (tests/distributed.py),
on the embedded corpus, in fp32 with dropout off where losses are compared.
"""

import json

import pytest
import torch

import pretrain_gpt
from tests.distributed import run_distributed

COMMON = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
          "--train-iters", "20", "--seed", "1", "--log-interval", "1", "--eval-iters", "0",
          "--tokenizer-vocab-size", "512", "--device", "cpu"]
NO_DROPOUT = ["--hidden-dropout", "0", "--attention-dropout", "0"]


def train_rank(rank, world_size, argv):
    assert pretrain_gpt.main(argv) == 0


def losses(metrics_file, key="loss"):
    return [json.loads(line)[key] for line in open(metrics_file)]


def train(tmp_path, corpus_cache, name, world_size, *extra):
    metrics = tmp_path / f"{name}.jsonl"
    argv = COMMON + ["--data-cache-dir", corpus_cache, "--metrics-file", str(metrics), *extra]
    if world_size == 1:
        assert pretrain_gpt.main(argv) == 0
    else:
        run_distributed(train_rank, world_size, argv, timeout=300)
    return losses(metrics)


@pytest.mark.slow
def test_tp2_with_dropout_is_reproducible(tmp_path, corpus_cache):
    extra = ["--tensor-model-parallel-size", "2", "--train-iters", "6", "--hidden-dropout", "0.1",
             "--attention-dropout", "0.1"]
    first = train(tmp_path, corpus_cache, "a", 2, *extra)
    second = train(tmp_path, corpus_cache, "b", 2, *extra)
    without = train(tmp_path, corpus_cache, "c", 2, *extra[:4], *NO_DROPOUT)
    assert first == second
    assert first != without  # dropout really was on


def tp_bytes_of_one_step(rank, world_size, num_layers, batch, seq, hidden):
    """TP all-reduce bytes this rank sends for one forward + backward of the model."""
    from arguments.config import ModelConfig
    from gpt.model import build_gpt_model
    from parallel.state import destroy, initialize

    state = initialize("cpu", tensor_parallel_size=world_size)
    try:
        config = ModelConfig.of(num_layers=num_layers, hidden_size=hidden, num_attention_heads=4, seq_length=seq,
                             max_position_embeddings=seq, vocab_size=500, hidden_dropout=0.0,
                             attention_dropout=0.0)
        model = build_gpt_model(config, state, seed=0)
        tokens = torch.randint(0, 500, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
        state.comm.stats.snapshot_and_reset()
        model(tokens[:, :-1], tokens[:, 1:]).mean().backward()
        return state.comm.stats.snapshot_and_reset()
    finally:
        destroy(state)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [2, 4])
def test_byte_accounting_reports_four_tp_all_reduces_per_layer(tp):
    """Per transformer layer: 2 all-reduces forward (attention and MLP outputs) and 2 backward (their
    inputs' gradients), each of b*s*h fp32 elements, ring volume 2M(N-1)/N per rank."""
    batch, seq, hidden = 2, 16, 32
    one = run_distributed(tp_bytes_of_one_step, tp, 1, batch, seq, hidden)[0]
    three = run_distributed(tp_bytes_of_one_step, tp, 3, batch, seq, hidden)[0]
    message = batch * seq * hidden * 4
    per_all_reduce = 2 * message * (tp - 1) // tp
    assert three["tp"]["all_reduce"] - one["tp"]["all_reduce"] == 2 * 4 * per_all_reduce
    # Outside the blocks: the embedding's forward all-reduce and the tied output layer's backward one
    # (b*s*h each), plus vocab-parallel cross entropy's max and (target logit, sum-exp) all-reduces.
    outside = 2 * per_all_reduce + 2 * (batch * seq * 4) * (tp - 1) // tp + 2 * (2 * batch * seq * 4) * (tp - 1) // tp
    assert one["tp"]["all_reduce"] == 4 * per_all_reduce + outside
    assert all(value == 0 for value in one["dp"].values())
