"""`python -m zero.plan search`: every layout Megatron would accept for a model on N GPUs, pruned by memory,
ranked by predicted step time (planner/layout_perf.py).

    python -m zero.plan search --init-from-hf DIR --gpus 1024 --hardware h100-sxm \\
        --global-batch-size 8192 --seq-length 4096 [--fp8-format hybrid] [--top 5] [--json]

The model is given as pretrain_gpt.py flags (--config PRESET, --init-from-hf DIR or the shape flags).
Enumerated, with Megatron-LM's rules (megatron/training/arguments.py validate_args and
megatron/core/parallel_state.py initialize_model_parallel):
  TP      divides the attention heads and the query groups, at most one node (a TP group over InfiniBand
          is never faster: Narayanan et al. 2021, figure 13)
  CP      the sequence splits in 2 x CP chunks (the causal load balancing TE's ring uses)
  PP, VP  PP x VP model chunks, every rank holding a layer, split so that the slowest rank (the output
          layer's counted) is least loaded (planner/pipeline_split.py), priced at that split and printed as
          the --pipeline-model-parallel-layout that realises it; interleaving needs the micro-batches to be a
          multiple of PP
  EP      divides the experts and the ranks of a pipeline stage (the expert grid folds EP into DP x CP x TP
          with expert TP 1)
  MBS     1, 2, 4 or 8, dividing GBS / DP
  recompute  none or full
  ZeRO    the distributed optimizer (ZeRO-1), plain DDP, or this project's --zero-stage 2 or 3 (3 without
          PP, which refuses it); at data-parallel size 1 they are one run, listed once as plain DDP
          (planner/layout_zero.py)
Each layout's memory is counted analytically (`layout_memory_bytes`: weights, fp32 gradients, optimizer
state, ZeRO-2/3's reduce buckets and stage 3's gathered chunks, the first stage's in-flight activations, the
logits); a layout over the GPU's memory is dropped with its size as the reason. What fits is priced, best
first, and each of the rest is told by the term that costs it most over the best one.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import time
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from arguments.parser import parse_config
from base.errors import OneLineArgumentParser
from planner.input_bounds import check_gpu_count, check_model_fits_gpus, check_search_counts
from planner.layout_perf import (
    BF16_BYTES,
    FP32_BYTES,
    Layout,
    LayoutPrediction,
    ModelCounts,
    load_layout_constants,
    model_counts,
    output_layer_units,
    predict_layout,
)
from planner.layout_zero import sharded_state_bytes, zero_flag_words, zero_label, zero_stages
from planner.perf_model import Hardware, load_hardware
from planner.pipeline_split import balanced_stage_counts, layout_string
from zero.memory import format_bytes

MICRO_BATCH_SIZES = (1, 2, 4, 8)
OPTIMIZER_STATE_BYTES = 12  # fp32 master weight and Adam's two fp32 moments


@dataclass
class Candidate:
    layout: Layout
    memory_bytes: float
    fits: bool
    prediction: Optional[LayoutPrediction] = None
    lost_to: str = ""
    dry_run_bytes: Optional[int] = None   # the meta-device dry run's peak, where --dry-run-check planned it

    def flag_words(self) -> list[str]:
        """The layout as pretrain_gpt.py arguments; a pipelined one with the --pipeline-model-parallel-layout
        of the split it was priced with (planner/pipeline_split.py), its virtual stages included."""
        layout = self.layout
        words = ["--tensor-model-parallel-size", str(layout.tp), "--pipeline-model-parallel-size", str(layout.pp)]
        if layout.pp > 1:
            words += ["--pipeline-model-parallel-layout", layout_string(layout.stage_counts)]
        if layout.cp > 1:
            words += ["--context-parallel-size", str(layout.cp)]
        if layout.ep > 1:
            words += ["--expert-model-parallel-size", str(layout.ep)]
        if layout.tp > 1:
            words += ["--sequence-parallel"] + (["--tp-comm-overlap"] if layout.tp_comm_overlap else [])
        words += ["--micro-batch-size", str(layout.micro_batch_size), "--global-batch-size",
                  str(layout.global_batch_size)]
        words += zero_flag_words(layout.stage)
        if layout.recompute_fraction >= 1.0:
            words += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        return words

    def flags(self) -> str:
        """flag_words as one shell line (the layout string quoted: it holds `|`)."""
        return shlex.join(self.flag_words())

    def to_json(self) -> dict:
        layout = self.layout
        return {"tp": layout.tp, "pp": layout.pp, "vp": layout.vp, "cp": layout.cp, "ep": layout.ep,
                "dp": layout.dp, "micro_batch_size": layout.micro_batch_size,
                "recompute": "full" if layout.recompute_fraction >= 1.0 else "none",
                "zero": zero_label(layout.stage), "zero_stage": layout.stage,
                "memory_gb": round(self.memory_bytes / 1e9, 2),
                "dry_run_memory_gb": round(self.dry_run_bytes / 1e9, 2) if self.dry_run_bytes else None,
                "step_s": round(self.prediction.step_s, 4) if self.prediction else None,
                "tflops_per_gpu": round(self.prediction.model_tflops_per_gpu, 1) if self.prediction else None,
                "terms_s": {k: round(v, 5) for k, v in self.prediction.terms.items()} if self.prediction else None}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _virtual_stages(layers: int, pp: int) -> list[int]:
    """Virtual stages per pipeline rank: those that split the stage's layers evenly, and the powers of two up
    to them where the split is uneven (Megatron's --pipeline-model-parallel-layout places any split; Bridge's
    Llama 3.1 405B runs 126 layers as PP 8 x VP 8)."""
    per_rank = layers // pp
    powers = [2 ** k for k in range(per_rank.bit_length()) if 2 ** k <= per_rank]
    return sorted(set(_divisors(per_rank)) | set(powers))


def layout_memory_bytes(counts: ModelCounts, layout: Layout) -> float:
    """The first pipeline stage's bytes on one rank: the stage holding the most in-flight micro-batches."""
    dense = counts.dense_parameters / (layout.tp * layout.pp)
    experts = counts.expert_parameters / (layout.ep * layout.pp)
    expert_dp = max(layout.gpus // (layout.ep * layout.pp), 1)
    shard = dense / (layout.dp * layout.cp) + experts / expert_dp if layout.distributed_optimizer else dense + experts
    states = (dense + experts) * (BF16_BYTES + FP32_BYTES) + shard * OPTIMIZER_STATE_BYTES
    if layout.stage >= 2:  # planner/layout_zero.py: gradients (and parameters) sharded, with their buffers
        states = sharded_state_bytes(counts, layout, dense, experts, layout.dp * layout.cp, expert_dp)
    h = counts.hidden
    tokens = layout.micro_batch_size * counts.seq_length / (layout.tp * layout.cp)
    layers = counts.layers / layout.pp
    moe = counts.moe_layers / layout.pp
    # Saved per token and layer (bf16), as Megatron-Core's blocks keep them: attention its norm's input and output
    # (Transformer Engine's LayerNormLinear), q, k, v and the context (4h + the K and V widths, q ~ h); the MLP its
    # norm's input and output and gate, up and activation (3 x width: the fused SwiGLU keeps fc1's output, fc2 its
    # input); an MoE layer k permuted copies of the token besides. Full recompute keeps each layer's input only.
    # This repository's blocks keep the same (gpt/norms.py keeps RMSNorm's input, gpt/glu.py gate and up; its dry
    # run's Llama 3 8B block at TP 1 reads 1.005x this), and beyond it two things not counted here, which
    # --dry-run-check catches: under sequence parallelism the column-parallel linears' gathered inputs
    # (parallel/layers.py), and the CP p2p ring's fp32 output (gpt/cp_attention.py) (docs/planning.md).
    # Under FP8, Transformer Engine saves the GEMMs' inputs it quantized (the norms' outputs, the context,
    # the activation's output) as FP8 for the weight gradient: 1 byte, not 2, for those.
    per_layer = [BF16_BYTES * (4 * h + counts.kv_width + 2 * h + 3 * counts.gated_width_dense),
                 BF16_BYTES * (4 * h + counts.kv_width + 2 * h + 3 * counts.gated_width_moe + counts.topk * h)]
    if layout.precision == "fp8":
        per_layer = [per_layer[0] - (3 * h + counts.gated_width_dense),
                     per_layer[1] - (3 * h + counts.gated_width_moe)]
    saved = (layers - moe) * per_layer[0] + moe * per_layer[1]
    if layout.recompute_fraction >= 1.0:
        saved = layers * BF16_BYTES * h + per_layer[1 if moe else 0]
    in_flight = 1.0
    if layout.pp > 1:
        in_flight = min(layout.pp * (1 + (layout.pp - 1) / (layout.pp * layout.vp)), layout.micro_batches)
    activations = tokens * saved * in_flight
    logits = layout.micro_batch_size * counts.seq_length / layout.cp * counts.padded_vocab / layout.tp * FP32_BYTES * 2
    return states + activations + (logits if layout.pp == 1 else 0.0)


def enumerate_layouts(model, counts: ModelCounts, gpus: int, global_batch: int, precision: str,
                      gpus_per_node: int, tp_comm_overlap: bool = True) -> Iterator[Layout]:
    """`tp_comm_overlap`: TP layouts run with --tp-comm-overlap (Transformer Engine's userbuffers, CUDA only:
    a CPU profile's TP collectives are priced exposed)."""
    heads = model.num_attention_heads
    groups = model.num_query_groups or heads
    experts = model.moe.num_experts if model.moe is not None else 1
    for tp in _divisors(gpus):
        if tp > gpus_per_node or heads % tp or groups % tp:
            continue
        for cp in _divisors(gpus // tp):
            if counts.seq_length % (2 * cp) and cp > 1:
                continue
            for pp in _divisors(gpus // (tp * cp)):
                if pp > counts.layers:
                    continue
                dp = gpus // (tp * cp * pp)
                for ep in _divisors(gpus // pp):
                    if experts % ep or (ep > 1 and model.moe is None):
                        continue
                    for micro in MICRO_BATCH_SIZES:
                        if global_batch % (micro * dp):
                            continue
                        micro_batches = global_batch // (micro * dp)
                        vps = [1] if pp == 1 else [v for v in _virtual_stages(counts.layers, pp)
                                                  if v == 1 or micro_batches % pp == 0]
                        stages = zero_stages(dp * cp, max(gpus // (ep * pp), 1) if model.moe is not None else 1, pp)
                        for vp in vps:
                            for recompute in (0.0, 1.0):
                                for stage in stages:
                                    yield Layout(gpus, tp, pp, vp, cp, ep, micro, global_batch, precision,
                                                 recompute, stage >= 1, zero_stage=stage if stage >= 2 else None,
                                                 tp_comm_overlap=tp_comm_overlap and tp > 1)


def _rank_key(candidate: Candidate) -> tuple:
    """Faster first; among equal times (communication fully hidden), fewer model-parallel ranks, then less memory."""
    layout = candidate.layout
    return (round(candidate.prediction.step_s, 9), layout.tp * layout.pp * layout.vp * layout.cp * layout.ep,
            candidate.memory_bytes)


def search(model, gpus: int, global_batch: int, precision: str, hardware: Hardware,
           vocab: Optional[int] = None) -> tuple[ModelCounts, list[Candidate]]:
    """Every layout, the fitting ones priced and sorted best first, then the rest by memory. `vocab`: the
    launch's vocabulary (planner/vocabulary.py), for a model config that has none yet (--init-from-hf)."""
    counts = model_counts(model, vocab)
    constants = load_layout_constants(hardware.layout_calibration or "h100-bridge")
    fitting, rest = [], []
    for layout in enumerate_layouts(model, counts, gpus, global_batch, precision, hardware.gpus_per_node,
                                    tp_comm_overlap=hardware.device_type == "cuda"):
        if layout.pp > 1:  # priced and printed with the same split
            layout = dataclasses.replace(layout, stage_counts=balanced_stage_counts(
                counts.layers, layout.pp, layout.vp, output_layer_units(counts, layout)))
        memory = layout_memory_bytes(counts, layout)
        if memory > hardware.gpu_memory_bytes:
            rest.append(Candidate(layout, memory, False, lost_to=f"memory: {memory / 1e9:,.0f} GB > "
                                                                f"{hardware.gpu_memory_bytes / 1e9:,.0f} GB"))
            continue
        fitting.append(Candidate(layout, memory, True,
                                 predict_layout(counts, layout, hardware, constants, hardware.fp8_peak_flops)))
    fitting.sort(key=_rank_key)
    if fitting:
        best = fitting[0].prediction
        for candidate in fitting[1:]:
            excess = {k: v - best.terms[k] for k, v in candidate.prediction.terms.items()}
            term = max(excess, key=excess.get)
            candidate.lost_to = (f"{term} +{excess[term] * 1e3:,.0f} ms "
                                 f"(step {candidate.prediction.step_s / best.step_s:.2f}x the best)")
    rest.sort(key=lambda c: c.memory_bytes)
    return counts, fitting + rest


def format_search(candidates: list[Candidate], top: int, seconds: float, model_flags: str = "") -> str:
    """The top layouts as pretrain_gpt.py flag lines (the model's own flags first), and why the rest lost."""
    fitting = [c for c in candidates if c.fits]
    lines = [f"{len(candidates):,} layouts enumerated, {len(fitting):,} fit, searched in {seconds:.1f} s"]
    for rank, candidate in enumerate(fitting[:top], 1):
        p = candidate.prediction
        dry = f" (dry run {format_bytes(candidate.dry_run_bytes)})" if candidate.dry_run_bytes else ""
        lines.append(f"{rank}. {p.step_s * 1e3:,.1f} ms/step, {p.model_tflops_per_gpu:,.0f} TFLOP/s/GPU, "
                     f"{format_bytes(candidate.memory_bytes)}{dry}" + (f"  [{candidate.lost_to}]" if rank > 1 else ""))
        lines.append(f"   {model_flags + ' ' if model_flags else ''}{candidate.flags()}")
    reasons: dict[str, int] = {}
    for candidate in candidates[top:]:
        key = candidate.lost_to.split(" +")[0].split(":")[0]
        reasons[key] = reasons.get(key, 0) + 1
    lines.append("the rest lost to: " + ", ".join(f"{term} ({n:,})" for term, n in
                                                 sorted(reasons.items(), key=lambda kv: -kv[1])))
    return "\n".join(lines)


def dry_run_check(candidates: list[Candidate], model_flags: Sequence[str], hardware: Hardware,
                  checks: int, progress=None) -> list[Candidate]:
    """The best `checks` layouts planned again with the meta-device dry run (planner/dry_run.py), every pipeline
    stage's rank 0 of its (DP, TP) grid (the stages differ; TP, CP and EP ranks of a stage hold the same
    shapes): a layout whose dry run is over the GPU's memory loses with the dry run's figure. Returns those
    checked, each with `dry_run_bytes` set."""
    from planner.dry_run import Cluster, dry_run
    from planner.vocabulary import launch_vocab

    checked = []
    for candidate in [c for c in candidates if c.fits][:checks]:
        config = parse_config([*model_flags, *candidate.flag_words()])
        cluster = Cluster(candidate.layout.gpus, hardware.gpus_per_node, hardware.gpu_memory_bytes,
                          hardware.device_type)
        vocab, _ = launch_vocab(config)
        per_stage = candidate.layout.gpus // candidate.layout.pp  # each stage's first rank (planner/plan.py's stage_plans)
        plans = [dry_run(config, cluster, vocab, stage * per_stage, progress=progress)
                 for stage in range(candidate.layout.pp)]
        candidate.dry_run_bytes = max(plan.total_bytes for plan in plans)
        if candidate.dry_run_bytes > hardware.gpu_memory_bytes:
            candidate.fits = False
            candidate.lost_to = (f"memory (dry run): {candidate.dry_run_bytes / 1e9:,.1f} GB > "
                                 f"{hardware.gpu_memory_bytes / 1e9:,.0f} GB")
        checked.append(candidate)
    return checked


def search_command(argv: Sequence[str]) -> int:
    own = OneLineArgumentParser(prog="python -m zero.plan search", add_help=False)
    own.add_argument("--gpus", type=int, required=True)
    own.add_argument("--hardware", required=True, help="a profile in configs/hardware")
    own.add_argument("--top", type=int, default=5)
    own.add_argument("--json", action="store_true")
    own.add_argument("--dry-run-check", type=int, default=0, metavar="K",
                     help="plan the best K layouts again with the meta-device dry run; drop those over memory")
    args, rest = own.parse_known_args(list(argv))
    check_gpu_count("--gpus", args.gpus)
    check_search_counts(args.top, args.dry_run_check)
    config = parse_config(list(rest))
    hardware = load_hardware(args.hardware)
    check_model_fits_gpus(config.model, args.gpus, hardware.gpu_memory_bytes)
    precision = "fp8" if config.model.fp8 else "bf16"
    start = time.perf_counter()
    from planner.vocabulary import launch_vocab

    vocab, _ = launch_vocab(config)  # an --init-from-hf model's comes from its folder: the output layer counts
    counts, candidates = search(config.model, args.gpus, config.training.global_batch_size, precision, hardware,
                                vocab)
    if args.dry_run_check:
        dry_run_check(candidates, rest, hardware, args.dry_run_check)
        candidates = sorted((c for c in candidates if c.fits), key=_rank_key) + \
            sorted((c for c in candidates if not c.fits), key=lambda c: c.memory_bytes)
    seconds = time.perf_counter() - start
    if args.json:
        print(json.dumps([c.to_json() | {"flags": shlex.join([*rest, *c.flag_words()])} for c in candidates if c.fits]))
    else:
        print(format_search(candidates, args.top, seconds, shlex.join(rest)))
    return 0

