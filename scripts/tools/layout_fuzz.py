#!/usr/bin/env python
"""Random layouts against one rank: no layout may change the math.

    python scripts/tools/layout_fuzz.py --seed 1 --draws 20     # 20 draws, each against its one-rank run
    python scripts/tools/layout_fuzz.py --seed 1 --draw 13      # draw 13 of seed 1 again, alone

Each seeded draw picks a model and a layout over 2-8 gloo ranks (docs/testing.md) and trains 3 iterations; every
loss and grad norm must match the one-rank run within tolerance, or the launch is refused in one line."""

from __future__ import annotations

import json
import math
import random
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from base.errors import ConfigError, OneLineArgumentParser, run_tool  # noqa: E402
from scripts.timed_launch import launch  # noqa: E402
from tests.training.combinations import Layout  # noqa: E402

ITERATIONS = 3
LOSS_TOLERANCE, GRAD_NORM_TOLERANCE = 1e-5, 1e-4
DROPOUT = 0.1  # Megatron's default --hidden-dropout, in the dropout draws
# FP8: a layout casts other tensors (a TP shard with its own amax under current scaling; each data-parallel rank's
# first output gradients at TE's initial scale, rounded in e5m2's subnormals), as TransformerEngine does
# (docs/fp8.md): measured up to 9.4e-5 in a loss and 2.7e-3 in a grad norm (delayed, TP 2 x DP 4).
FP8_LOSS_TOLERANCE, FP8_GRAD_NORM_TOLERANCE = 1e-3, 1e-2
# fp16: a layout rounds other partial sums (TP's, a reduction's) to fp16's 11 bits (4.9e-4 a rounding) than one rank
# does: measured up to 2.5e-6 in a loss and 1.2e-4 in a grad norm (seed 96's aimed draws, docs/testing.md)
FP16_LOSS_TOLERANCE, FP16_GRAD_NORM_TOLERANCE = 1e-4, 2e-3
COMMON = ["--device", "cpu", "--tokenizer-type", "NullTokenizer", "--mock-data", "--vocab-size", "128",
          "--train-iters", str(ITERATIONS), "--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0",
          "--attention-dropout", "0", "--lr", "1e-3", "--clip-grad", "1.0", "--seed", "1234"]


@dataclass(frozen=True)
class Draw:
    seed: int
    index: int
    ranks: int
    model: tuple[str, ...]    # the model's flags: the one-rank run takes them too
    layout: Layout            # this draw's alone: the combination table's dimensions
    batch: tuple[str, ...]    # micro and global batch: the global batch is the one-rank run's too
    fp8: bool = False
    resume: Optional[Layout] = None  # iterations 1-2 at `layout` saved, iteration 3 resumed at this one
    dropout: bool = False     # hidden dropout on, against `reference_layout()`'s run rather than one rank

    def argv(self) -> list[str]:
        return [*COMMON, *self.model, *self.batch, *self.layout.flags(), *self._dropout()]

    def _dropout(self) -> list[str]:
        return ["--hidden-dropout", str(DROPOUT)] if self.dropout else []

    def reference_layout(self) -> Layout:
        """What the draw is held to: one rank; with dropout, the layout that draws the same masks (Megatron-Core's
        seeding, docs/testing.md): the same pipeline stages (a stage's seed is --seed + 100 x its rank), chunks, CP
        and DP sizes (in no seed: each rank draws its own tokens' masks from the same stream), TP kept under SP (its
        hidden dropout draws from the TP-private stream) and 1 without it (the replicated hidden states' masks are one
        rank's); ZeRO 0 and no recomputation (a recomputed forward draws its forward's masks again). With
        --fp8-param-gather, one rank of the distributed optimizer."""
        if not self.dropout:  # --fp8-param-gather needs sharded parameters, one rank's too (Megatron asserts it)
            return Layout(zero="distributed-optimizer") if "--fp8-param-gather" in self.model else Layout()
        layout = self.layout
        return Layout(tp=layout.tp if layout.sp else 1, sp=layout.sp, cp=layout.cp, cp_comm=layout.cp_comm,
                      hierarchical_cp=layout.hierarchical_cp, pp=layout.pp, vp_layers=layout.vp_layers, virtual_stages=layout.virtual_stages,
                      first_stage_layers=layout.first_stage_layers, zero="0")

    def reference_ranks(self) -> int:
        layout = self.layout
        return 1 if not self.dropout else self.ranks // ((layout.tp or 1) // (self.reference_layout().tp or 1))

    def one_rank_argv(self) -> list[str]:
        """The same model and global batch on one rank (micro-batches of the same size, accumulated), or with dropout
        on the reference layout (`reference_layout`)."""
        return [*COMMON, *self.model, *self.batch, *self.reference_layout().flags(), *self._dropout()]

    def resumed_argv(self, save: Path) -> tuple[list[str], list[str]]:
        """The two launches of a resume draw: iterations 1-2 at `layout` saved in `save`, then iteration 3 loaded from
        it at `resume`."""
        first = [*self.argv(), "--save", str(save), "--save-interval", "2", "--exit-interval", "2"]
        return first, [*COMMON, *self.model, *self.batch, *self.resume.flags(), "--load", str(save)]

    def describe(self) -> dict:
        return {"seed": self.seed, "draw": self.index, "ranks": self.ranks, "model": shlex.join(self.model),
                "layout": shlex.join(self.layout.flags()), "batch": shlex.join(self.batch),
                **({"resumed_at": shlex.join(self.resume.flags())} if self.resume is not None else {}),
                **({"dropout_against": shlex.join(self.reference_layout().flags())} if self.dropout else {})}


def _divisors(n: int, among: Sequence[int]) -> list[int]:
    return [d for d in among if n % d == 0]


@dataclass
class _Model:
    layers: int
    heads: int = 4
    moe: bool = False
    experts: int = 4
    flags: list = field(default_factory=list)


def _draw_model(rng: random.Random, layers: int, tensor_parallel: int, pipeline: int) -> _Model:
    model = _Model(layers=layers, moe=rng.random() < 0.5)
    flags = ["--num-layers", str(layers), "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32"]
    if rng.random() < 0.5:  # Llama's blocks
        flags += ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                  "--disable-bias-linear"]
        if rng.random() < 0.5 and 2 % tensor_parallel == 0:  # grouped-query attention: 2 groups over TP 1 or 2
            flags += ["--group-query-attention", "--num-query-groups", "2"]
    if rng.random() < 0.5:
        flags.append("--untie-embeddings-and-output-weights")
    if rng.random() < 0.2:  # replicated under TP: the norms over each head's query and key
        flags.append("--qk-layernorm")
    loss = rng.random()
    if loss < 0.2:  # a loss mask: none on end-of-document inputs, or the goldfish loss's dropped tokens
        flags += rng.choice([["--eod-mask-loss"], ["--goldfish-loss", "--goldfish-h", "8"]])  # h within seq 32
    if loss < 0.1 or 0.2 <= loss < 0.3:  # Megatron's per-token reduction, with and without a mask
        flags.append("--calculate-per-token-loss")
    if rng.random() < 0.15:  # documents: positions restart and attention stays within each one
        flags += ["--reset-position-ids", "--reset-attention-mask"]
    if model.moe:
        topk = rng.choice(["1", "2"])
        flags += ["--num-experts", str(model.experts), "--moe-router-topk", topk, "--moe-ffn-hidden-size", "32",
                  "--moe-token-dispatcher-type", rng.choice(["alltoall", "allgather"])]
        if topk == "1":  # a softmax over one chosen score is 1: Megatron-Core asks for the softmax before top-k
            flags.append("--moe-router-pre-softmax")
        dense_first = rng.choice([0, 0, 1, layers // 2])
        if dense_first:  # DeepSeek's first-k-dense, as Megatron-LM's --moe-layer-freq expression
            flags += ["--moe-layer-freq", f"([0]*{dense_first}+[1]*{layers - dense_first})"]
        if rng.random() < 0.3:
            flags += ["--moe-shared-expert-intermediate-size", "32"]
        if rng.random() < 0.3:
            flags.append("--moe-grouped-gemm")
    # multi-token prediction (on the last stage; beside pipeline stages with rotary positions only, as built here)
    if rng.random() < 0.15 and (pipeline == 1 or "rope" in flags):
        flags += ["--mtp-num-layers", rng.choice(["1", "2"])]
    model.flags = flags
    return model


def _draw_extras(seed: int, index: int, flags: Sequence[str], layout: Layout) -> list[str]:
    """Options drawn from a stream of their own, so that the other draws stay the same launches: Megatron-LM's Muon
    (Newton-Schulz in fp32, so bf16 does not round the layouts' last-bit differences into the step; not with the
    optimizer offloaded, which Muon refuses) or multi-latent attention (low ranks at this width; not with
    grouped-query attention, which it has no groups for)."""
    rng = random.Random(f"layout-fuzz extras {seed} {index}")
    pick = rng.random()
    if pick < 0.12 and not layout.offload_optimizer:
        return ["--optimizer", "muon", "--muon-fp32-matmul-prec", "high", "--muon-tp-mode",
                rng.choice(["duplicated", "distributed"])]
    if pick < 0.24 and "--group-query-attention" not in flags:
        return ["--multi-latent-attention", "--q-lora-rank", rng.choice(["16", "24"]), "--kv-lora-rank", "16",
                "--qk-head-dim", "8", "--qk-pos-emb-head-dim", "8", "--v-head-dim", "8"]
    return []


def _draw_gated_delta_net(seed: int, index: int, flags: Sequence[str], layout: Layout) -> list[str]:
    """Gated DeltaNet layers (gpt/gated_delta_net.py) on every layer but each second one (Megatron-LM's
    --experimental-attention-variant gated_delta_net --linear-attention-freq 2), from a stream of their own: with
    Llama's blocks (their SiLU), two query/key heads over TP 1 or 2, and no context parallelism (refused, as
    Megatron-Core has none)."""
    rng = random.Random(f"layout-fuzz gated delta net {seed} {index}")
    if rng.random() >= 0.25 or "--swiglu" not in flags or (layout.cp or 1) > 1 or 2 % (layout.tp or 1):
        return []
    return ["--experimental-attention-variant", "gated_delta_net", "--linear-attention-freq", "2",
            "--linear-num-key-heads", "2", "--linear-num-value-heads", rng.choice(["2", "4"]),
            "--linear-key-head-dim", "8", "--linear-value-head-dim", "8"]


def _draw_hierarchical_cp(seed: int, index: int, model: _Model, tensor_parallel: int, context_parallel: int,
                          data_parallel: int) -> bool:
    """Whether a CP 2 draw with data-parallel ranks to spare becomes CP 4 of `--cp-comm-type a2a+p2p` (the all-to-all
    over 2 adjacent CP ranks, the ring over 2: `--hierarchical-context-parallel-sizes 2 2`), from a stream of its own;
    the all-to-all level splits each TP rank's heads and query groups, so they must divide by 2."""
    flags = model.flags
    groups = int(flags[flags.index("--num-query-groups") + 1]) if "--num-query-groups" in flags else model.heads
    if context_parallel != 2 or data_parallel % 2 or (model.heads // tensor_parallel) % 2 or \
            (groups // tensor_parallel) % 2 or groups % tensor_parallel:
        return False
    return random.Random(f"layout-fuzz hierarchical cp {seed} {index}").random() < 0.5


def _draw_precision(seed: int, index: int, flags: Sequence[str], layout: Layout) -> list[str]:
    """From a stream of its own: an FP8 draw with sharded parameters gathers them as FP8 (`--fp8-param-gather`, as
    Megatron-LM: with the distributed optimizer or FSDP) half the time; a share of the other draws (not Muon, whose
    Newton-Schulz runs in the parameters' dtype) trains in fp16 with Megatron's dynamic loss scale from 4096, where no
    iteration of these models overflows (at the default 2^32 the first iterations overflow, and where is a matter of
    the layout by Megatron's definition: docs/testing.md), held to FP16_*_TOLERANCE."""
    rng = random.Random(f"layout-fuzz precision {seed} {index}")
    if "--fp8-format" in flags:
        return ["--fp8-param-gather"] if layout.zero not in (None, "0") and rng.random() < 0.5 else []
    if "--optimizer" in flags or rng.random() >= 0.12:
        return []
    return ["--fp16", "--initial-loss-scale", "4096"]


def _draw_rampup(seed: int, index: int, per_step: int, accumulation: int, pipeline: int) -> list[str]:
    """From a stream of its own, a share of the draws with accumulation to ramp: Megatron's `--rampup-batch-size START
    INCREMENT SAMPLES` from one pipeline-full of micro-batches per rank (START = INCREMENT), over as many samples as
    reach the global batch by iteration 3 (RampupBatchsizeNumMicroBatchesCalculator: START, 2 START, ...)."""
    start = per_step * pipeline
    increments = accumulation // pipeline - 1
    if increments < 1 or random.Random(f"layout-fuzz rampup {seed} {index}").random() >= 0.3:
        return []
    return ["--rampup-batch-size", str(start), str(start), str(increments * start)]


def _draw_mamba(seed: int, index: int, flags: Sequence[str], pipeline: int, context_parallel: int) -> list[str]:
    """Mamba-2 layers (gpt/mamba.py), from a stream of their own: the drawn blocks as a hybrid pattern whose even
    blocks are `M-` (8 heads of 8 in 4 groups at hidden 32, so TP 1, 2 or 4 splits whole groups), beside --num-layers
    (which a pattern may repeat). Not on pipeline stages or CP ranks (a pattern's stages are its `|` segments; Mamba
    has no CP), nor beside MoE, MTP, MLA, Muon or the GPT flags' Gated DeltaNet layers, whose layers or parameters a
    pattern would have to spell."""
    rng = random.Random(f"layout-fuzz mamba {seed} {index}")
    excluded = ("--num-experts", "--mtp-num-layers", "--multi-latent-attention", "--optimizer",
                "--experimental-attention-variant")
    if pipeline > 1 or context_parallel > 1 or any(flag in flags for flag in excluded) or rng.random() >= 0.2:
        return []
    layers = int(flags[flags.index("--num-layers") + 1])
    return ["--hybrid-layer-pattern", "".join("M-" if layer % 2 == 0 else "*-" for layer in range(layers)),
            "--mamba-head-dim", "8", "--mamba-num-groups", "4", "--mamba-state-dim", "8"]


def _draw_resume(seed: int, index: int, ranks: int, model: Sequence[str], batch: Sequence[str],
                 share: float) -> Optional[Layout]:
    """With probability `share`, for a dense model without FP8, another layout of the same ranks to resume iteration
    3 at (module docstring), from a stream of its own: TP (the heads, query groups and GDN key heads divide), SP, PP (the layers
    divide; MTP beside stages with rotary positions only), ZeRO, recompute; the global batch (and a ramp's sizes)
    divide over its DP."""
    rng = random.Random(f"layout-fuzz resume {seed} {index}")
    if "--num-experts" in model or "--fp8-format" in model or rng.random() >= share:
        return None
    flags = list(model)
    layers = int(flags[flags.index("--num-layers") + 1])
    groups = int(flags[flags.index("--num-query-groups") + 1]) if "--num-query-groups" in flags else 4
    if "--linear-num-key-heads" in flags:  # Gated DeltaNet's query/key heads, whole on each TP rank too
        groups = math.gcd(groups, int(flags[flags.index("--linear-num-key-heads") + 1]))
    micro = int(batch[batch.index("--micro-batch-size") + 1])
    global_batch = int(batch[batch.index("--global-batch-size") + 1])
    # a batch ramp's START and INCREMENT split into micro-batches over the DP ranks, as Megatron-LM asserts
    ramp = [int(value) for value in batch[batch.index("--rampup-batch-size") + 1:][:2]] \
        if "--rampup-batch-size" in batch else []
    choices = []
    for tensor_parallel in _divisors(ranks, [1, 2, 4]):
        for pipeline in _divisors(ranks // tensor_parallel, [1, 2]):
            data_parallel = ranks // (tensor_parallel * pipeline)
            if groups % tensor_parallel or layers % pipeline or \
                    any(size % (micro * data_parallel) for size in (global_batch, *ramp)):
                continue
            if pipeline > 1 and ("--mtp-num-layers" in flags and "rope" not in flags
                                 or (global_batch // (micro * data_parallel)) % pipeline):
                continue
            choices.append((tensor_parallel, pipeline))
    if not choices:
        return None
    tensor_parallel, pipeline = rng.choice(choices)
    layout = Layout(tp=tensor_parallel, sp=tensor_parallel > 1 and rng.random() < 0.5,
                    pp=pipeline if pipeline > 1 else None,
                    zero=rng.choice(["0", "1", "2", "3", "distributed-optimizer"] if pipeline == 1 else
                                    ["0", "1", "2", "distributed-optimizer"]),
                    recompute=rng.choice([None, None, "full", "selective"]))
    return layout


def draw(seed: int, index: int, model_flags: Optional[Sequence[str]] = None, resumes: float = 0.35) -> Draw:
    """Draw `index` of `seed`: the same launch every time (`resumes`: the share of dense draws that resume at another
    layout, drawn apart: _draw_resume)."""
    rng = random.Random(f"layout-fuzz {seed} {index}")
    ranks = rng.choice([2, 4, 4, 8])
    tensor_parallel = rng.choice(_divisors(ranks, [1, 1, 2, 4]))
    context_parallel = rng.choice(_divisors(ranks // tensor_parallel, [1, 1, 2]))
    pipeline = rng.choice(_divisors(ranks // (tensor_parallel * context_parallel), [1, 1, 2, 4]))
    data_parallel = ranks // (tensor_parallel * context_parallel * pipeline)
    layers = pipeline * rng.choice([1, 2])
    if pipeline > 1 and random.Random(f"layout-fuzz deeper {seed} {index}").random() < 0.3:
        layers *= 2  # a stream of its own: 4 layers a stage, so a virtual chunk holds several
    model = _draw_model(rng, layers, tensor_parallel, pipeline)
    hierarchical = _draw_hierarchical_cp(seed, index, model, tensor_parallel, context_parallel, data_parallel)
    if hierarchical:  # two of the data-parallel ranks join the CP group as the all-to-all level
        context_parallel, data_parallel = 2 * context_parallel, data_parallel // 2
    layout = Layout(tp=tensor_parallel)
    # Megatron-Core's MoE layer takes tensor parallelism only with sequence parallelism in training
    if tensor_parallel > 1 and (model.moe or rng.random() < 0.6):
        layout = replace(layout, sp=True)
    if context_parallel > 1:  # Ulysses' all-to-all splits each TP rank's heads over the CP ranks
        kinds = ["p2p", "all_gather"] + (["a2a"] if (model.heads // tensor_parallel) % context_parallel == 0 else [])
        layout = replace(layout, cp=context_parallel, cp_comm=rng.choice(kinds))
        if hierarchical:
            layout = replace(layout, cp_comm="a2a+p2p", hierarchical_cp=(2, context_parallel // 2))
    if pipeline > 1:
        layout = replace(layout, pp=pipeline)
        split = rng.random()
        if layers // pipeline >= 2 and split < 0.2:  # two chunks a stage, of 1 layer or (deeper) of 2
            layout = replace(layout, vp_layers=layers // pipeline // 2)
        elif layers // pipeline >= 2 and split < 0.35:  # the other spelling: two chunks a stage
            layout = replace(layout, virtual_stages=2)
        elif pipeline == 2 and layers >= 3 and split < 0.5:
            layout = replace(layout, first_stage_layers=1)
    zero = rng.choice(["0", "1", "2", "3", "distributed-optimizer"] if pipeline == 1 else
                      ["0", "1", "2", "distributed-optimizer"])
    layout = replace(layout, zero=zero)
    if zero in ("1", "2", "distributed-optimizer") and data_parallel > 1:
        layout = replace(layout, overlap_param_gather=rng.random() < 0.4, overlap_grad_reduce=rng.random() < 0.4)
    if zero != "0" and rng.random() < 0.15:
        layout = replace(layout, offload_optimizer=True)
        if rng.random() < 0.5:  # Megatron's hybrid optimizer: part of each rank's optimizer on the host
            layout = replace(layout, offload_fraction=0.5)
    recompute = rng.choice(["none", "none", "full", "block", "selective", "zero-r"])
    if recompute in ("full", "block", "selective"):
        layout = replace(layout, recompute=recompute)
    elif recompute == "zero-r":
        layout = replace(layout, checkpoint_activations=True,
                         partition_activations=tensor_parallel > 1 and rng.random() < 0.5)
        layout = replace(layout, contiguous_checkpointing=rng.random() < 0.4)
    if model.moe:
        # any expert TP the experts' grid folds over a stage's ranks, as Megatron-Core's (below, at or above TP)
        stage_ranks = tensor_parallel * context_parallel * data_parallel
        expert_tensor = rng.choice(_divisors(stage_ranks, [1, tensor_parallel, 2, 4]))
        expert_ranks = stage_ranks // expert_tensor
        expert_parallel = rng.choice(_divisors(expert_ranks, [d for d in (1, 2, 4) if model.experts % d == 0]))
        layout = replace(layout, ep=expert_parallel, etp=expert_tensor)
    fp8 = model_flags is None and rng.random() < 0.1
    flags = list(model_flags) if model_flags is not None else model.flags
    if fp8:
        flags += ["--fp8-format", "hybrid", "--fp8-recipe", rng.choice(["delayed", "tensorwise", "blockwise"])]
        flags += _draw_precision(seed, index, flags, layout)
    elif model_flags is None:
        flags += _draw_extras(seed, index, flags, layout)
        flags += _draw_gated_delta_net(seed, index, flags, layout)
        flags += _draw_precision(seed, index, flags, layout)
    if model_flags is None and not fp8:
        flags += _draw_mamba(seed, index, flags, pipeline, context_parallel)
    micro = rng.choice([1, 2])
    accumulation = pipeline * rng.choice([1, 2]) if pipeline > 1 else rng.choice([1, 2, 3])
    batch = ["--micro-batch-size", str(micro), "--global-batch-size", str(micro * data_parallel * accumulation),
             *_draw_rampup(seed, index, micro * data_parallel, accumulation, pipeline)]
    # hidden dropout (Megatron's 0.1) on a share of the dense draws without FP8, from a stream of its own; those
    # draw no resume
    dropout = not fp8 and "--num-experts" not in flags and \
        random.Random(f"layout-fuzz dropout {seed} {index}").random() < 0.2
    resume = None if dropout else _draw_resume(seed, index, ranks, flags, batch, resumes)
    return Draw(seed, index, ranks, tuple(flags), layout, tuple(batch), fp8, resume, dropout)


def compare(draw_: Draw, records: list, reference: list) -> dict:
    """The draw's verdict against the one-rank run: equal (bitwise or within tolerance), or where it differs."""
    loss_tolerance, norm_tolerance = (FP8_LOSS_TOLERANCE, FP8_GRAD_NORM_TOLERANCE) if draw_.fp8 else \
        (FP16_LOSS_TOLERANCE, FP16_GRAD_NORM_TOLERANCE) if "--fp16" in draw_.model else \
        (LOSS_TOLERANCE, GRAD_NORM_TOLERANCE)
    if len(records) != len(reference):
        return {"verdict": "differs", "why": f"{len(records)} iterations against the one rank's {len(reference)}"}
    worst = {"loss": 0.0, "grad_norm": 0.0}
    for ours, one in zip(records, reference):
        for key in worst:
            scale = max(abs(one[key]), 1e-30)
            worst[key] = max(worst[key], abs(ours[key] - one[key]) / scale)
    bitwise = all(ours[key] == one[key] for ours, one in zip(records, reference) for key in worst)
    holds = worst["loss"] <= loss_tolerance and worst["grad_norm"] <= norm_tolerance
    return {"verdict": "bitwise" if bitwise else "equal" if holds else "differs",
            "loss_relative": worst["loss"], "grad_norm_relative": worst["grad_norm"],
            "losses": [record["loss"] for record in records], "one_rank_losses": [record["loss"] for record in reference]}


def run_draw(draw_: Draw, scratch: Path, one_rank_cache: dict, timeout_s: float) -> dict:
    result = draw_.describe()
    if draw_.resume is None:
        launched = launch(draw_.argv(), draw_.ranks, scratch, timeout_s=timeout_s)
        records = launched.records
    else:  # iterations 1-2, saved; iteration 3 resumed at the other layout
        save = scratch / f"checkpoint-{draw_.seed}-{draw_.index}"
        first, second = draw_.resumed_argv(save)
        launched = launch(first, draw_.ranks, scratch, timeout_s=timeout_s)
        records = launched.records
        if launched.returncode == 0:
            launched = launch(second, draw_.ranks, scratch, timeout_s=timeout_s)
            if launched.returncode == 2 and not launched.records:
                shutil.rmtree(save, ignore_errors=True)
                return {**result, "verdict": "refused", "why": f"the resume: {launched.last_error}"}
            records = records + launched.records
        shutil.rmtree(save, ignore_errors=True)
    if launched.returncode == 2 and not records:  # refused before any work, in one line
        return {**result, "verdict": "refused", "why": launched.last_error}
    if launched.returncode != 0:
        return {**result, "verdict": "failed", "why": f"exit {launched.returncode}: {launched.last_error}"}
    key = (draw_.reference_ranks(), *draw_.one_rank_argv())
    if key not in one_rank_cache:
        one_rank_cache[key] = launch(draw_.one_rank_argv(), draw_.reference_ranks(), scratch, timeout_s=timeout_s)
    reference = one_rank_cache[key]
    if reference.returncode != 0:
        return {**result, "verdict": "one rank failed", "why": f"exit {reference.returncode}: {reference.last_error}"}
    return {**result, **compare(draw_, records, reference.records)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = OneLineArgumentParser(prog="scripts/tools/layout_fuzz.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draws", type=int, default=10, help="draws 0 .. N-1 of the seed")
    parser.add_argument("--draw", type=int, default=None, help="only this draw of the seed")
    parser.add_argument("--model", default=None, help="your model's flags, one string, in place of the drawn model")
    parser.add_argument("--output", default=None, help="JSON lines: one a draw, then the summary")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per launch")
    parser.add_argument("--list", action="store_true", help="print each draw's launch and stop")
    parser.add_argument("--resumes", type=float, default=0.35,
                        help="the share of dense draws that resume iteration 3 at another layout (0 to 1)")
    args = parser.parse_args(argv)
    model = shlex.split(args.model) if args.model else None
    indices = [args.draw] if args.draw is not None else range(args.draws)
    if not 0.0 <= args.resumes <= 1.0:
        raise ConfigError(f"--resumes {args.resumes:g}: a share, from 0 to 1")
    draws = [draw(args.seed, index, model, args.resumes) for index in indices]
    if args.list:
        for each in draws:
            print(f"draw {each.index}: {each.ranks} ranks: pretrain_gpt.py {shlex.join(each.argv())}"
                  + (f" | resumed at {shlex.join(each.resume.flags())}" if each.resume is not None else ""))
        return 0
    output = open(args.output, "w", encoding="utf-8") if args.output else None
    verdicts: dict = {}
    one_rank_cache: dict = {}
    with tempfile.TemporaryDirectory(prefix="layout-fuzz-") as scratch:
        for each in draws:
            result = run_draw(each, Path(scratch), one_rank_cache, args.timeout_s)
            verdicts[result["verdict"]] = verdicts.get(result["verdict"], 0) + 1
            kind = ("MoE" if "--num-experts" in each.model else "dense") + (" FP8" if each.fp8 else "")
            layout = shlex.join(each.layout.flags()) + (f" -> resumed at {shlex.join(each.resume.flags())}"
                                                        if each.resume is not None else "")
            print(f"draw {each.index} ({kind}, {each.ranks} ranks) {result['verdict']}: {layout}"
                  + (f" | {result['why']}" if "why" in result else
                     f" | loss {result['loss_relative']:.1e}, grad norm {result['grad_norm_relative']:.1e}"), flush=True)
            if output:
                output.write(json.dumps(result) + "\n")
                output.flush()
    summary = {"seed": args.seed, "draws": len(draws), "verdicts": verdicts}
    print(f"summary: {json.dumps(summary)}")
    if output:
        output.write(json.dumps({"summary": summary}) + "\n")
        output.close()
    return 0 if set(verdicts) <= {"bitwise", "equal", "refused"} else 1


if __name__ == "__main__":
    sys.exit(run_tool("scripts/tools/layout_fuzz.py", main, (ConfigError,)))
