"""The planner on models of `M` (Mamba-2) and `G` (Gated DeltaNet) layers: the performance model's GEMMs of each block
by its own parts, and the dry run's peak against a live run's on CPU ranks (tests/planner/live_memory.py).

Live, hidden 256, sequence 256 (two of M's chunks of 128, four of G's of 64), micro batch 2, ZeRO 1: a Nemotron-H-shaped
pattern with one-part blocks (`M` alone, `-` alone, `*` alone) read 1.00 (366.5 MiB planned, 365.7 measured), and
1.03 at TP 2 with sequence parallelism; a Qwen3-Next-shaped one (G and gated attention) 0.98 (202.4 planned, 197.9
measured); mixer-only `M` blocks under full recompute 1.00 (228.6 planned, 229.1 measured; 1.04 without the scan's
working memory). The dry run measures what each layer saves on the meta device as for every block; what a block's
backward holds beside it is counted from its shapes (planner/dry_run.py block gradients, gpt/shape.py ScanShape)."""

from __future__ import annotations

import dataclasses

import pytest

from arguments.parser import parse_config
from planner.perf_model import block_kinds, forward_gemms
from tests.planner.live_memory import measured_over_predicted
from training.metrics import flops_per_iteration

LIVE = ["--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "256", "--max-position-embeddings", "256",
        "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "1", "--seed", "1", "--log-interval",
        "1", "--eval-iters", "0", "--tokenizer-vocab-size", "512", "--device", "cpu", "--zero-stage", "1",
        "--attention-dropout", "0", "--hidden-dropout", "0", "--normalization", "RMSNorm", "--disable-bias-linear"]
NEMOTRON_H = ["--hybrid-layer-pattern", "M-M-M--M-*M-M-", "--mamba-head-dim", "32", "--mamba-num-groups", "2",
              "--mamba-state-dim", "32", "--position-embedding-type", "none", "--untie-embeddings-and-output-weights",
              "--group-query-attention", "--num-query-groups", "2", "--squared-relu"]
QWEN3_NEXT = ["--hybrid-layer-pattern", "G-G-*-G-G-*-", "--swiglu", "--linear-num-key-heads", "2",
              "--linear-num-value-heads", "4", "--linear-key-head-dim", "64", "--linear-value-head-dim", "64",
              "--position-embedding-type", "rope", "--attention-output-gate"]
CASES = {  # the processes, the flags beside LIVE
    "nemotron-h": (1, NEMOTRON_H),
    "qwen3-next": (1, QWEN3_NEXT),
    "nemotron-h-tp2-sp": (2, [*NEMOTRON_H, "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    # mostly mixer-only `M` blocks under full recompute, micro batch 8: a block's backward is a larger share
    "mamba-blocks-recompute": (1, [*NEMOTRON_H[2:], "--hybrid-layer-pattern", "MMM*-MMM", "--recompute-granularity",
                                   "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
                                   "--micro-batch-size", "8", "--global-batch-size", "8"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_the_planned_peak_matches_the_measured_one_with_m_and_g_layers(case, corpus_cache, tmp_path):
    world, extra = CASES[case]
    line, low, high = measured_over_predicted(world, [*LIVE, *extra, "--data-cache-dir", corpus_cache,
                                                      "--metrics-file", str(tmp_path / "metrics.jsonl")])
    print(case, line)
    assert 0.95 <= low <= high <= 1.05, line


GDN_FLAGS = ["--num-layers", "4", "--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "2",
             "--swiglu", "--linear-num-key-heads", "2", "--linear-num-value-heads", "4", "--linear-key-head-dim", "32",
             "--linear-value-head-dim", "32"]


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("flags", [NEMOTRON_H, GDN_FLAGS], ids=["nemotron-h", "gdn-flags"])
def test_the_gemms_of_m_and_g_blocks_and_one_part_blocks_are_the_models_flops(tp, flags):
    """Every block by its mixer and whether it has an MLP (`M` alone runs none; the GPT flags' G layers by theirs): 3 x
    the GEMMs of every TP rank are the model's FLOPs (the scan's GEMMs round their width down, hence the tolerance)."""
    config = parse_config([*LIVE, *flags, "--seq-length", "32", "--max-position-embeddings", "32",
                           "--tensor-model-parallel-size", str(tp), "--micro-batch-size", "3"])
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=512))
    model, padded = config.model, config.model.padded_vocab_size(tp)
    blocks, logits = forward_gemms(config.model, config.training, padded, tp, *block_kinds(model, slice(None)))
    every_rank = 3 * tp * (sum(g.flops for g in blocks) + logits.flops)
    assert every_rank == pytest.approx(flops_per_iteration(model, 3, padded_vocab_size=padded), rel=1e-3)
    as_probe, _ = forward_gemms(config.model, config.training, padded, tp)  # every block as the probe's (attention, with its MLP)
    assert sum(g.flops for g in as_probe) != sum(g.flops for g in blocks)


# one mixer-only block of each: Mamba at Megatron's head width (64), Gated DeltaNet
MIXER_ONLY = {
    "mamba": ["--hybrid-layer-pattern", "M", "--mamba-head-dim", "64", "--mamba-num-groups", "2", "--mamba-state-dim",
              "32"],
    "gated-delta-net": ["--hybrid-layer-pattern", "G", "--swiglu", "--linear-num-key-heads", "2",
                        "--linear-num-value-heads", "8", "--linear-key-head-dim", "32",
                        "--linear-value-head-dim", "32"],
}


@pytest.mark.parametrize("block", list(MIXER_ONLY))
def test_the_plan_counts_a_mixer_only_blocks_backward_working_memory(block, corpus_cache):
    """A mixer-only block's backward holds its scan's temporaries beside the saved tensors (gpt/shape.py ScanShape),
    measured as tests/planner/test_plan_block_gradients.py measures an MLP's; such a block runs no MLP. Planned over
    measured: 1.03 (M at head width 64: the gated norm's three inner-wide fp32 tensors lead) and 1.00 (G); without
    the scan's term 0.26 and 0.22. (`M-`, whose MLP's backward frees the block's part first: 1.00 by the MLP's term.
    At head widths 32 and 16 against M's chunk of 128 the scan's decay products lead: 1.29 and 0.95.)"""
    from data.corpus import prepare_default_corpus
    from planner.dry_run import Cluster, dry_run
    from tests.planner.test_plan_block_gradients import MODEL, measured_block_gradients

    config = parse_config([*MODEL, *MIXER_ONLY[block], "--num-attention-heads", "4", "--normalization", "RMSNorm",
                           "--disable-bias-linear", "--position-embedding-type", "none", "--data-cache-dir",
                           corpus_cache])
    vocab = prepare_default_corpus(corpus_cache, 512).vocab_size
    plan = dry_run(config, Cluster(1, 1, device_type="cpu"), vocab, rank=0)
    planned = plan.gradient_working_bytes - plan.logits_bytes
    measured = measured_block_gradients(dataclasses.replace(config.model, vocab_size=vocab),
                                        config.training.micro_batch_size)
    assert 0.97 <= planned / measured <= 1.07, (block, planned, measured)
