"""The experts' grid decoupled from the dense one (issue 81 item 3): any expert TP x EP x expert DP that Megatron-Core's
initialize_model_parallel takes (megatron/core/parallel_state.py: the expert RankGenerator "tp-ep-dp-pp" over the
same ranks as the dense "tp-cp-dp-pp", its only rule that ETP x EP divides the ranks of a stage), trained through
pretrain_gpt.py against one rank: 4 experts, top-2, dropless, aux and z losses, fp32 on CPU gloo.

The token path is Megatron-Core's for any ETP: the router routes the rank's own tokens (its sequence-parallel slice
under TP, its micro-batch under DP), the dispatcher all-gathers the rows over the expert TP group before the
experts (token_dispatcher.py MoEAlltoAllTokenDispatcher: all-to-all over EP, then gather_from_sequence_parallel_
region over the tp group with output split sizes; MoEAllGatherTokenDispatcher over the tp_ep group) and reduce-
scatters the peers' partial outputs after them; each expert's linear_fc1 is column- and linear_fc2 row-parallel over
the expert TP group (experts.py); the experts' gradients are reduced over the expert DP group, scaled by 1 / DP as
distributed_data_parallel.py scales them (zero/experts.py).

Equal to 1e-6 relative, not bitwise: measured, the LM losses were bitwise one rank's at ETP 2 x TP 1 and at TP 4,
8.5e-8 off at TP 2 x ETP 4, and the gradient norms and balancing losses at most 4.5e-8 off, because the dense
weights' gradient is a mean over the data-parallel ranks summed in another order than one rank's accumulated
micro-batches, and each expert's output is the sum of its ETP peers' partial fc2 products, which fp32 rounds
differently from one matmul. A resume at the saving layout is the same arithmetic: bitwise.
"""

from __future__ import annotations

import json

import pytest

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, run_main
from tests.training.test_moe_training import launch_rank

MOE = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
       "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-grouped-gemm", "--seed", "5",
       "--train-iters", "4", "--global-batch-size", "8", "--moe-per-layer-logging"]


def logged(path) -> dict[int, tuple]:
    """iteration -> (loss, gradient norm, load-balancing loss, z-loss, every layer's tokens per expert)."""
    return {r["iteration"]: (r["loss"], r["grad_norm"], r["load_balancing_loss"], r["z_loss"],
                             r["moe_per_layer"]["tokens_per_expert"])
            for r in map(json.loads, path.read_text().splitlines()) if "loss" in r and "split" not in r}


def assert_close_to(records: dict, reference: dict, name: str) -> None:
    assert sorted(records) == sorted(reference), name
    for iteration, values in records.items():
        # every expert's tokens summed over the ranks (8 sequences x 16 tokens x top-2 a layer) as one rank counts them
        assert values[4] == reference[iteration][4], (name, iteration)
        assert list(values[:4]) == pytest.approx(list(reference[iteration][:4]), rel=1e-6, abs=0), (name, iteration)


def one_rank(argv: list[str]) -> None:
    import pretrain_gpt

    outcome = run_main(pretrain_gpt.main, argv)
    assert outcome.code == 0, outcome.err[-2000:]


@pytest.mark.slow
def test_expert_tp_2_at_tp_1_on_2_ranks_trains_saves_and_resumes_as_one_rank(corpus_cache_300, tmp_path):
    """TP 1 on 2 ranks: the dense model data-parallel over both, each expert's ffn split column/row-parallel over
    both (ETP 2 x EP 1 x expert DP 1: Megatron-Core's parallel folding puts the expert TP group where the dense DP
    group is). Both dispatchers, against one rank. The alltoall run saves at iteration 2: each ETP rank writes its
    half of the experts to its own file (the ETP rank in the name: both ranks are TP rank 0 and EP rank 0), and the
    checkpoint resumes bitwise at its own layout (the same arithmetic) and within 1e-6 on one rank."""
    common = TINY + MOE + ["--data-cache-dir", corpus_cache_300]
    etp2 = ["--expert-tensor-parallel-size", "2"]
    saved = tmp_path / "ckpt" / "iter_0000002"
    runs = {"alltoall": etp2 + ["--moe-token-dispatcher-type", "alltoall", "--save", str(tmp_path / "ckpt"),
                                "--save-interval", "2"],
            "allgather": etp2 + ["--moe-token-dispatcher-type", "allgather"],
            "resumed": etp2 + ["--moe-token-dispatcher-type", "alltoall", "--load", str(saved)]}
    run_distributed(launch_rank, 2, [common + extra + ["--metrics-file", str(tmp_path / f"{name}.jsonl")]
                                     for name, extra in runs.items()], [free_port() for _ in runs], timeout=900)
    one_rank(common + ["--metrics-file", str(tmp_path / "one.jsonl")])
    one_rank(common + ["--load", str(saved), "--metrics-file", str(tmp_path / "one_resumed.jsonl")])
    got = {name: logged(tmp_path / f"{name}.jsonl") for name in (*runs, "one", "one_resumed")}

    assert sorted(got["one"]) == [1, 2, 3, 4]
    for name in ("alltoall", "allgather"):
        assert_close_to(got[name], got["one"], name)
    assert got["resumed"] == {iteration: got["alltoall"][iteration] for iteration in (3, 4)}  # bitwise
    assert_close_to(got["one_resumed"], {iteration: got["alltoall"][iteration] for iteration in (3, 4)}, "one rank")
    assert {path.name for path in saved.glob("model_*")} == {
        "model_tp00.safetensors", "model_tp00_ep000_etp00.safetensors", "model_tp00_ep000_etp01.safetensors"}


@pytest.mark.slow
def test_expert_tp_below_and_above_the_tp_size_on_4_ranks_trains_as_one_rank(corpus_cache_300, tmp_path):
    """ETP < TP: TP 4 + SP with the expert grid ETP 2 x EP 2 over the same 4 ranks (etp groups {0,1} {2,3}, ep
    groups {0,2} {1,3}: each TP rank's sequence slice reaches the ranks of its experts), both dispatchers. ETP > TP:
    TP 2 + SP x DP 2 with every expert split over all 4 ranks (ETP 4, EP 1). 4 heads, so that TP 4 splits them."""
    common = TINY + MOE + ["--num-attention-heads", "4", "--data-cache-dir", corpus_cache_300]
    tp4 = ["--tensor-model-parallel-size", "4", "--sequence-parallel", "--expert-tensor-parallel-size", "2",
           "--expert-model-parallel-size", "2"]
    runs = {"tp4_alltoall": tp4 + ["--moe-token-dispatcher-type", "alltoall"],
            "tp4_allgather": tp4 + ["--moe-token-dispatcher-type", "allgather"],
            "tp2_etp4": ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size",
                         "4", "--moe-token-dispatcher-type", "alltoall"]}
    run_distributed(launch_rank, 4, [common + extra + ["--metrics-file", str(tmp_path / f"{name}.jsonl")]
                                     for name, extra in runs.items()], [free_port() for _ in runs], timeout=900)
    one_rank(common + ["--metrics-file", str(tmp_path / "one.jsonl")])
    reference = logged(tmp_path / "one.jsonl")
    assert sorted(reference) == [1, 2, 3, 4]
    for name in runs:
        assert_close_to(logged(tmp_path / f"{name}.jsonl"), reference, name)


def test_the_dry_run_plans_expert_tp_2_at_tp_1_with_half_of_every_expert_a_rank():
    """zero.plan's dry run (planner/dry_run.py, the trainer's build on the meta device, its expert grid from
    parallel/state.py's virtual_state) at TP 1 on 2 ranks: at ETP 2 each rank holds half of each of the 4 experts of
    both MoE layers (fc1's rows and bias, fc2's columns, fc2's bias whole), at ETP 1 every expert whole."""
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run

    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--num-experts", "4", "--zero-stage", "0", "--moe-token-dispatcher-type", "alltoall"]
    plans = {etp: dry_run(parse_config(argv + ["--expert-tensor-parallel-size", etp]), Cluster(2, 2, None, "cpu"),
                          300, 0) for etp in ("1", "2")}
    whole = 2 * 32 * 128 + 128 + 32  # one expert: GPT-2's MLP at hidden 32 (fc1 and fc2 with biases)
    half = 32 * 64 + 64 + 64 * 32 + 32
    assert plans["1"].parameters_total == plans["2"].parameters_total == plans["1"].parameters_local
    assert plans["1"].parameters_local - plans["2"].parameters_local == 2 * 4 * (whole - half)
