"""Each pipeline stage draws from its own random streams, as Megatron-LM seeds them (issue 89): the shared stream from
--seed + 100 x the pipeline rank (megatron/training/initialize.py _set_random_seed: `seed = seed_ + (100 *
mpu.get_pipeline_model_parallel_rank())`), the TP-private one from that + 2718 + the TP rank (megatron/core/
tensor_parallel/random.py model_parallel_cuda_manual_seed: `offset = seed + 2718; tensor_model_parallel_seed = offset +
tp_rank`). Seeded alike, stage 1 drew 6 of its 7 dropout states from the states stage 0 drew: layer 2's
attention-residual mask was the embedding dropout's, layers 2-3 repeated layers 0-1's masks.

The live check: an observer (a dispatch mode that changes nothing) records the generator state before every draw
from torch's default generator, which fork() swaps to the private stream, on each rank of a TP 2 x PP 2 run with two
virtual chunks a rank and Megatron's dropout (0.1). No state is drawn on two stages, none twice on a rank, and the TP
ranks of a stage share their shared stream's states."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from parallel.mesh import ParallelDims
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState
from tests.distributed import run_distributed


def _state(pp: int, dp: int, tp: int) -> ParallelState:
    sizes = {"pp": 2, "dp": 2, "tp": 2}
    rank = (pp * sizes["dp"] + dp) * sizes["tp"] + tp  # TP fastest, then DP, then PP (Megatron's order)
    state = ParallelState(device=torch.device("cpu"), dims=ParallelDims.of_rank(rank, sizes))
    assert (state.pipeline_parallel_rank, state.data_parallel_rank, state.tensor_parallel_rank) == (pp, dp, tp)
    return state


@pytest.mark.parametrize("data_parallel_random_init", [False, True])
def test_the_seeds_are_megatrons(data_parallel_random_init):
    """The shared stream of stage p is torch.manual_seed(seed + 100 p), + 10 x the DP rank under
    --data-parallel-random-init (`seed = seed + (10 * mpu.get_data_parallel_rank())`); its private one that + 2718 + the
    TP rank."""
    for pp, dp, tp in itertools.product((0, 1), repeat=3):
        rng = TensorParallelRNG(1234, _state(pp, dp, tp), data_parallel_random_init=data_parallel_random_init)
        shared = torch.rand(4)
        with rng.fork():
            private = torch.rand(4)
        seed = 1234 + 100 * pp + (10 * dp if data_parallel_random_init else 0)
        torch.manual_seed(seed)
        assert torch.equal(shared, torch.rand(4)), (pp, dp, tp)
        torch.manual_seed(seed + 2718 + tp)
        assert torch.equal(private, torch.rand(4)), (pp, dp, tp)


class DrawObserver(TorchDispatchMode):
    """The default CPU generator's state (a digest) before each op that draws from it: seeded ops given no generator of
    their own, on real tensors (the run's planner runs the model on the meta device, which draws nothing); a fused
    attention with dropout 0 draws nothing either."""

    def __init__(self) -> None:
        super().__init__()
        self.states: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        real = any(isinstance(arg, torch.Tensor) and arg.device.type != "meta" for arg in args)
        if torch.Tag.nondeterministic_seeded in func.tags and kwargs.get("generator") is None and real:
            dropout_p = args[3] if "scaled_dot_product" in func.name() and len(args) > 3 else None
            if dropout_p is None or dropout_p > 0:
                self.states.append(hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16])
        return func(*args, **kwargs)


def train_observing_draws(rank, world_size, argv):
    import pretrain_gpt

    observer = DrawObserver()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), observer:
        status = pretrain_gpt.main(argv)
    assert status == 0, f"rank {rank}: exit {status}: {err.getvalue()[-2000:]}"
    return observer.states


RUN = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
       "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2",
       "--seed", "7", "--log-interval", "1", "--eval-iters", "0", "--tokenizer-vocab-size", "512", "--device", "cpu",
       "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
       "--num-layers-per-virtual-pipeline-stage", "1", "--hidden-dropout", "0.1", "--attention-dropout", "0.1"]


def test_no_two_stages_draw_from_one_state(corpus_cache):
    states = run_distributed(train_observing_draws, 4, [*RUN, "--data-cache-dir", corpus_cache], timeout=600)
    # ranks: TP fastest, then PP (parallel/mesh.py): 0, 1 stage 0; 2, 3 stage 1
    stage = {rank: rank // 2 for rank in range(4)}
    for rank, drawn in enumerate(states):
        # 2 iterations x 4 micro-batches x 2 layers x (attention, its residual, the MLP's residual), the embedding's too
        assert len(drawn) >= 2 * 4 * 2 * 3, (rank, len(drawn))
        assert len(set(drawn)) == len(drawn), f"rank {rank} drew twice from one state"
    for first in range(4):
        for second in range(first + 1, 4):
            shared = set(states[first]) & set(states[second])
            if stage[first] != stage[second]:
                assert not shared, f"ranks {first} and {second} (stages {stage[first]}, {stage[second]}) drew " \
                                   f"{len(shared)} times from the same state"
            else:  # the TP ranks of a stage: the residual stream's masks agree, the heads' differ
                assert shared and shared != set(states[first]), (first, second, len(shared))


@pytest.mark.slow
def test_dropout_is_one_ranks_where_megatron_seeds_it_alike_and_differs_where_it_does_not(tmp_path):
    """Hidden dropout 0.1 (attention dropout 0), the fuzz's model and settings otherwise: TP 2 without SP draws the
    residual stream's masks from the shared stream, seeded as one rank's, so its losses are one rank's (measured within
    1e-7); PP 2's second stage draws from --seed + 100 (measured 1.2e-3 off in the first loss)."""
    from scripts.tools.layout_fuzz import COMMON, GRAD_NORM_TOLERANCE, LOSS_TOLERANCE
    from tests.forked_runs import logged_iterations

    flags = [*COMMON, "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "8"]
    flags[flags.index("--hidden-dropout") + 1] = "0.1"

    def records(name, layout, ranks):  # on forked ranks: a fresh launch's interpreters took most of the time
        return [(record["loss"], record["grad_norm"])
                for record in logged_iterations(tmp_path, name, [*flags, *layout], ranks)]

    one = records("one", [], 1)
    tensor_parallel = records("tp2", ["--tensor-model-parallel-size", "2"], 2)
    for (loss, norm), (one_loss, one_norm) in zip(tensor_parallel, one, strict=True):
        assert abs(loss - one_loss) <= LOSS_TOLERANCE * one_loss and abs(norm - one_norm) <= GRAD_NORM_TOLERANCE * one_norm
    staged = records("pp2", ["--pipeline-model-parallel-size", "2"], 2)
    assert abs(staged[0][0] - one[0][0]) > 1e-4 * one[0][0], (staged, one)
