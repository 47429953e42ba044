"""CUDA graphs of the GPT blocks (training/cuda_graphs.py) trained through the CPU stand-in (parallel/graph_backends.py
RerunBackend, passed to training.build.build), which runs everything a CUDA capture and replay run but the kernels'
recording: a tiny GPT trained with graphs gives the eager run's fp32 losses and gradient norms bit for bit (whole blocks,
the attention and MLP halves, an attention mask as a second input; on two gloo ranks TP 2 with and without sequence
parallelism, and ZeRO-1 over DP 2 with its parameter gathers overlapped, comm bytes too); the capture comes where
Megatron-LM's schedule puts it; what the graphs run makes no host synchronisation (tests/host_syncs.py); and what a run
cannot capture runs eagerly and is named, not refused.
The same training on a GPU (CUDAGraph itself): `test_on_a_gpu_graphed_training_follows_eager`, skipped without one.
"""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

import pretrain_gpt
from arguments.parser import parse_config
from data.documents import DocumentMasking
from parallel.graph_backends import RerunBackend
from parallel.graph_capture import GraphSet
from parallel.state import destroy, initialize
from tests.distributed import run_distributed
from tests.host_syncs import HostSyncCounter
from training.build import build
from training.cuda_graphs import CudaGraphs, cuda_graph_plan
from training.run_settings import resolve_run_settings
from training.train_step import DataParallelTrainStep

VOCAB = 512
SMALL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "6",
         "--tokenizer-vocab-size", str(VOCAB), "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "3"]
ITERATIONS = 4  # the capture comes at the start of iteration 2 (--cuda-graph-impl local): three replayed iterations


def batches(generator: torch.Generator, micro_batch: int, tokens: int = VOCAB):
    while True:
        yield {"tokens": torch.randint(0, tokens, (micro_batch, 17), generator=generator)}


def train(state, flags: list[str], backend=None, documents=None) -> tuple[list, list, CudaGraphs]:
    """ITERATIONS iterations of a tiny GPT on fixed batches: per iteration (loss, grad norm) and comm bytes."""
    config = parse_config(SMALL + flags)
    settings = resolve_run_settings(config, VOCAB, state.tensor_parallel_size, state.data_parallel_size, "cpu")
    built = build(settings, state, dropout_rng=True, torch_compile=False, graph_backend=backend)
    micro_batch = config.training.micro_batch_size
    # with document masking, tokens drawn from 8 so that end-of-document ids (0) break every sequence somewhere
    tokens = 8 if documents is not None else VOCAB
    step = DataParallelTrainStep(built.model, built.zero, batches(torch.Generator().manual_seed(0), micro_batch, tokens),
                                 settings, state, built.activations, documents=documents,
                                 cuda_graphs=built.cuda_graphs)
    outcomes, sent = [], []
    for iteration in range(1, ITERATIONS + 1):
        outcome = step(iteration, (iteration - 1) * config.training.global_batch_size, measure_activations=False)
        outcomes.append((outcome.loss, outcome.grad_norm))
        sent.append(state.comm.stats.snapshot())
    return outcomes, sent, built.cuda_graphs


@pytest.fixture
def single_process():
    state = initialize("cpu", 1)
    yield state
    destroy(state)


@pytest.mark.parametrize("modules, masking", [([], False), (["attn", "mlp"], False), ([], True)],
                         ids=["whole blocks", "attention and MLP halves", "whole blocks with an attention mask"])
def test_graphed_training_gives_the_eager_fp32_losses_bit_for_bit(single_process, modules, masking):
    flags = ["--reset-attention-mask"] if masking else []
    documents = DocumentMasking.of(0, False, True, False) if masking else None
    eager, _, _ = train(single_process, flags, documents=documents)
    graphed, _, graphs = train(single_process, flags + ["--cuda-graph-impl", "local", "--cuda-graph-modules", *modules]
                               if modules else flags + ["--cuda-graph-impl", "local"], RerunBackend(), documents)
    assert graphs.graph_set.captured and len(graphs.graph_set.regions) == (4 if modules else 2)
    assert graphed == eager
    if masking:
        assert all(len(region.static_inputs) == 2 for region in graphs.graph_set.regions)  # the mask is an input


def test_the_capture_comes_where_megatrons_schedule_puts_it():
    """local: after one eager iteration, --cuda-graph-warmup-steps warm-up passes each (schedules.py's
    create_cudagraphs at the end of the first forward-backward; _CudaGraphRunner.create_fwd_graph's warm-up loop);
    transformer_engine: after --cuda-graph-warmup-steps eager iterations (training.py), each graph warmed up
    max(1, ceil((10 - steps x M) / M)) times per micro-batch (TECudaGraphHelper's num_warmup_iters)."""
    def requests(flags, micro_batches=4):
        graph_set = GraphSet([], RerunBackend(), None, torch.device("cpu"))
        graphs = CudaGraphs(cuda_graph_plan(parse_config(SMALL + flags), "cuda"), graph_set)
        for iteration in range(1, 6):
            graphs.begin_iteration(micro_batches)
            if graph_set.capture_pending:
                return iteration, graph_set.warmup_passes
        return None

    assert requests(["--cuda-graph-impl", "local"]) == (2, 3)
    assert requests(["--cuda-graph-impl", "local", "--cuda-graph-warmup-steps", "0"]) == (2, 0)
    assert requests(["--cuda-graph-impl", "transformer_engine"]) == (4, 4)          # 4 x max(1, ceil(-2/4))
    assert requests(["--cuda-graph-impl", "transformer_engine", "--cuda-graph-warmup-steps", "0"]) == (1, 12)
    assert requests(["--enable-cuda-graph", "--cuda-graph-warmup-steps", "1"], micro_batches=1) == (2, 1)


def test_the_graphs_run_no_host_synchronisation(single_process):
    """Every capture and replay of the regions (the stand-in runs their forward and backward code), counted as
    tests/host_syncs.py counts what would make the host wait on a GPU: none, so the captures can hold on CUDA."""
    counter = HostSyncCounter()
    ran = []

    class Watched(RerunBackend):
        def capture(self, fn):
            with self._counted():
                return super().capture(fn)

        def replay(self, graph):
            with self._counted():
                super().replay(graph)

        @contextlib.contextmanager
        def _counted(self):
            ran.append(1)
            counter.active = True
            try:
                yield
            finally:
                counter.active = False

    with counter.watching():
        train(single_process, ["--cuda-graph-impl", "local", "--cuda-graph-modules", "attn", "mlp"], Watched())
    assert len(ran) == 2 * 4 + 2 * 4 * 3 * (ITERATIONS - 1)  # the captures, and a forward and backward replay each
    assert dict(counter.counts) == {}


@pytest.mark.parametrize("flags, named", [
    ([], "the device is cpu, and a CUDA graph records CUDA kernels"),
    (["--pipeline-model-parallel-size", "2"], "pipeline stages"),
    (["--zero-stage", "3"], "ZeRO-3 gathers each block's parameters"),
    (["--fp8-format", "hybrid"], "not yet free of host synchronisation"),
    (["--compile"], "--compile: compiled blocks are not captured here"),
    (["--context-parallel-size", "2"], "context parallelism"),
    (["--position-embedding-type", "longrope", "--longrope-short-factor", "1,1,1,1,1,1,1,1",
      "--longrope-long-factor", "1,1,1,1,1,1,1,1", "--longrope-original-max-position-embeddings", "8"],
     "its factors are copied from the host"),
    (["--cuda-graph-impl", "full_iteration", "--no-check-for-nan-in-loss-and-grad"],
     "a graph of the whole forward-backward is not built here"),
])
def test_what_a_run_cannot_capture_runs_eagerly_and_is_named_not_refused(flags, named):
    device = "cpu" if not flags else "cuda"
    plan = cuda_graph_plan(parse_config(SMALL + ["--cuda-graph-impl", "local", *flags]), device)
    assert not plan.captures and named in plan.line() and "nothing captured, the blocks run eagerly" in plan.line()


def test_a_capturing_run_names_what_megatron_would_capture_and_it_does_not():
    moe = ["--num-experts", "4", "--moe-router-topk", "2", "--num-layers", "4", "--moe-layer-freq", "[0,1,0,1]"]
    whole = cuda_graph_plan(parse_config(SMALL + ["--cuda-graph-impl", "local", *moe]), "cuda")
    assert whole.captures and "the MoE blocks run eagerly" in whole.line()
    scoped = cuda_graph_plan(parse_config(SMALL + ["--cuda-graph-impl", "local", "--cuda-graph-modules", "attn",
                                                   "moe_router", "mamba", *moe]), "cuda")
    line = scoped.line()
    assert "--cuda-graph-modules moe_router moe_preprocess: not captured here" in line
    assert "--cuda-graph-modules mamba: no effect (no Mamba layers here)" in line


PARALLEL_RUNS = {
    "tp": (2, ["--tensor-model-parallel-size", "2"], "tp"),
    "sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"], "tp"),
    # ZeRO-1 over DP 2, its parameter gathers overlapped with the forward: the forward pre-hooks that wait for them run
    # before each replay (base/graph_replay_hooks.py), and the gradients reach the reducer's hooks outside the graphs
    "dp": (1, ["--use-distributed-optimizer", "--overlap-param-gather", "--overlap-grad-reduce",
               "--global-batch-size", "8"], "dp"),
}


def _parallel_rank(rank, world_size, tensor_parallel: int, names: list[str]):
    state = initialize("cpu", tensor_parallel_size=tensor_parallel)
    try:
        return {name: (train(state, PARALLEL_RUNS[name][1])[:2],
                       train(state, PARALLEL_RUNS[name][1] + ["--cuda-graph-impl", "local"], RerunBackend())[:2])
                for name in names}
    finally:
        destroy(state)


@pytest.mark.slow
def test_parallel_graphed_training_gives_the_eager_losses_and_comm_bytes():
    results = [result for tensor_parallel in (2, 1) for result in run_distributed(
        _parallel_rank, 2, tensor_parallel, [name for name, run in PARALLEL_RUNS.items() if run[0] == tensor_parallel],
        timeout=300)]
    for rank_results in results:
        for name, ((eager, eager_sent), (graphed, graphed_sent)) in rank_results.items():
            assert graphed == eager, name
            # every iteration's bytes, those of the replayed iterations counted from their captures
            group = PARALLEL_RUNS[name][2]
            assert graphed_sent == eager_sent and all(sum(sent[group].values()) > 0 for sent in graphed_sent), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: CUDAGraph capture and replay")
def test_on_a_gpu_graphed_training_follows_eager(tmp_path, corpus_cache, capsys):
    """The GPU session's check: a tiny GPT trained with --cuda-graph-impl local against eager on CUDA. fp32 without
    dropout, the replayed kernels are the eager ones: losses within 1e-5 relative. bf16 with dropout (the private
    stream forked inside the captures, parallel/random.py graph_safe): finite, within 2% of eager's after 8
    iterations (the warm-up passes draw masks an eager run does not)."""
    common = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
              "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
              "--train-iters", "8", "--log-interval", "1", "--eval-iters", "0", "--seed", "1",
              "--tokenizer-vocab-size", "512", "--data-cache-dir", corpus_cache, "--device", "cuda"]

    def losses(name, *flags):
        metrics = tmp_path / f"{name}.jsonl"
        assert pretrain_gpt.main(common + ["--metrics-file", str(metrics), *flags]) == 0
        return [json.loads(line)["loss"] for line in open(metrics)]

    fp32 = ["--hidden-dropout", "0", "--attention-dropout", "0"]
    eager, graphed = losses("eager", *fp32), losses("graphed", *fp32, "--cuda-graph-impl", "local")
    assert graphed == pytest.approx(eager, rel=1e-5)
    out = capsys.readouterr().out
    assert "> CUDA graphs (--cuda-graph-impl local)" in out and "> captured 2 CUDA graph pairs in iteration 2" in out
    bf16 = ["--bf16", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--tensor-model-parallel-size", "1"]
    eager, graphed = losses("eager-bf16", *bf16), losses("graphed-bf16", *bf16, "--cuda-graph-impl", "local",
                                                           "--cuda-graph-modules", "attn", "mlp")
    assert all(torch.isfinite(torch.tensor(graphed))) and graphed[-1] == pytest.approx(eager[-1], rel=0.02)
