"""MoE with tensor parallelism end to end through pretrain_gpt.py (issue 51's acceptance: "also with TP 2 x EP 2
(expert TP 1 and 2)"): 4 experts, top-2, dropless, fp32 on CPU gloo, 5 iterations, against the plain TP 1 EP 1 run
on the same 4 ranks and the same global batch.

Megatron-Core is the spec. With TP the MoE layer runs on the sequence-parallel slices (MoELayer.forward refuses TP
without --sequence-parallel in training, megatron/core/transformer/moe/moe_layer.py); the router is replicated
over TP with its gradient summed over the TP group (router.py Router: `setattr(self.weight, 'sequence_parallel',
...)`) and its balancing losses count tokens over the tp_cp group (moe_utils.py
get_tokens_per_expert_and_token_count; apply_z_loss divides the coefficient by the tp_cp size); with expert TP 2
(megatron/training/arguments.py: --expert-tensor-parallel-size defaults to --tensor-model-parallel-size) each
expert's linear_fc1 is column- and linear_fc2 row-split over the expert TP group (experts.py), the dispatchers
gather the ETP peers' rows and sum their partial outputs (token_dispatcher.py, tp_ep_group / tp_group paths).

Equal to <= 1e-6 relative, not bitwise: the loss is a mean over micro-batches accumulated in another order (2
data-parallel ranks x 2 micro-batches against 4 x 1), the router's and the experts' gradients are sums over the TP
slices and the expert data-parallel group in another order, each balancing loss is a sum of the TP slices' shares,
and under expert TP each expert's output is the sum of two partial matmuls."""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, run_main
from tests.training.test_moe_training import launch_rank

# tests/training/test_moe_training.py's MoE model (aux loss and z-loss on), dispatcher chosen per run
MOE = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
       "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-grouped-gemm", "--seed", "5"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2"]


def logged(path):
    return [(r["loss"], r["grad_norm"], r["load_balancing_loss"], r["z_loss"])
            for r in map(json.loads, path.read_text().splitlines()) if "loss" in r and "split" not in r]


def run_variants(corpus, tmp_path, variants, common=()):
    argv = [TINY + MOE + ["--train-iters", "5", "--global-batch-size", "8", "--data-cache-dir", corpus,
                          "--moe-per-layer-logging", *common] + extra
            + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in variants.items()]
    run_distributed(launch_rank, 4, argv, [free_port() for _ in variants], timeout=900)
    return {name: logged(tmp_path / f"{name}.jsonl") for name in variants}


def tokens_per_expert(path):
    return [r["moe_per_layer"]["tokens_per_expert"] for r in map(json.loads, path.read_text().splitlines())
            if "moe_per_layer" in r]


def assert_equal_runs(runs, tmp_path, reference="tp1"):
    expected = [value for record in runs[reference] for value in record]
    assert len(runs[reference]) == 5
    for name, records in runs.items():
        assert [value for record in records for value in record] == pytest.approx(expected, rel=1e-6, abs=0), name
        # every expert's tokens, summed over the TP slices and data-parallel ranks: 8 sequences x 16 x top-2
        counts = tokens_per_expert(tmp_path / f"{name}.jsonl")
        assert counts and all(sum(layer) == 8 * 16 * 2 for record in counts for layer in record), name
        assert counts == tokens_per_expert(tmp_path / f"{reference}.jsonl"), name


@pytest.mark.slow
@pytest.mark.parametrize("expert_tp", ["1", "2"])
def test_tensor_parallel_2_by_expert_parallel_2_trains_as_tp_1_ep_1_with_both_dispatchers(corpus_cache_300,
                                                                                          tmp_path, expert_tp):
    """4 ranks. Expert TP 1: the expert-parallel groups are the TP pairs {0,1} {2,3} (each TP rank holds 2 whole
    experts and routes its sequence slice), the expert data-parallel groups the DP pairs. Expert TP 2: the ETP
    groups are the TP pairs, each rank holding half of each of its EP rank's experts, EP over {0,2} {1,3}."""
    etp = [] if expert_tp == "2" else ["--expert-tensor-parallel-size", "1"]  # 2 is Megatron's default (= TP)
    runs = run_variants(corpus_cache_300, tmp_path, {
        "tp1": [],
        "alltoall": TP2 + etp + ["--moe-token-dispatcher-type", "alltoall"],
        "allgather": TP2 + etp + ["--moe-token-dispatcher-type", "allgather"]})
    assert_equal_runs(runs, tmp_path)


@pytest.mark.slow
def test_tensor_parallel_2_without_expert_parallelism_trains_as_tp_1(corpus_cache_300, tmp_path):
    """TP 2 at EP 1: with expert TP 1 every TP rank holds every expert whole and runs its own sequence slice through
    them, so the experts' gradients are reduced over the expert data-parallel group of all 4 ranks (TP x DP, not the
    dense DP group); with expert TP 2 (the default) each expert is split over the TP pair and the dispatcher
    gathers the pair's rows (Megatron-Core's expert tensor-and-model group is then the TP group)."""
    runs = run_variants(corpus_cache_300, tmp_path, {
        "tp1": [],
        "etp1": ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-tensor-parallel-size", "1"],
        "etp2": ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--moe-token-dispatcher-type",
                 "alltoall"]})
    assert_equal_runs(runs, tmp_path)


@pytest.mark.slow
def test_shared_experts_with_gate_under_tp_2_by_ep_2_train_as_tp_1(corpus_cache_300, tmp_path):
    """Megatron-Core's SharedExpertMLP under TP (shared_experts.py): linear_fc1 column- and linear_fc2 row-parallel
    with sequence parallelism's gather and reduce-scatter, the gate on each rank's slice with its weight's gradient
    summed over TP (gate_weight marked sequence_parallel). Beside routed experts at expert TP 2, SwiGLU (the
    shared MLP's two input projections under one gather), the alltoall dispatcher."""
    shared = ["--moe-shared-expert-intermediate-size", "64", "--moe-shared-expert-gate", "--swiglu"]
    runs = run_variants(corpus_cache_300, tmp_path, {
        "tp1": [], "tp2": TP2 + ["--moe-token-dispatcher-type", "alltoall"]}, common=shared)
    assert_equal_runs(runs, tmp_path)


def launch_rank_keeping_codes(rank, world_size, argv_by_run, ports):
    """pretrain_gpt.main for each run in turn: (its exit code, what it wrote to stderr) per run."""
    import contextlib
    import io
    import os

    import pretrain_gpt

    outcomes = []
    for argv, port in zip(argv_by_run, ports):
        os.environ["MASTER_PORT"] = str(port)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = pretrain_gpt.main(argv)
        outcomes.append((code, err.getvalue()))
    return outcomes


@pytest.mark.slow
@pytest.mark.parametrize("expert_tp", ["1", "2"])
def test_a_tp_2_by_ep_2_checkpoint_consolidates_to_the_tp_1_model(corpus_cache_300, tmp_path, expert_tp):
    """The experts are saved under their global names (at expert TP 2 each TP rank's half, their sharding records
    saying which): scripts/tools/zero_to_fp32.py consolidates the TP x EP save (at expert TP 1 each expert is held by
    one TP rank's files) into the whole model the TP 1 x EP 1 run saved at the same iteration, to fp32 rounding.
    That such a checkpoint resumes exactly at its own layout and at the other expert TP size is the conformance
    table's (tests/checkpoint/test_conformance.py)."""
    common = TINY + MOE + ["--train-iters", "4", "--global-batch-size", "8", "--data-cache-dir", corpus_cache_300]
    argv = [common + TP2 + ["--expert-tensor-parallel-size", expert_tp, "--save", str(tmp_path / "ckpt")],
            common + ["--save", str(tmp_path / "tp1")]]
    outcomes = run_distributed(launch_rank_keeping_codes, 4, argv, [free_port() for _ in argv], timeout=900)
    assert [[code for code, _ in rank] for rank in outcomes] == [[0, 0]] * 4, outcomes[0][0][1][-2000:]

    from safetensors.torch import load_file

    from scripts.tools import zero_to_fp32

    for name in ("ckpt", "tp1"):
        assert run_main(zero_to_fp32.main, [str(tmp_path / name), str(tmp_path / f"{name}.safetensors")]).code == 0
    ours, reference = load_file(tmp_path / "ckpt.safetensors"), load_file(tmp_path / "tp1.safetensors")
    assert sorted(ours) == sorted(reference) and any(".mlp.experts.3." in key for key in ours)
    for key, tensor in reference.items():
        rows = tensor.shape[0] if "word_embeddings" in key or "output_layer" in key else None  # TP pads the vocab
        # after 4 Adam steps: an element whose gradient is near 0 moves by about lr x m / sqrt(v), where the
        # gradients' 1e-6 relative differences show as about 1e-6 absolute (the weights are about 0.02-0.1)
        torch.testing.assert_close(ours[key][:rows], tensor[:rows], rtol=1e-5, atol=1e-5, msg=key)


def test_moe_under_tensor_parallelism_refuses_what_it_cannot_run_in_one_line(corpus_cache_300, tmp_path):
    """Megatron-Core's MoELayer.forward raises in training with TP > 1 and no sequence parallelism (moe_layer.py:
    "performance may degrade if MoE and tensor parallelism are enabled without also enabling sequence
    parallelism"); expert TP any size whose grid divides the ranks (parallel/mesh.py, as initialize_model_parallel);
    DeepSpeed-MoE's gating is not tensor-parallel here, and the experts' and shared experts' ffn must split evenly.
    Each refused in one line, exit 2, before any process group exists."""
    import pretrain_gpt

    base = TINY + MOE + ["--data-cache-dir", corpus_cache_300]
    tp2 = ["--tensor-model-parallel-size", "2"]
    for argv, says in ((tp2, "--num-experts with --tensor-model-parallel-size 2 needs --sequence-parallel"),
                       (["--expert-tensor-parallel-size", "2", "--moe-ffn-hidden-size", "33"],
                        "--moe-ffn-hidden-size 33 is not divisible by --expert-tensor-parallel-size 2"),
                       (tp2 + ["--sequence-parallel", "--moe-shared-expert-intermediate-size", "33"],
                        "--moe-shared-expert-intermediate-size 33 is not divisible by --tensor-model-parallel-size 2"),
                       (tp2 + ["--sequence-parallel", "--moe-ffn-hidden-size", "33"],
                        "--moe-ffn-hidden-size 33 is not divisible by --expert-tensor-parallel-size 2")):
        refused = run_main(pretrain_gpt.main, base + argv)
        assert refused.code == 2 and says in refused.err, (argv, refused.err[-1500:])
        assert len(refused.err.strip().splitlines()) == 1, refused.err
    deepspeed = TINY + ["--data-cache-dir", corpus_cache_300, "--num-layers", "2", "--num-experts", "4",
                        "--deepspeed", "--no-pipeline-parallel", "--topk", "2"] + tp2 + ["--sequence-parallel"]
    refused = run_main(pretrain_gpt.main, deepspeed)
    assert refused.code == 2 and "DeepSpeed-MoE's gating" in refused.err, refused.err[-1500:]
    assert len(refused.err.strip().splitlines()) == 1, refused.err


def test_the_dry_run_plans_tp_2_by_ep_2_at_expert_tp_1_and_2():
    """zero.plan's dry run (planner/dry_run.py, the trainer's build on the meta device) at TP 2 x EP 2 on 4 ranks:
    every expert counted once in the total, and each rank's share: at expert TP 1 two whole experts per MoE layer,
    at expert TP 2 half of each of its EP rank's two (the output projection's bias whole on both halves)."""
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run

    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--num-experts", "4", "--zero-stage", "0", "--tensor-model-parallel-size", "2", "--sequence-parallel",
            "--expert-model-parallel-size", "2"]
    plans = {etp: dry_run(parse_config(argv + ["--expert-tensor-parallel-size", etp]), Cluster(4, 4, None, "cpu"),
                          300, 0) for etp in ("1", "2")}
    whole = 2 * 32 * 128 + 128 + 32  # one expert: GPT-2's MLP at hidden 32 (fc1 and fc2 with biases)
    half = 32 * 64 + 64 + 64 * 32 + 32  # its half at expert TP 2: fc1's rows and bias, fc2's columns, fc2's bias
    assert plans["1"].parameters_total == plans["2"].parameters_total
    assert plans["1"].parameters_local - plans["2"].parameters_local == 2 * 2 * (whole - half)


@pytest.mark.slow
def test_a_mixtral_shaped_tp_2_by_ep_2_checkpoint_exports_to_hugging_face_as_the_tp_1_one(corpus_cache_300, tmp_path):
    """scripts/tools/convert_to_hf.py from a TP 2 x EP 2 (expert TP 2) save: the MixtralForCausalLM folder holds the
    weights the TP 1 x EP 1 run's folder holds after the same 3 iterations (the experts gathered from their EP
    ranks' TP halves by name), to fp32 rounding; tests/checkpoint/test_hf_moe.py checks such a folder's logits
    against transformers."""
    from safetensors.torch import load_file

    from scripts.tools import convert_to_hf

    mixtral = ["--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
               "--untie-embeddings-and-output-weights"]
    common = TINY + MOE + mixtral + ["--train-iters", "3", "--global-batch-size", "8", "--data-cache-dir",
                                     corpus_cache_300]
    argv = [common + ["--save", str(tmp_path / "tp1"), "--metrics-file", str(tmp_path / "tp1.jsonl")],
            common + TP2 + ["--save", str(tmp_path / "tp2"), "--metrics-file", str(tmp_path / "tp2.jsonl")]]
    run_distributed(launch_rank, 4, argv, [free_port() for _ in argv], timeout=900)
    exported = {}
    for name in ("tp1", "tp2"):
        assert run_main(convert_to_hf.main, [str(tmp_path / name), str(tmp_path / f"{name}_hf")]).code == 0
        (weights,) = (tmp_path / f"{name}_hf").glob("*.safetensors")
        exported[name] = load_file(weights)
    assert sorted(exported["tp1"]) == sorted(exported["tp2"])
    assert any("block_sparse_moe.experts.3.w2" in key for key in exported["tp1"])
    for key, tensor in exported["tp1"].items():
        torch.testing.assert_close(exported["tp2"][key], tensor, rtol=1e-5, atol=1e-5, msg=key)
