"""--hybrid-layer-pattern trains the model its equivalent GPT flags train, bitwise (fp32 on gloo): a dense pattern, an
MoE one with its first block dense, an MTP one (one process each), and pipelined ones at PP 2 (one 2-rank launch:
`|` as the stage boundary, `|` segments as interleaved chunks, an uneven first segment); and pretrain_hybrid.py
takes a Megatron-LM hybrid launch as written (no --num-layers; --spec naming Megatron-Core's hybrid stack;
--is-hybrid-model) and logs the losses of pretrain_gpt.py's launch with --num-layers.

Bitwise, not within a tolerance: the pattern only sets the GPT settings (arguments/megatron/hybrid_layer_pattern.py),
so both launches build the same blocks with the same initial values and run the same steps.
"""

from __future__ import annotations

import pytest

from tests.distributed import free_port, run_distributed
from tests.training.test_pipeline_training import _records, _train, train_configurations

# tests/training/test_pipeline_training.py's MODEL (4 blocks, hidden 32, 5 iterations of 8 micro-batches) gives
# --num-layers 4 itself, which each pattern below agrees with (4 blocks)
EXPERTS = ["--num-experts", "4"]
# multi-latent attention's sizes: `+` layers take them from --multi-latent-attention's flags (gpt/hybrid_pattern.py)
MLA = ["--multi-latent-attention", "--kv-lora-rank", "16", "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "4",
       "--v-head-dim", "8", "--position-embedding-type", "rope"]
# Gated DeltaNet's sizes (`G` layers, gpt/gated_delta_net.py), which need --swiglu (Megatron's SiLU kernels)
GDN = ["--swiglu", "--linear-num-key-heads", "2", "--linear-num-value-heads", "4", "--linear-key-head-dim", "8",
       "--linear-value-head-dim", "8"]
# the GPT flags' GDN layers: every layer but each second one (Megatron-Core's get_linear_attention_pattern)
GDN_FLAGS = ["--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "2", *GDN]
QWEN3_NEXT = ["--attention-output-gate", "--qk-layernorm", "--apply-layernorm-1p", "--normalization", "RMSNorm",
              "--group-query-attention", "--num-query-groups", "2", "--position-embedding-type", "rope",
              "--rotary-percent", "0.5", "--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate",
              "--disable-bias-linear"]
SINGLE = {  # name: (the pattern's flags, the GPT flags)
    "dense": (["--hybrid-layer-pattern", "*-*-*-*-"], []),
    "moe-first-dense": (["--hybrid-layer-pattern", "*-*E*E*E", *EXPERTS], [*EXPERTS, "--moe-layer-freq", "[0]+[1]*3"]),
    "mtp": (["--hybrid-layer-pattern", "*-*-*-*-/*-"], ["--mtp-num-layers", "1"]),
    "all-mla": (["--hybrid-layer-pattern", "+-+-+-+-", *MLA], MLA),
    "mla-moe": (["--hybrid-layer-pattern", "+-+E+-+E", *EXPERTS, *MLA], [*EXPERTS, "--moe-layer-freq", "[0,1]*2", *MLA]),
    "gdn": (["--hybrid-layer-pattern", "G-*-G-*-", *GDN], GDN_FLAGS),
    # Qwen3-Next's blocks: Gated DeltaNet and gated attention (--attention-output-gate) beside it, MoE with a gated
    # shared expert, zero-centered RMSNorm, q/k norms, partial rotary
    "qwen3-next-like": (["--hybrid-layer-pattern", "G-*EGE*E", *EXPERTS, *GDN, *QWEN3_NEXT],
                        [*EXPERTS, "--moe-layer-freq", "[0,1,1,1]", *GDN_FLAGS, *QWEN3_NEXT]),
}
PP2 = ["--pipeline-model-parallel-size", "2"]
PIPELINED = {  # name: (the pattern's flags, the GPT flags), each at PP 2
    "stages": (["--hybrid-layer-pattern", "*-*-|*-*-", *PP2], PP2),
    # segment k is chunk k // PP of rank k mod PP (select_pipeline_segment), as --num-layers-per-virtual-pipeline-stage
    "interleaved-moe": (["--hybrid-layer-pattern", "*-|*E|*E|*E", *EXPERTS, *PP2],
                        [*EXPERTS, "--moe-layer-freq", "[0]+[1]*3", "--num-layers-per-virtual-pipeline-stage", "1",
                         *PP2]),
    "uneven": (["--hybrid-layer-pattern", "*-|*-*-*-", *PP2], ["--decoder-first-pipeline-num-layers", "1", *PP2]),
}


@pytest.mark.parametrize("name", SINGLE)
def test_a_pattern_trains_its_gpt_flags_losses_bitwise(name):
    pattern, gpt = SINGLE[name]
    from_pattern, from_flags = _train(pattern, 1).outcomes, _train(gpt, 1).outcomes
    assert from_pattern == from_flags, name
    if name != "dense":  # the pattern's E and / change the model: not the dense one
        assert from_pattern != _train([], 1).outcomes, name


def test_a_gated_delta_net_pattern_learns(tmp_path):
    """`G-*-` through pretrain_gpt.py on Megatron's mock data (ids counting up inside each document, so a model that
    reads the previous token learns fast) over 80 tokens, two of the delta rule's chunks: the loss falls (measured
5.55 -> 4.56 in 12 steps)."""
    import json

    import pretrain_gpt

    metrics = tmp_path / "metrics.jsonl"
    assert pretrain_gpt.main([
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "255", "--hybrid-layer-pattern", "G-*-",
        *GDN, "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "80",
        "--max-position-embeddings", "80", "--micro-batch-size", "4", "--global-batch-size", "4", "--train-iters",
        "12", "--lr", "1e-2", "--log-interval", "1", "--eval-iters", "0", "--device", "cpu", "--hidden-dropout", "0",
        "--attention-dropout", "0", "--data-cache-dir", str(tmp_path / "cache"), "--metrics-file", str(metrics)]) == 0
    losses = [record["loss"] for record in map(json.loads, open(metrics)) if "loss" in record
              and record.get("split") is None]
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.5, losses


@pytest.mark.slow
def test_gated_delta_net_layers_train_at_tp2_sp_pp2_and_zero3_as_on_one_rank():
    """Qwen3-Next's blocks (`G-*EGE*E`: Gated DeltaNet, gated attention, MoE) at TP 2 with --sequence-parallel (each
    rank one query/key head with its two value heads), at PP 2 (`|` as the stage boundary) and under ZeRO stage 3 at
    DP 2 log their one-rank losses and gradient norms within the layout fuzz's fp32 tolerances."""
    from scripts.tools.layout_fuzz import GRAD_NORM_TOLERANCE, LOSS_TOLERANCE

    model = [*EXPERTS, *GDN, *QWEN3_NEXT]
    pattern = ["--hybrid-layer-pattern", "G-*EGE*E", *model]
    one_rank = _train(pattern, 1).outcomes
    configs = {"tp2-sp": ([*pattern, "--sequence-parallel"], 2),
               "pp2": (["--hybrid-layer-pattern", "G-*E|GE*E", *model, *PP2], 1),
               "zero3-dp2": ([*pattern, "--zero-stage", "3"], 1)}
    per_rank = run_distributed(train_configurations, 2, configs, [free_port() for _ in configs], timeout=300)
    for name in configs:
        outcomes = per_rank[0][name].outcomes
        assert [loss for loss, _ in outcomes] == pytest.approx([loss for loss, _ in one_rank], rel=LOSS_TOLERANCE,
                                                                abs=0), name
        assert [norm for _, norm in outcomes] == pytest.approx([norm for _, norm in one_rank],
                                                                rel=GRAD_NORM_TOLERANCE, abs=0), name


@pytest.mark.slow
def test_pipelined_patterns_train_their_gpt_flags_losses_bitwise():
    configs = {f"{name}-{side}": (flags, 1) for name, sides in PIPELINED.items()
               for side, flags in zip(("pattern", "gpt"), sides)}
    per_rank = run_distributed(train_configurations, 2, configs, [free_port() for _ in configs], timeout=300)
    for name in PIPELINED:
        for rank_results in per_rank:
            assert rank_results[f"{name}-pattern"].outcomes == rank_results[f"{name}-gpt"].outcomes, name


HYBRID_LAUNCH = ["--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
                 "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
                 "--train-iters", "3", "--seed", "1", "--log-interval", "1", "--eval-iters", "0",
                 "--tokenizer-vocab-size", "512", "--device", "cpu", "--hidden-dropout", "0", "--attention-dropout", "0",
                 "--num-experts", "4"]
# as docs/user-guide/hybrid-model-migration.md @ d98e8a64 writes the launch: the pattern, no --num-layers, the spec
MEGATRON_HYBRID = ["--hybrid-layer-pattern", "*-*E", "--is-hybrid-model",
                   "--spec", "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec"]


def test_pretrain_hybrid_takes_a_megatron_hybrid_launch(tmp_path, corpus_cache):
    import pretrain_gpt
    import pretrain_hybrid

    hybrid, gpt = tmp_path / "hybrid.jsonl", tmp_path / "gpt.jsonl"
    common = [*HYBRID_LAUNCH, "--data-cache-dir", corpus_cache]
    assert pretrain_hybrid.main([*common, *MEGATRON_HYBRID, "--metrics-file", str(hybrid)]) == 0
    assert pretrain_gpt.main([*common, "--num-layers", "2", "--moe-layer-freq", "[0,1]",
                              "--metrics-file", str(gpt)]) == 0
    assert len(_records(hybrid, "loss")) == 3
    assert _records(hybrid, "loss") == _records(gpt, "loss")


MIXED = ["--hybrid-layer-pattern", "*-+-*-+-", *MLA]  # attention and MLA blocks in one model


@pytest.mark.slow
def test_attention_and_mla_in_one_model_train_at_tp2_and_pp2_as_on_one_rank():
    """The mixed pattern at TP 2 with --sequence-parallel, and at PP 2 with `|` as the stage boundary, logs its
    one-rank losses and gradient norms within the layout fuzz's fp32 tolerances; and it is not the all-MLA model."""
    from scripts.tools.layout_fuzz import GRAD_NORM_TOLERANCE, LOSS_TOLERANCE

    one_rank = _train(MIXED, 1).outcomes
    assert one_rank != _train(SINGLE["all-mla"][0], 1).outcomes
    configs = {"tp2-sp": ([*MIXED, "--sequence-parallel"], 2),
               "pp2": (["--hybrid-layer-pattern", "*-+-|*-+-", *MLA, *PP2], 1)}
    per_rank = run_distributed(train_configurations, 2, configs, [free_port() for _ in configs], timeout=300)
    for name in configs:
        outcomes = per_rank[0][name].outcomes
        assert [loss for loss, _ in outcomes] == pytest.approx([loss for loss, _ in one_rank], rel=LOSS_TOLERANCE,
                                                                abs=0), name
        assert [norm for _, norm in outcomes] == pytest.approx([norm for _, norm in one_rank],
                                                                rel=GRAD_NORM_TOLERANCE, abs=0), name


# Mamba layers and one-part blocks beside attention (gpt/mamba.py): 8 heads of 8 in 2 groups at hidden 32
MAMBA_MIXED = ["--hybrid-layer-pattern", "M-*M--*-", "--mamba-head-dim", "8", "--mamba-num-groups", "2",
               "--mamba-state-dim", "8"]


@pytest.mark.slow
@pytest.mark.parametrize("pattern", [MIXED, MAMBA_MIXED, ["--hybrid-layer-pattern", "G-*-", *GDN]],
                         ids=["attention-mla", "mamba", "gdn"])
def test_a_mixed_pattern_saved_on_one_rank_resumes_at_tp2_with_the_straight_runs_losses(pattern, corpus_cache_300,
                                                                                        tmp_path):
    """The mixers' parameters are saved under their own names (this project's format; a Mamba layer's split parts
    each by its record): the mixed model (attention beside MLA, Mamba or Gated DeltaNet) saved at iteration 2 on one
    rank continues at TP 2 + SP to the straight one-rank run's losses (fp32 tolerance)."""
    import pretrain_gpt
    from scripts.tools.layout_fuzz import LOSS_TOLERANCE
    from tests.reliability_helpers import TINY, metrics_records
    from tests.training.test_moe_training import launch_rank

    tiny = TINY[2:] if TINY[:2] == ["--num-layers", "1"] else TINY  # the pattern sets the depth
    argv = [*tiny, *pattern, "--train-iters", "4", "--data-cache-dir", corpus_cache_300]
    straight, parts, save = tmp_path / "straight.jsonl", tmp_path / "parts.jsonl", tmp_path / "ckpt"
    assert pretrain_gpt.main([*argv, "--metrics-file", str(straight)]) == 0
    assert pretrain_gpt.main([*argv, "--metrics-file", str(parts), "--save", str(save), "--exit-interval", "2"]) == 0
    resumed = [*argv, "--tensor-model-parallel-size", "2", "--sequence-parallel", "--load", str(save),
               "--metrics-file", str(tmp_path / "resumed.jsonl")]
    run_distributed(launch_rank, 2, [resumed], [free_port()], timeout=300)

    def losses(path):
        return {r["iteration"]: r["loss"] for r in metrics_records(path) if "loss" in r and "split" not in r}

    after = losses(tmp_path / "resumed.jsonl")
    assert sorted(after) == [3, 4]  # continued, not restarted
    assert [after[i] for i in (3, 4)] == pytest.approx([losses(straight)[i] for i in (3, 4)], rel=LOSS_TOLERANCE,
                                                       abs=0)


MIXED_SMALL = ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
               "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", *MIXED]


@pytest.mark.slow
def test_a_mixed_pattern_at_cp2_and_at_zero3_dp2_trains_to_its_one_rank_losses(tmp_path):
    """The mixed pattern at --context-parallel-size 2 (both mixers' CP paths: attention's ring and MLA's) and at
    --zero-stage 3 over DP 2 (both mixers' parameters partitioned) logs its one-rank fp32 losses and gradient norms
    within the layout fuzz's tolerances."""
    from scripts.tools.layout_fuzz import COMMON, GRAD_NORM_TOLERANCE, LOSS_TOLERANCE
    from tests.forked_runs import logged_iterations

    one = logged_iterations(tmp_path, "one", [*COMMON, *MIXED_SMALL], 1)
    assert len(one) > 0
    for name, flags in {"cp2": ["--context-parallel-size", "2"], "zero3-dp2": ["--zero-stage", "3"]}.items():
        two = logged_iterations(tmp_path, name, [*COMMON, *MIXED_SMALL, *flags], 2)
        assert len(two) == len(one), name
        for mine, theirs in zip(two, one):
            assert mine["loss"] == pytest.approx(theirs["loss"], rel=LOSS_TOLERANCE, abs=0), (name, mine, theirs)
            assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=GRAD_NORM_TOLERANCE, abs=0), \
                (name, mine, theirs)


# Mamba-2 layers (gpt/mamba.py) at a small size: 8 heads of 16 (2 x hidden 64), 2 groups, a state of 16
MAMBA = ["--mamba-head-dim", "16", "--mamba-num-groups", "2", "--mamba-state-dim", "16"]


def test_pretrain_hybrid_trains_mamba_layers_as_megatron_writes_them(tmp_path, corpus_cache):
    """A Nemotron-H-shaped launch (`M` layers without an MLP, `-` MLP layers without a mixer, attention with its MLP)
    through pretrain_hybrid.py as written (no --num-layers): it trains and its loss falls."""
    import pretrain_hybrid

    metrics = tmp_path / "mamba.jsonl"
    launch = HYBRID_LAUNCH[:HYBRID_LAUNCH.index("--num-experts")]
    launch[launch.index("--train-iters") + 1] = "6"
    assert pretrain_hybrid.main([*launch, "--hybrid-layer-pattern", "M-M*-", "--is-hybrid-model", *MAMBA,
                                 "--lr", "3e-3", "--data-cache-dir", corpus_cache, "--metrics-file", str(metrics)]) == 0
    losses = _records(metrics, "loss")
    assert len(losses) == 6 and losses[-1] < losses[0] - 0.1, losses


@pytest.mark.slow
def test_mamba_layers_train_at_tp2_pp2_and_zero3_as_on_one_rank():
    """Heads and groups split over TP (in_proj's and the conv's parts each on its own), out_proj row-parallel: a
    Mamba pattern at TP 2, with --sequence-parallel, on two pipeline stages (`|` between segments) and
    under ZeRO-3 at DP 2 logs its one-rank losses and gradient norms within the layout fuzz's fp32 tolerances."""
    from scripts.tools.layout_fuzz import GRAD_NORM_TOLERANCE, LOSS_TOLERANCE

    mamba = ["--mamba-head-dim", "8", "--mamba-num-groups", "2", "--mamba-state-dim", "8"]
    pattern = ["--hybrid-layer-pattern", "M-*-M-*-", *mamba]
    one_rank = _train(pattern, 1).outcomes
    configs = {"tp2": (pattern, 2), "tp2-sp": ([*pattern, "--sequence-parallel"], 2),
               "pp2": (["--hybrid-layer-pattern", "M-*-|M-*-", *mamba, *PP2], 1),
               "zero3-dp2": ([*pattern, "--zero-stage", "3"], 1)}
    per_rank = run_distributed(train_configurations, 2, configs, [free_port() for _ in configs], timeout=300)
    for name in configs:
        outcomes = per_rank[0][name].outcomes
        assert [loss for loss, _ in outcomes] == pytest.approx([loss for loss, _ in one_rank], rel=LOSS_TOLERANCE,
                                                                abs=0), name
        assert [norm for _, norm in outcomes] == pytest.approx([norm for _, norm in one_rank],
                                                                rel=GRAD_NORM_TOLERANCE, abs=0), name


# Megatron-LM core_v0.19.0's examples/mamba/train.sh as written, both of its MODEL_SCALE cases, shrunk in size only:
# hidden 256 (Megatron's default 128-wide state, 64-wide heads and 8 groups then give 8 Mamba heads), sequence 32,
# 2 iterations, the 800M's global batch 32 -> 4; a vocabulary-size tokenizer, no checkpoints or data paths
TRAIN_SH_SCALES = {  # scale: (TP, pattern, attention heads, micro batch, global batch)
    "800M": (1, "M-M-M--M-*M-M-M-M--*M-M-M-M-*M--M-M-M-*M-M--M-M-", 16, 2, 4),
    "8B": (4, "M-M-M--M-M*-M-M-M-M--M*-M-M-M-M-M*--M-M-M-M-M*-M--M-M-M-", 32, 4, 8),
}


def mamba_train_sh(scale: str) -> list[str]:
    tp, pattern, heads, micro_batch, global_batch = TRAIN_SH_SCALES[scale]
    return ["--tensor-model-parallel-size", str(tp), "--sequence-parallel", "--pipeline-model-parallel-size", "1",
            "--use-distributed-optimizer", "--overlap-param-gather", "--overlap-grad-reduce",
            "--untie-embeddings-and-output-weights", "--init-method-std", "0.02", "--position-embedding-type", "none",
            "--hybrid-layer-pattern", pattern, "--hidden-size", "256", "--num-attention-heads", str(heads),
            "--group-query-attention", "--num-query-groups", "8", "--seq-length", "32",
            "--max-position-embeddings", "32", "--train-iters", "2", "--split", "99,1,0", "--micro-batch-size",
            str(micro_batch), "--global-batch-size", str(global_batch), "--lr", "2.5e-4", "--min-lr", "2.5e-5",
            "--lr-decay-style", "cosine", "--weight-decay", "0.1", "--clip-grad", "1.0", "--attention-dropout", "0.0",
            "--hidden-dropout", "0.0", "--disable-bias-linear", "--normalization", "RMSNorm", "--adam-beta1", "0.9",
            "--adam-beta2", "0.95", "--log-interval", "1", "--eval-iters", "0", "--bf16", "--use-mcore-models",
            "--spec", "megatron.core.models.hybrid.hybrid_layer_specs", "hybrid_stack_spec",
            "--no-create-attention-mask-in-dataloader", "--tokenizer-vocab-size", "512", "--device", "cpu"]


@pytest.mark.slow
def test_megatron_examples_mamba_800m_launch_trains_as_written(tmp_path, corpus_cache):
    import pretrain_hybrid

    metrics = tmp_path / "mamba-800m.jsonl"
    assert pretrain_hybrid.main([*mamba_train_sh("800M"), "--data-cache-dir", corpus_cache,
                                 "--metrics-file", str(metrics)]) == 0
    losses = _records(metrics, "loss")
    assert len(losses) == 2 and all(0 < loss < 10 for loss in losses), losses


@pytest.mark.slow
def test_megatron_examples_mamba_8b_launch_trains_at_tp4_through_launch_py(tmp_path, corpus_cache):
    """The 8B case on train.sh's 8 processes (TP 4 x DP 2, SP), through scripts/launch.py in torchrun's place."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    metrics = tmp_path / "mamba-8b.jsonl"
    launched = subprocess.run(
        [sys.executable, str(repo / "scripts" / "launch.py"), "--nproc-per-node", "8", "--master-port",
         str(free_port()), str(repo / "pretrain_hybrid.py"), *mamba_train_sh("8B"), "--data-cache-dir", corpus_cache,
         "--metrics-file", str(metrics)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "TP 4, SP on, PP 1, DP 2" in launched.stdout, launched.stdout[-3000:]
    losses = _records(metrics, "loss")
    assert len(losses) == 2 and all(0 < loss < 10 for loss in losses), losses
