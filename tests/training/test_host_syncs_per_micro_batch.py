"""Issue 76 item 2: inside a micro-batch the train step reads nothing back from the device, so the host never waits
on its queue of kernels mid-micro-batch, as a CUDA graph of a micro-batch requires.

tests/host_syncs.py counts on the CPU every call that would make the host wait on a GPU, per window of the real
train step (training/train_step.py's DataParallelTrainStep, training/pipeline_step.py's PipelineTrainStep, built as
a run builds them, with the rerun state machine a flags launch makes): each micro-batch (or pipeline slot), and the
per-iteration work outside them. Held at 0 per micro-batch for a dense model (ZeRO 0 to 3, TP 2 with sequence
parallelism, 2 pipeline stages), for MoE padded to capacity (Megatron-Core's drop-and-pad: every split a shape;
at expert-parallel size 1 and over an EP 2 all-to-all and all-gather), and with --rerun-mode validate_results and
report_stats (the losses are checked once after the micro-batches: resilience/loss_checks.py). A dropless MoE layer
reads its routing counts back once, at gpt/moe/expert_rows.py read_counts, as Megatron-Core's alltoall dispatcher
does (token_dispatcher.py _maybe_dtoh_and_synchronize): that read, once per MoE layer and micro-batch, and
nothing else.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from arguments.parser import parse_config
from gpt.moe.expert_rows import read_counts
from parallel.state import destroy, initialize_grid
from resilience.loss_checks import LossChecks
from resilience.rerun_setup import rerun_state_machine_for
from tests.distributed import run_distributed
from tests.host_syncs import IN_A_MICRO_BATCH, HostSyncCounter, SyncCountingObserver
from training.build import build
from training.pipeline_step import PipelineTrainStep
from training.run_settings import resolve_run_settings
from training.train_step import DataParallelTrainStep

VOCAB, SEQUENCE = 512, 16
# a flags launch: Megatron-LM's default --rerun-mode validate_results, its NaN/Inf checks on every loss
SMALL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", str(SEQUENCE),
         "--max-position-embeddings", str(SEQUENCE), "--micro-batch-size", "2", "--tokenizer-vocab-size", str(VOCAB),
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "3", "--device", "cpu"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
       "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3"]
PADDED = ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"]
ITERATIONS = 2


def _batches(seed: int):
    generator = torch.Generator().manual_seed(seed)
    while True:
        yield {"tokens": torch.randint(0, VOCAB, (2, SEQUENCE + 1), generator=generator)}


def count_step_syncs(argv: list[str]) -> HostSyncCounter:
    """ITERATIONS iterations of the train step a run of `argv` trains with, on this process's rank of the grid."""
    config = parse_config(argv)
    state = initialize_grid("cpu", config.parallel, 1)
    try:
        settings = resolve_run_settings(config, VOCAB, state.tensor_parallel_size, state.data_parallel_size, "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=False)
        rerun = rerun_state_machine_for(settings.config.training, state, built.rng, lambda line: None)
        counter = HostSyncCounter()
        kind = PipelineTrainStep if state.pipeline_parallel_size > 1 else DataParallelTrainStep
        # the tensor-parallel peers of a data-parallel rank read the same samples
        step = kind(built.model, built.zero, _batches(state.data_parallel_rank), settings, state, built.activations,
                    observer=SyncCountingObserver(counter), rerun=rerun)
        with counter.watching():
            counter.active = True
            for iteration in range(ITERATIONS):
                step(iteration + 1, iteration * settings.batch.global_batch_size, measure_activations=False)
            counter.active = False
        return counter
    finally:
        destroy(state)


def in_micro_batches(counter: HostSyncCounter, micro_batches: int = 3) -> dict:
    """The counts inside the micro-batches, {(what, site): count}, once the counter watched each of them."""
    assert len(counter.opened) == ITERATIONS * micro_batches, counter.opened
    return counter.in_windows(IN_A_MICRO_BATCH)


def _rank_syncs(rank, world_size, argv, windows):
    counter = count_step_syncs(argv)
    return in_micro_batches(counter, windows // ITERATIONS), counter.in_windows("outside")


def site_of(function, text: str) -> str:
    """`path:line` of the first line of `function` holding `text`, as the counter names a site."""
    lines, first = inspect.getsourcelines(function)
    line = next(first + i for i, source in enumerate(lines) if text in source)
    return f"{inspect.getmodule(function).__name__.replace('.', '/')}.py:{line}"


THE_COUNTS_READ = ("Tensor.tolist", site_of(read_counts, ".tolist()"))  # a dropless MoE layer's one read
THE_LOSS_READ = ("aten._local_scalar_dense.default", site_of(DataParallelTrainStep.__call__, "logged_loss.item()"))
THE_CHECKS_READ = ("Tensor.tolist", site_of(LossChecks.validate, ".tolist()"))


@pytest.mark.parametrize("zero_stage", ["0", "1", "2", "3"])
def test_a_dense_micro_batch_reads_nothing_back_under_each_zero_stage(zero_stage):
    counter = count_step_syncs(SMALL + ["--global-batch-size", "6", "--zero-stage", zero_stage])
    assert in_micro_batches(counter) == {}
    # the per-iteration reads stay outside: the loss (and the gradient norm) once an iteration
    assert counter.in_windows("outside")[THE_LOSS_READ] == ITERATIONS


@pytest.mark.parametrize("experts", [["--moe-grouped-gemm"], []], ids=["grouped", "loop"])
def test_moe_padded_to_capacity_reads_nothing_back(experts):
    assert in_micro_batches(count_step_syncs(SMALL + MOE + PADDED + experts + ["--global-batch-size", "6"])) == {}


@pytest.mark.parametrize("mode", ["validate_results", "report_stats"])
def test_the_rerun_machines_loss_checks_read_once_after_the_micro_batches(mode):
    counter = count_step_syncs(SMALL + ["--global-batch-size", "6", "--rerun-mode", mode, "--check-for-spiky-loss"])
    runs = 2 if mode == "report_stats" else 1  # report_stats runs every iteration twice
    assert in_micro_batches(counter, 3 * runs) == {}
    # one read of the 3 micro-batches' losses per run of the iteration
    assert counter.in_windows("outside")[THE_CHECKS_READ] == ITERATIONS * runs


def test_a_dropless_moe_layer_reads_its_routing_counts_back_once_and_nothing_else():
    counter = count_step_syncs(SMALL + MOE + ["--moe-grouped-gemm", "--global-batch-size", "6"])
    moe_layers, micro_batches = 2, 3
    assert in_micro_batches(counter) == {THE_COUNTS_READ: ITERATIONS * micro_batches * moe_layers}


@pytest.mark.slow
@pytest.mark.parametrize("flags, windows", [
    (SMALL + ["--global-batch-size", "6", "--tensor-model-parallel-size", "2", "--sequence-parallel"], 6),
    # each rank's 3 forward and 3 backward slots an iteration
    (SMALL + ["--global-batch-size", "6", "--pipeline-model-parallel-size", "2"], 12),
    # EP 2 over the 2 data-parallel ranks: 2 micro-batches each
    (SMALL + MOE + PADDED + ["--global-batch-size", "8", "--expert-model-parallel-size", "2", "--zero-stage", "3",
                             "--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"], 4),
    (SMALL + MOE + PADDED + ["--global-batch-size", "8", "--expert-model-parallel-size", "2",
                             "--moe-token-dispatcher-type", "allgather"], 4),
], ids=["tp2_sp", "pp2", "ep2_alltoall_zero3", "ep2_allgather"])
def test_two_ranks_read_nothing_back_inside_a_micro_batch(flags, windows):
    for rank, (inside, outside) in enumerate(run_distributed(_rank_syncs, 2, flags, windows, timeout=300)):
        assert inside == {}, rank
        assert outside, rank  # what the step reads once an iteration (the gradient norm, ...) is still seen
