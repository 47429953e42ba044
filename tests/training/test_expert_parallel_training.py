"""Expert parallelism end to end through pretrain_gpt.py (issue 51 items 2 and 6): 4 experts, top-2, dropless,
fp32 on CPU gloo. --expert-model-parallel-size 2 (Megatron-DeepSpeed's --moe-expert-parallel-size) splits each
MoE layer's experts over 2 of the data-parallel ranks (Megatron-Core's parallel folding: the expert-parallel group
is carved out of the data-parallel ranks, megatron/core/parallel_state.py `initialize_model_parallel`'s expert
grid), tokens travel by --moe-token-dispatcher-type (megatron/core/transformer/moe/token_dispatcher.py's
MoEAlltoAllTokenDispatcher and MoEAllGatherTokenDispatcher), and the experts' states live in their own ZeRO over
the expert data-parallel group (zero/experts.py, Megatron-Core's ChainedOptimizer of a dense and an expert
DistributedOptimizer).

EP 2 equals EP 1 to <= 1e-6 relative, not bitwise: the experts' gradients are summed over a different group
(the expert data-parallel group of 1 rank at EP 2 against the 2 data-parallel ranks at EP 1, each divided by the
dense DP size first, as Megatron's expert_gradient_scaling_factor) and the gradient norm is combined from two
parts' sums of squares (ChainedOptimizer.get_grad_norm), so the fp32 additions come in another order."""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed import free_port, run_distributed
from tests.reliability_helpers import TINY, run_main
from tests.training.test_moe_training import launch_rank

# tests/training/test_moe_training.py's MoE model, without its dispatcher choice
MOE = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-load-balancing-type",
       "aux_loss", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-grouped-gemm", "--seed", "5"]


def logged(path):
    return [(r["loss"], r["grad_norm"], r["load_balancing_loss"], r["z_loss"])
            for r in map(json.loads, path.read_text().splitlines()) if "loss" in r and "split" not in r]


def run_variants(corpus, tmp_path, world_size, common, variants):
    argv = [TINY + MOE + ["--train-iters", "5", "--data-cache-dir", corpus] + common + extra
            + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in variants.items()]
    run_distributed(launch_rank, world_size, argv, [free_port() for _ in variants], timeout=600)
    return {name: logged(tmp_path / f"{name}.jsonl") for name in variants}


def assert_equal_runs(runs, reference="ep1"):
    expected = [value for record in runs[reference] for value in record]
    assert len(runs[reference]) == 5
    for name, records in runs.items():
        assert [value for record in records for value in record] == pytest.approx(expected, rel=1e-6, abs=0), name


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["0", "1", "2", "3"])
def test_expert_parallel_2_trains_as_expert_parallel_1_under_each_zero_stage_and_both_dispatchers(
        corpus_cache_300, tmp_path, stage):
    runs = run_variants(corpus_cache_300, tmp_path, 2, ["--global-batch-size", "4", "--zero-stage", stage], {
        "ep1": [],
        "ep2_alltoall": ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"],
        "ep2_allgather": ["--moe-expert-parallel-size", "2", "--moe-token-dispatcher-type", "allgather"]})
    assert_equal_runs(runs)


@pytest.mark.slow
def test_experts_with_xielu_train_at_expert_parallel_2_as_at_1(corpus_cache_300, tmp_path):
    """Each expert's xIELU scalars are held as its weights are, by its expert data-parallel group (their sharding
    record, gpt/moe/experts.py). Read as dense, they went into the dense ZeRO over the whole data-parallel group,
    whose ranks hold different experts, and the gradient norm differed from EP 1's from the second iteration."""
    runs = run_variants(corpus_cache_300, tmp_path, 2, ["--global-batch-size", "4", "--zero-stage", "1", "--xielu"], {
        "ep1": [], "ep2": ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]})
    assert_equal_runs(runs)


@pytest.mark.slow
def test_pipeline_2_by_expert_parallel_2_trains_as_expert_parallel_1(corpus_cache_300, tmp_path):
    """4 ranks: 2 stages x 2 data-parallel ranks, the experts of each stage's MoE layer split over its 2 DP
    ranks; both parts' gradient norms summed over the stages (zero/pipeline_grads.py)."""
    common = ["--global-batch-size", "4", "--pipeline-model-parallel-size", "2", "--zero-stage", "1"]
    runs = run_variants(corpus_cache_300, tmp_path, 4, common, {
        "ep1": [], "ep2": ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]})
    assert_equal_runs(runs)


def launch_rank_routing_to_the_first_experts(rank, world_size, argv_by_run, ports):
    """Every token routed to experts 0 and 1 (their logits raised by 100 before the top-k; the chosen scores'
    softmax is shift-free): at EP 2 the second expert-parallel rank's experts 2 and 3 receive no rows."""
    import gpt.moe.router as router

    original = router.topk_routing

    def to_the_first_experts(logits, settings, expert_bias=None):
        shift = logits.new_zeros(logits.shape[-1])
        shift[:2] = 100.0
        return original(logits + shift, settings, expert_bias)

    router.topk_routing = to_the_first_experts
    launch_rank(rank, world_size, argv_by_run, ports)


@pytest.mark.slow
def test_a_rank_whose_experts_receive_no_tokens_trains_under_zero_3(corpus_cache_300, tmp_path):
    """Megatron-LM #1877 (a rank routing zero tokens to an expert) and DeepSpeed #4808 (a ZeRO-3 hang when an
    expert gets no tokens): the empty experts still run on their empty slice, so every gather and reduction is
    met, and the run equals EP 1 with the same routing."""
    variants = {"ep1": [], "ep2_alltoall": ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type",
                                            "alltoall"],
                "ep2_allgather": ["--expert-model-parallel-size", "2"]}
    argv = [TINY + MOE + ["--train-iters", "5", "--data-cache-dir", corpus_cache_300, "--global-batch-size", "4",
                          "--zero-stage", "3", "--moe-per-layer-logging"] + extra
            + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in variants.items()]
    run_distributed(launch_rank_routing_to_the_first_experts, 2, argv, [free_port() for _ in variants], timeout=600)
    runs = {name: logged(tmp_path / f"{name}.jsonl") for name in variants}
    assert_equal_runs(runs)
    for name in variants:
        counts = [record["moe_per_layer"]["tokens_per_expert"]
                  for record in map(json.loads, (tmp_path / f"{name}.jsonl").read_text().splitlines())
                  if "moe_per_layer" in record]
        assert counts and all(layer == [4 * 16, 4 * 16, 0, 0] for record in counts for layer in record), name


def test_expert_parallelism_refuses_what_it_cannot_run_in_one_line(corpus_cache_300, tmp_path):
    """Megatron-LM's validate_args: `args.num_experts % args.expert_model_parallel_size == 0`, and EP needs
    experts; the flex dispatcher's DeepEP backend asserts an expert TP x EP group of more than one rank
    (tests/gpt/test_moe_flex.py has flex's other checks). (--init-from-hf into an EP run loads: tests/checkpoint/
    test_expert_parallel_checkpoint.py.)"""
    import pretrain_gpt

    base = TINY + ["--data-cache-dir", corpus_cache_300]
    for argv, says in ((["--expert-model-parallel-size", "2"], "--expert-model-parallel-size 2 needs experts"),
                       (MOE + ["--expert-model-parallel-size", "3"], "--num-experts 4 is not divisible by "
                                                                     "--expert-model-parallel-size 3"),
                       (MOE + ["--moe-token-dispatcher-type", "flex"], "DeepEP dispatcher requires TPxEP > 1"),
                       (MOE + ["--expert-tensor-parallel-size", "2"],
                        "--expert-model-parallel-size 1 x --expert-tensor-parallel-size 2 does not divide the 1 ranks"),
                       (MOE + ["--expert-model-parallel-size", "2"], "does not divide")):
        refused = run_main(pretrain_gpt.main, base + argv)
        assert refused.code == 2 and says in refused.err, (argv, refused.err[-1500:])
        assert len(refused.err.strip().splitlines()) == 1, refused.err


def test_the_dry_run_plans_expert_parallelism_with_each_rank_holding_its_share_of_the_experts():
    """The planner builds the rank as the trainer does (training/build.py): at EP 2 each rank holds half of each
    MoE layer's experts, in the experts' own ZeRO part; on the meta device no routing exists, so it assumes
    uniform routing and says so in the plan's notes."""
    from arguments.parser import parse_config
    from planner.dry_run import Cluster, dry_run

    argv = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--num-experts", "4", "--zero-stage", "0"]
    plans = {ep: dry_run(parse_config(argv + ["--expert-model-parallel-size", str(ep)]), Cluster(2, 2, None, "cpu"),
                         300, 0) for ep in (1, 2)}
    mlp = 2 * 32 * 128 + 128 + 32  # one expert: GPT-2's MLP at hidden 32
    assert plans[1].parameters_total == plans[2].parameters_total
    assert plans[1].parameters_local - plans[2].parameters_local == 2 * 2 * mlp  # 2 layers x 2 experts elsewhere
    assert any("MoE routing assumed uniform" in note and "expert-parallel ranks are counted for that routing" in note
               for note in plans[2].notes)


@pytest.mark.slow
def test_expert_parallel_2_with_accumulation_recompute_and_evaluation_trains_as_expert_parallel_1(
        corpus_cache_300, tmp_path):
    """The loop's other paths at EP 2: two micro-batches per iteration (the reducers' no_sync on both ZeRO parts),
    --checkpoint-activations (each MoE layer's dispatch and combine run again in the recompute) and evaluation
    (the dispatchers' exchanges without gradients): losses, gradient norms and validation losses as at EP 1."""
    common = ["--global-batch-size", "8", "--zero-stage", "2", "--checkpoint-activations", "--eval-interval", "5",
              "--eval-iters", "2"]
    runs = run_variants(corpus_cache_300, tmp_path, 2, common, {
        "ep1": [], "ep2": ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]})
    assert_equal_runs(runs)
    validation = {name: [r["loss"] for r in map(json.loads, (tmp_path / f"{name}.jsonl").read_text().splitlines())
                         if r.get("split") == "valid"] for name in runs}
    assert len(validation["ep1"]) == 1 and validation["ep2"] == pytest.approx(validation["ep1"], rel=1e-6, abs=0)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["0", "3"])
def test_saved_at_expert_parallel_2_resumes_at_2_exactly_and_at_1_and_exports_every_expert(
        corpus_cache_300, tmp_path, stage):
    """Issue 51 item 6. The experts are named by global index (each EP rank's model holds its share), so the
    optimizer partitions (each rank's file: its dense then its expert partition, every element named once) load
    by name at any EP size, and each EP rank's experts are in a model file of their own
    (tests/checkpoint/test_expert_parallel_checkpoint.py counts what each rank writes). Resumed at EP 2 the losses continue bitwise;
    at EP 1 they are EP 1's straight run's to 1e-6 (the EP-2 iterations before the save are, module docstring).
    zero_to_fp32 consolidates the EP-2 checkpoint into the EP-1 one's weights."""
    from safetensors.torch import load_file

    from scripts.tools import zero_to_fp32

    common = TINY + MOE + ["--train-iters", "5", "--data-cache-dir", corpus_cache_300, "--global-batch-size", "4",
                           "--zero-stage", stage, "--moe-token-dispatcher-type", "alltoall"]
    ep2 = ["--expert-model-parallel-size", "2"]
    runs = {  # name: [(extra flags, metrics file)] launched one after another
        "ep1": [([], "ep1")], "ep2": [(ep2, "ep2")],
        "ep2_ep2": [(ep2 + ["--save", str(tmp_path / "a"), "--exit-interval", "2"], "ep2_ep2"),
                    (ep2 + ["--load", str(tmp_path / "a")], "ep2_ep2")],
        "ep2_ep1": [(ep2 + ["--save", str(tmp_path / "b"), "--exit-interval", "2"], "ep2_ep1"),
                    (["--load", str(tmp_path / "b")], "ep2_ep1")],
        "ep1_save": [(["--save", str(tmp_path / "c"), "--exit-interval", "2"], "ep1_save")]}
    argv = [common + extra + ["--metrics-file", str(tmp_path / f"{metrics}.jsonl")]
            for launches in runs.values() for extra, metrics in launches]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in argv], timeout=600)
    logs = {name: logged(tmp_path / f"{name}.jsonl") for name in ("ep1", "ep2", "ep2_ep2", "ep2_ep1")}
    assert logs["ep2_ep2"] == logs["ep2"]  # bitwise
    assert_equal_runs({"ep1": logs["ep1"], "ep2_ep1": logs["ep2_ep1"]})

    exported = {}
    for name in ("a", "c"):
        assert zero_to_fp32.main([str(tmp_path / name), str(tmp_path / f"{name}.safetensors")]) == 0
        exported[name] = load_file(str(tmp_path / f"{name}.safetensors"))
    assert set(exported["a"]) == set(exported["c"])
    experts = sorted(key for key in exported["a"] if ".mlp.experts." in key and key.endswith("dense_4h_to_h.weight"))
    assert [key.split(".mlp.experts.")[1].split(".")[0] for key in experts] == ["0", "1", "2", "3"] * 2
    # 1e-6 absolute: two Adam steps of lr 1e-3 on gradients equal to ~1e-7 relative, except where a gradient is
    # mathematically 0 (the key's bias: softmax ignores it) and Adam normalizes rounding noise: ~3e-7 there.
    for key, tensor in exported["c"].items():
        assert torch.allclose(exported["a"][key], tensor, rtol=1e-5, atol=1e-6), key


@pytest.mark.slow
def test_a_mixtral_shaped_checkpoint_saved_at_expert_parallel_2_exports_as_the_one_saved_at_1(
        corpus_cache_300, tmp_path):
    """scripts/tools/convert_to_hf.py from an EP-2 checkpoint: a MixtralForCausalLM with every expert, whose logits are
    those of the same run's EP-1 checkpoint's export (the weights agree to ~1e-7, see above)."""
    from transformers import AutoModelForCausalLM

    from scripts.tools import convert_to_hf

    mixtral = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
               "--untie-embeddings-and-output-weights", "--disable-bias-linear"]
    common = TINY + MOE + mixtral + ["--train-iters", "2", "--data-cache-dir", corpus_cache_300,
                                     "--global-batch-size", "4", "--zero-stage", "1"]
    argv = [common + extra + ["--save", str(tmp_path / name), "--metrics-file", str(tmp_path / f"{name}.jsonl")]
            for name, extra in (("ep1", []), ("ep2", ["--expert-model-parallel-size", "2"]))]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in argv], timeout=600)
    tokens = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = {}
    for name in ("ep1", "ep2"):
        assert convert_to_hf.main([str(tmp_path / name), str(tmp_path / f"{name}_hf")]) == 0
        model = AutoModelForCausalLM.from_pretrained(str(tmp_path / f"{name}_hf"), dtype=torch.float32).eval()
        assert type(model).__name__ == "MixtralForCausalLM" and model.config.num_local_experts == 4
        with torch.no_grad():
            logits[name] = model(tokens).logits
    assert (logits["ep2"] - logits["ep1"]).abs().max() <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("gating", [["--moe-expert-capacity-factor", "0.5"],
                                    ["--moe-gating", "deepspeed", "--topk", "2", "--moe-min-capacity", "1",
                                     "--moe-train-capacity-factor", "0.5"]], ids=["megatron", "deepspeed"])
def test_dropped_choices_are_not_dispatched_at_expert_parallel_2(corpus_cache_300, tmp_path, gating):
    """Token dropping (Megatron-Core's --moe-expert-capacity-factor, DeepSpeed-MoE's capacity) leaves empty choices
    (expert index -1, probability 0): neither dispatcher sends them, and EP 2 trains as EP 1 with each rank's
    capacity from its own tokens, as at EP 1. (Megatron-DeepSpeed's MoE64 example, replayed at EP 2, drops.)"""
    moe = ["--num-layers", "2", "--num-experts", "4", "--moe-grouped-gemm", "--seed", "5"]
    variants = {"ep1": [], "ep2_alltoall": ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type",
                                            "alltoall"],
                "ep2_allgather": ["--expert-model-parallel-size", "2"]}
    argv = [TINY + moe + gating + ["--train-iters", "5", "--data-cache-dir", corpus_cache_300, "--global-batch-size",
                                   "4", "--zero-stage", "1"] + extra
            + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in variants.items()]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in variants], timeout=600)
    runs = {name: [(r["loss"], r["grad_norm"]) for r in map(json.loads, (tmp_path / f"{name}.jsonl").read_text()
                                                                         .splitlines()) if "loss" in r]
            for name in variants}
    assert_equal_runs(runs)


@pytest.mark.slow
def test_the_expert_bias_and_the_global_aux_loss_reduce_over_the_same_ranks_at_expert_parallel_2(
        corpus_cache_300, tmp_path):
    """Megatron-Core reduces the expert bias's token counts and global_aux_loss's over the tensor-and-data-parallel
    group (router.py, `get_tensor_and_data_parallel_group`), which holds the expert-parallel ranks (they are carved
    out of it). Here the counts are each rank's own tokens per expert, every expert (not the dispatcher's local
    rows), summed over the data-parallel group: at EP 2 the bias moves and the loss is as at EP 1."""
    moe = ["--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2", "--moe-router-score-function",
           "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate", "1e-2",
           "--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff", "1e-2", "--seed", "5"]
    variants = {"ep1": [], "ep2": ["--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall"]}
    argv = [TINY + moe + ["--train-iters", "5", "--data-cache-dir", corpus_cache_300, "--global-batch-size", "4"]
            + extra + ["--metrics-file", str(tmp_path / f"{name}.jsonl")] for name, extra in variants.items()]
    run_distributed(launch_rank, 2, argv, [free_port() for _ in variants], timeout=600)
    runs = {name: [(r["loss"], r["grad_norm"], r["global_load_balancing_loss"])
                   for r in map(json.loads, (tmp_path / f"{name}.jsonl").read_text().splitlines()) if "loss" in r]
            for name in variants}
    assert_equal_runs(runs)
