"""FP8 under pipeline, context and expert parallelism, with the routed experts, the shared expert and the MTP layers
in FP8 (issue 65), against one process (or EP 1) with the same global batch, fp32 master weights and activations.
Delayed scaling all-reduces (max) every amax over get_amax_reduction_group(with_context_parallel=True), the TP x CP
x DP ranks of one stage (fp8_utils.py get_fp8_context), so:

- PP 2 x TP 2 computes one process's casts: delayed scaling with an MTP layer (last stage, in FP8 as Megatron's
  global FP8 context) gives one process's losses bit for bit, and so does a MoE (4 experts, a shared expert, SP)
  at ETP 2, but where an fp32 value falls on an FP8 rounding boundary (Zen 4: 2.8e-6 at iteration 2, 8.3e-5 at 3).
  --first-last-layers-bf16 counts global layer numbers (is_first_last_bf16_layer): with one layer at the start in
  bf16, stage 1's layer 1 is in FP8; within 1e-5 relative, its bf16 layer 0 computing in fp32 where TP 2 sums K
  halves in another order (1.3e-6 at iteration 3).
- CP 2 x TP 2: the amax over the CP ranks is the whole sequence's, so the forward casts are one process's; within
  3e-4 relative (iteration 1 equal, 1.8e-4 at 2, 7e-5 at 3): each CP rank's output gradients are twice one
  process's (Megatron's loss_func), and TE's initial scale 1 casts them into e5m2's subnormals at the first step,
  as in the data-parallel test. fp32 CP 2 without FP8 is within 1e-7. (Tensorwise CP 2 scales each rank's half on
  its own, as TE's current scaling reduces no amax over CP: 1.4e-4 at iteration 1, not tested.)
- EP 2 against EP 1 (both over 2 DP ranks), not bitwise, as in TE: a stateless recipe's expert casts the rows it
  computes with their own amax (at EP 2 both ranks' tokens together); delayed scaling reduces the autocast's amax
  buffer elementwise (TE's torch.cat of every module's amaxes), a GroupedLinear's by local index, so the max spans
  the experts at one local index across EP ranks: the scales are not EP 1's (1e-3 relative). Clipping is off."""

import json
import os

import pytest

from tests.distributed import free_port, run_distributed

ITERS = 3
COMMON = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2", "--seq-length", "32",
          "--max-position-embeddings", "32", "--train-iters", str(ITERS), "--seed", "1", "--log-interval", "1",
          "--eval-iters", "0", "--tokenizer-vocab-size", "512", "--device", "cpu", "--hidden-dropout", "0",
          "--attention-dropout", "0", "--global-batch-size", "2", "--clip-grad", "0", "--fp8-format", "hybrid",
          "--position-embedding-type", "rope"]
TP2 = ["--tensor-model-parallel-size", "2", "--micro-batch-size", "2"]
# Megatron-LM's MoE spelling (its functional tests'): 4 experts, top 2, a shared expert
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
       "alltoall", "--moe-shared-expert-intermediate-size", "64", "--micro-batch-size", "1"]

MOE_PP = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-grouped-gemm", "--moe-token-dispatcher-type",
          "alltoall", "--moe-shared-expert-intermediate-size", "64", "--sequence-parallel"]
# name: (flags, the one-process run's flags, relative tolerance)
STAGES = {
    "delayed-pp2-tp2-mtp": (["--fp8-recipe", "delayed", "--mtp-num-layers", "1", *TP2,
                             "--pipeline-model-parallel-size", "2"], ["--fp8-recipe", "delayed", "--mtp-num-layers", "1"],
                            0.0),
    "mxfp8-pp2-tp2-first-bf16": (["--fp8-recipe", "mxfp8", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
                                  "1", "--num-layers-at-end-in-bf16", "0", *TP2, "--pipeline-model-parallel-size", "2"],
                                 ["--fp8-recipe", "mxfp8", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16",
                                  "1", "--num-layers-at-end-in-bf16", "0"], 1e-5),
    # the experts split over the TP ranks (ETP = TP 2: each expert's fc1 column- and fc2 row-parallel), the guard's
    # verdicts reduced over the expert tensor-parallel group
    # bitwise on the Zen 3 machine it was first measured on; on a Zen 4 (AVX-512 BF16) 2.8e-6 relative at iteration 2
    # and 8.3e-5 at 3: the expert's row-parallel fc2 sums its K halves in another order, one cast lands across an FP8
    # boundary and the runs part from there (a wrong amax group parts them by 1e-3: the EP test below)
    "delayed-pp2-tp2-moe": (["--fp8-recipe", "delayed", *MOE_PP, *TP2, "--pipeline-model-parallel-size", "2"],
                            ["--fp8-recipe", "delayed", *MOE_PP], 2e-4),
    "delayed-cp2-tp2": (["--fp8-recipe", "delayed", *TP2, "--context-parallel-size", "2"],
                        ["--fp8-recipe", "delayed"], 3e-4),
}


def _launch_rank(rank, world_size, argvs, ports):
    import pretrain_gpt

    for argv, port in zip(argvs, ports):
        os.environ["MASTER_PORT"] = str(port)
        assert pretrain_gpt.main(argv) == 0


def _losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r and "split" not in r]


def _argv(tmp_path, corpus_cache, name, *flags):
    return [*COMMON, "--data-cache-dir", corpus_cache, "--metrics-file", str(tmp_path / f"{name}.jsonl"), *flags]


def _assert_close(losses, reference, rel, name):
    assert len(losses) == len(reference) == ITERS, (name, losses, reference)
    for iteration, (got, want) in enumerate(zip(losses, reference), start=1):
        assert abs(got - want) <= rel * abs(want), f"{name} iteration {iteration}: {got} vs {want}"


@pytest.mark.slow
def test_pipeline_and_context_parallel_fp8_equal_one_process(tmp_path, corpus_cache):
    import pretrain_gpt

    for name, (_, single, _) in STAGES.items():
        assert pretrain_gpt.main(_argv(tmp_path, corpus_cache, f"{name}-one", *single, "--micro-batch-size", "2")) == 0
    argvs = [_argv(tmp_path, corpus_cache, name, *flags) for name, (flags, _, _) in STAGES.items()]
    run_distributed(_launch_rank, 4, argvs, [free_port() for _ in argvs], timeout=600)
    for name, (_, _, rel) in STAGES.items():
        _assert_close(_losses(tmp_path / f"{name}.jsonl"), _losses(tmp_path / f"{name}-one.jsonl"), rel, name)
    # Layer 1 (stage 1's only layer) is in FP8 under PP: both layers in high precision part from it by more than 5x
    # the tolerance (measured 7.6e-5; stage-local numbers would have made it layer 0 of its stage, in bf16).
    assert pretrain_gpt.main(_argv(tmp_path, corpus_cache, "mxfp8-both-bf16", "--fp8-recipe", "mxfp8",
                                   "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "1",
                                   "--num-layers-at-end-in-bf16", "1", "--micro-batch-size", "2")) == 0
    both = _losses(tmp_path / "mxfp8-both-bf16.jsonl")
    pipelined = _losses(tmp_path / "mxfp8-pp2-tp2-first-bf16.jsonl")
    assert max(abs(a - b) / abs(b) for a, b in zip(pipelined, both)) > 5 * STAGES["mxfp8-pp2-tp2-first-bf16"][2]


# measured: tensorwise 3.8e-4 at iteration 1, delayed 6.7e-4 at iteration 2 (iteration 1 equal: every scale is TE's
# initial 1 there)
EXPERTS = {"tensorwise": 1e-3, "delayed": 1e-3}


@pytest.mark.slow
def test_expert_parallel_fp8_against_expert_parallel_1_and_resume(tmp_path, corpus_cache):
    argvs, names = [], []
    for recipe in EXPERTS:
        for ep in ("1", "2"):
            names.append(f"{recipe}-ep{ep}")
            argvs.append(_argv(tmp_path, corpus_cache, names[-1], *MOE, "--fp8-recipe", recipe,
                               "--expert-model-parallel-size", ep))
    # delayed EP 2 saved at iteration 2 and resumed: each expert-parallel rank's experts' histories are in the save
    save = str(tmp_path / "ckpt")
    resume = [*MOE, "--fp8-recipe", "delayed", "--expert-model-parallel-size", "2", "--save", save]
    argvs.append(_argv(tmp_path, corpus_cache, "saved", *resume, "--exit-interval", "2"))
    argvs.append(_argv(tmp_path, corpus_cache, "resumed", *resume, "--load", save))
    run_distributed(_launch_rank, 2, argvs, [free_port() for _ in argvs], timeout=600)
    for recipe, rel in EXPERTS.items():
        ep1, ep2 = (_losses(tmp_path / f"{recipe}-ep{ep}.jsonl") for ep in ("1", "2"))
        _assert_close(ep2, ep1, rel, recipe)
    resumed = [(r["iteration"], r["loss"]) for r in map(json.loads, open(tmp_path / "resumed.jsonl")) if "loss" in r]
    assert resumed == [(3, _losses(tmp_path / "delayed-ep2.jsonl")[2])]
    # The save holds every expert's history, each from its expert-parallel rank (checkpoint/fp8_state.py), and shows
    # TE's reduction by local index: expert 0 (rank 0's first) and expert 2 (rank 1's first) hold one history.
    saved = json.loads((tmp_path / "ckpt" / "iter_0000002" / "metadata.json").read_text())["fp8_amax_history"]
    experts = [f"blocks.{layer}.mlp.experts.{expert}.{part}" for layer in (0, 1) for expert in range(4)
               for part in ("dense_h_to_4h", "dense_4h_to_h")]
    assert set(experts) <= set(saved)
    assert all(saved[name.replace("experts.0.", "experts.2.")] == saved[name] for name in experts if "experts.0." in name)
    assert saved["blocks.0.mlp.experts.0.dense_h_to_4h"] != saved["blocks.0.mlp.experts.1.dense_h_to_4h"]
