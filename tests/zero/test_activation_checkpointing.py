"""ZeRO-R activation checkpointing: exact recompute with dropout on, P_a's memory and traffic on TP=1,
2 and 4, P_a+cpu's placement, M_D's single allocation, and stage 3 sharing one gather per block."""

import math

import pytest
import torch

from arguments.config import ModelConfig
from gpt.model import build_gpt_model
from parallel.comm import ring_bytes_sent
from parallel.random import TensorParallelRNG
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from tests.zero.test_zero_training import Runs, losses_of
from zero.activations import ActivationMonitor, apply_activation_checkpointing
from zero.config import ActivationCheckpointConfig

SEED, STEPS, BATCH, SEQ = 5, 3, 2, 16
MODEL = ModelConfig.of(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=SEQ,
                    max_position_embeddings=SEQ, vocab_size=128)  # dropout 0.1: recompute must replay it
OPTIONS = {
    "none": None,
    "checkpoint": {},
    "checkpoint-2-layers": {"checkpoint_num_layers": 2},
    "partition": {"partition_activations": True},
    "partition+cpu": {"partition_activations": True, "cpu_checkpointing": True},
    "partition+cpu+contiguous": {"partition_activations": True, "cpu_checkpointing": True,
                                 "contiguous_checkpointing": True},
}


def compare_options(rank, world_size, tensor_parallel_size):
    """Train the same TP model for a few micro-batches under every option; per option return the
    losses, whether every gradient equals the no-checkpointing run bit for bit, the TP bytes sent,
    the saved-tensor peaks and the contiguous buffer's allocations."""
    state = initialize("cpu", tensor_parallel_size)
    try:
        generator = torch.Generator().manual_seed(SEED)
        batches = [torch.randint(0, MODEL.vocab_size, (BATCH, SEQ + 1), generator=generator) for _ in range(STEPS)]
        results, reference_grads = {}, None
        for name, options in OPTIONS.items():
            rng = TensorParallelRNG(SEED, state)
            model = build_gpt_model(MODEL, state, seed=SEED, rng=rng)
            monitor = ActivationMonitor(state.device)
            checkpointing = None
            if options is not None:
                config = ActivationCheckpointConfig(checkpoint_activations=True, **options)
                checkpointing = apply_activation_checkpointing(model, config, state, rng, monitor)
            state.comm.stats.snapshot_and_reset()
            losses = []
            for tokens in batches:
                with monitor.measuring():
                    loss = model(tokens[:, :-1], tokens[:, 1:]).mean()
                loss.backward()
                losses.append(loss.item())
            meter = monitor.finish_measurement()
            grads = [p.grad.clone() for p in model.parameters()]
            if reference_grads is None:
                reference_grads = grads
            results[name] = {
                "losses": losses,
                "grads_equal": all(torch.equal(a, b) for a, b in zip(grads, reference_grads)),
                "tp_bytes": state.comm.stats.snapshot()["tp"],
                "checkpointed_peak": dict(meter.checkpointed_peak),
                "allocations": checkpointing.contiguous.allocations if checkpointing and checkpointing.contiguous else 0,
            }
        return results
    finally:
        destroy(state)


def run_options(tensor_parallel_size):
    if tensor_parallel_size == 1:
        return [compare_options(0, 1, 1)]
    return run_distributed(compare_options, tensor_parallel_size, tensor_parallel_size, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_checkpointing_options_are_exact_and_partition_over_tp(tp):
    for rank, results in enumerate(run_options(tp)):
        none = results["none"]
        input_bytes = BATCH * SEQ * MODEL.hidden_size * 4  # one block's fp32 input
        for name, result in results.items():
            where = f"TP={tp} rank {rank} {name}"
            # Bit for bit: the recompute replays the forward's dropout masks, and the all-gather of
            # P_a slices rebuilds the input exactly (it only moves bytes).
            assert result["losses"] == none["losses"], where
            assert result["grads_equal"], where
        assert results["checkpoint"]["checkpointed_peak"] == {"device": 4 * input_bytes, "host": 0}
        assert results["checkpoint-2-layers"]["checkpointed_peak"] == {"device": 2 * input_bytes, "host": 0}
        # P_a keeps 1/TP of every checkpointed input; P_a+cpu keeps none of it on the device.
        partition = results["partition"]["checkpointed_peak"]
        assert partition["host"] == 0
        assert abs(partition["device"] - 4 * input_bytes / tp) <= 0.05 * 4 * input_bytes / tp
        for name in ("partition+cpu", "partition+cpu+contiguous"):
            assert results[name]["checkpointed_peak"] == {"device": 0, "host": partition["device"]}, name
        # M_D: one buffer for the whole run, however many micro-batches.
        assert results["partition+cpu+contiguous"]["allocations"] == 1
        assert results["partition"]["allocations"] == 0
        # Traffic: P_a adds exactly one TP all-gather of the input per checkpoint per micro-batch.
        extra = STEPS * 4 * ring_bytes_sent("all_gather", tp * math.ceil(input_bytes // 4 / tp) * 4, tp)
        plain = results["checkpoint"]["tp_bytes"]
        for name in ("partition", "partition+cpu", "partition+cpu+contiguous"):
            measured = results[name]["tp_bytes"]
            assert measured["all_gather"] - plain["all_gather"] == extra, name
            assert {k: v for k, v in measured.items() if k != "all_gather"} == \
                   {k: v for k, v in plain.items() if k != "all_gather"}, name


@pytest.mark.slow
def test_stage3_with_checkpointing_gathers_each_block_once_per_pass(tmp_path, corpus_cache, single_process_reference):
    """Stage 3 + checkpointing (+P_a on TP=2 x DP=2): the single-process losses, and 3 Psi (N-1)/N of DP
    traffic per iteration, not 4 Psi: a block's recompute and its backward share one gather."""
    reference = single_process_reference
    checkpointing = ["--checkpoint-activations", "--report-memory", "--reduce-bucket-size", "5e8"]
    dp2 = Runs(tmp_path, corpus_cache).add("dp2-stage3-ckpt", "--global-batch-size", "8", "--micro-batch-size",
                                           "4", "--zero-stage", "3", *checkpointing).launch(2)
    grid = Runs(tmp_path, corpus_cache).add("tp2xdp2-stage3-pa", "--global-batch-size", "8", "--micro-batch-size",
                                            "4", "--zero-stage", "3", "--tensor-model-parallel-size", "2",
                                            "--partition-activations", *checkpointing).launch(4, 2)
    for metrics in (dp2["dp2-stage3-ckpt"], grid["tp2xdp2-stage3-pa"]):
        losses = losses_of(metrics)
        assert len(losses) == len(reference)
        for a, b in zip(losses, reference):
            assert abs(a - b) <= 1e-5 * abs(b)
        (memory,) = [r["memory"] for r in metrics if "memory" in r]
        psi = memory[0]["num_parameters"]
        expected = 3 * psi * (2 - 1) / 2 * 4  # fp32
        for record in (r for r in metrics if "comm_bytes" in r):
            sent = sum(record["comm_bytes"]["dp"].values())
            assert abs(sent - expected) <= 0.01 * expected, f"{sent} vs {expected}"
