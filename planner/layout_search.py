"""`python -m zero.plan search`: every layout Megatron-LM's rules accept for a model on N GPUs, pruned by a memory count
that runs under the dry run's, ranked by the layout model's step time; the top picks are then checked by dry run."""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from arguments.config import ConfigError, PretrainConfig
from planner.layout_flags import gathers_behind_forward, layout_flag_words, without_flags_set_again
from planner.layout_memory import layout_memory_bytes
from planner.layout_of_config import check_expert_tp
from planner.layout_perf import (
    Layout,
    LayoutPrediction,
    ModelCounts,
    load_layout_constants,
    model_counts,
    output_layer_units,
    predict_layout,
)
from planner.layout_pins import Pins, pins_of
from planner.layout_zero import zero_label, zero_stages
from planner.perf_model import Hardware
from planner.pipeline_split import balanced_stage_counts, even_stage_counts
from planner.search_progress import SearchProgress

MICRO_BATCH_SIZES = (1, 2, 4, 8)


@dataclass
class Candidate:
    layout: Layout
    memory_bytes: float
    fits: bool
    prediction: Optional[LayoutPrediction] = None
    lost_to: str = ""
    flag_words: list[str] = dataclasses.field(default_factory=list)
    stage_bytes: Optional[list[int]] = None

    @property
    def dry_run_bytes(self) -> Optional[int]:
        return max(self.stage_bytes) if self.stage_bytes else None

    def flags(self) -> str:
        """flag_words as one shell line, the layout string quoted."""
        return shlex.join(self.flag_words)

    def launch_flags(self, model_flags: Sequence[str]) -> list[str]:
        """The launch's flags: the user's `model_flags`, less those the search sets again, then the search's."""
        return [*without_flags_set_again(model_flags, self.flag_words), *self.flag_words]

    def to_json(self) -> dict:
        layout = self.layout
        return {"tp": layout.tp, "pp": layout.pp, "vp": layout.vp, "cp": layout.cp, "ep": layout.ep,
                "dp": layout.dp, "micro_batch_size": layout.micro_batch_size,
                "recompute": "full" if layout.recompute_fraction >= 1.0 else "none",
                "zero": zero_label(layout.stage), "zero_stage": layout.stage,
                "memory_gb": round(self.memory_bytes / 1e9, 2),
                "dry_run_memory_gb": round(self.dry_run_bytes / 1e9, 2) if self.dry_run_bytes else None,
                "dry_run_stage_gb": [round(b / 1e9, 2) for b in self.stage_bytes] if self.stage_bytes else None,
                "step_s": round(self.prediction.step_s, 4) if self.prediction else None,
                "tflops_per_gpu": round(self.prediction.model_tflops_per_gpu, 1) if self.prediction else None,
                "terms_s": {k: round(v, 5) for k, v in self.prediction.terms.items()} if self.prediction else None}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _virtual_stages(layers: int, pp: int) -> list[int]:
    """Virtual stages per pipeline rank: the even splits, and powers of two up to them where uneven."""
    per_rank = layers // pp
    powers = [2 ** k for k in range(per_rank.bit_length()) if 2 ** k <= per_rank]
    return sorted(set(_divisors(per_rank)) | set(powers))


def _splits(counts: ModelCounts, layout: Layout, pins: Pins) -> Iterator[tuple[tuple[int, ...], ...]]:
    """The splits a pipelined layout is priced with: the user's, or the balanced one and Megatron's even one."""
    if pins.stage_counts is not None:
        yield pins.stage_counts
        return
    split = balanced_stage_counts(counts.layers, layout.pp, layout.vp, output_layer_units(counts, layout))
    if all(layers for chunks in split for layers in chunks):
        yield split
    even = even_stage_counts(counts.layers, layout.pp, layout.vp)
    if even is not None and even != split:
        yield even


def enumerate_layouts(model, counts: ModelCounts, gpus: int, global_batch: int, pins: Pins,
                      gpus_per_node: int) -> Iterator[Layout]:
    """Every layout Megatron accepts within what `pins` fixes, pipelined ones with their split."""
    heads = model.num_attention_heads
    groups = model.attention.num_query_groups or heads
    experts = model.moe.num_experts if model.moe is not None else 1

    def allowed(pinned, value) -> bool:
        return pinned is None or pinned == value

    for tp in _divisors(gpus):
        # TP divides the heads and is a multiple or divisor of the key/value groups, within a node
        if tp > gpus_per_node or heads % tp or (groups % tp and tp % groups) or not allowed(pins.tp, tp):
            continue
        for cp in _divisors(gpus // tp) if pins.cp is not None else (1,):
            if (counts.seq_length % (2 * cp) and cp > 1) or not allowed(pins.cp, cp):
                continue
            for pp in _divisors(gpus // (tp * cp)):
                if pp > counts.layers or not allowed(pins.pp, pp):
                    continue
                dp = gpus // (tp * cp * pp)
                for ep in _divisors(gpus // pp):
                    if experts % ep or (ep > 1 and model.moe is None) or not allowed(pins.ep, ep):
                        continue
                    for micro in MICRO_BATCH_SIZES if pins.micro_batch_size is None else (pins.micro_batch_size,):
                        if global_batch % (micro * dp):
                            continue
                        micro_batches = global_batch // (micro * dp)
                        vps = [1] if pp == 1 else [v for v in _virtual_stages(counts.layers, pp)
                                                  if v == 1 or micro_batches % pp == 0]
                        if pins.stage_counts is not None:
                            vps = [len(pins.stage_counts[0])]
                        stages = zero_stages(dp * cp, max(gpus // (ep * pp), 1) if model.moe is not None else 1, pp)
                        if pins.zero_stage is not None:
                            stages = (pins.zero_stage,) if pins.zero_stage < 3 or pp == 1 else ()
                        for vp in vps:
                            for recompute in (0.0, 1.0) if pins.recompute is None else (pins.recompute,):
                                for stage in stages:
                                    layout = Layout(
                                        gpus, tp, pp, vp, cp, ep, micro, global_batch, pins.precision, recompute,
                                        stage >= 1, zero_stage=stage if stage >= 2 else None,
                                        moe_dispatcher=pins.dispatcher or
                                        ("alltoall" if ep > 1 else pins.configured_dispatcher),
                                        overlap_grad_reduce=True if pins.overlap_grad_reduce is None
                                        else pins.overlap_grad_reduce,
                                        overlap_param_gather=gathers_behind_forward(stage)
                                        if pins.overlap_param_gather is None else pins.overlap_param_gather,
                                        fp8_recipe=pins.fp8_recipe, fp8_wgrad=pins.fp8_wgrad)
                                    if pp == 1:
                                        yield layout
                                    for split in _splits(counts, layout, pins) if pp > 1 else ():
                                        yield dataclasses.replace(layout, stage_counts=split)


def rank_key(candidate: Candidate) -> tuple:
    """Faster first; among equal times, fewer model-parallel ranks, then less memory."""
    layout = candidate.layout
    return (round(candidate.prediction.step_s, 9), model_parallel_ranks(layout),
            candidate.dry_run_bytes or candidate.memory_bytes)


def model_parallel_ranks(layout: Layout) -> int:
    return layout.tp * layout.pp * layout.vp * layout.cp * layout.ep


def search(config: PretrainConfig, gpus: int, hardware: Hardware, vocab: Optional[int] = None,
           progress: Optional[SearchProgress] = None) -> tuple[ModelCounts, list[Candidate]]:
    """Every layout of `config` on `gpus` GPUs within what its flags fix, the fitting ones best first, then the rest by
    memory."""
    progress = progress or SearchProgress(None)
    if hardware.layout_calibration is None:
        raise ConfigError(f"--hardware {hardware.name}: the profile has no layout calibration (layout_calibration in "
                          f"configs/hardware/{hardware.name}.yaml), so the layout model has no constants for it")
    model, pins = config.model, pins_of(config)
    if pins.expert_tp:  # a given expert TP is priced only at 1
        check_expert_tp(config.model, config.parallel, config.parallel.tensor_model_parallel_size)
    counts = model_counts(model, vocab)
    constants = load_layout_constants(hardware.layout_calibration)
    fp32_runs = hardware.precision == "fp32"
    fitting, rest = [], []
    progress.started(gpus)
    for layout in enumerate_layouts(model, counts, gpus, config.training.global_batch_size, pins,
                                    hardware.gpus_per_node):
        progress.counting(len(fitting) + len(rest), len(fitting))
        words = layout_flag_words(layout, pins, model.moe is not None, fp32_runs, model.hybrid_layer_pattern,
                                  model.mtp.num_layers)
        memory = layout_memory_bytes(counts, layout)
        if memory > hardware.gpu_memory_bytes:
            rest.append(Candidate(layout, memory, False, lost_to=f"memory: {memory / 1e9:,.0f} GB > "
                                                                f"{hardware.gpu_memory_bytes / 1e9:,.0f} GB",
                                  flag_words=words))
            continue
        fitting.append(Candidate(layout, memory, True,
                                 predict_layout(counts, layout, hardware, constants, hardware.fp8_peak_flops),
                                 flag_words=words))
    fitting.sort(key=rank_key)
    rest.sort(key=lambda c: c.memory_bytes)
    progress.ranked(len(fitting) + len(rest), len(fitting), fitting[0].layout if fitting else None,
                    fitting[0].prediction.step_s if fitting else 0.0)
    return counts, fitting + rest


def first_fit_by_count(config: PretrainConfig, counts: ModelCounts, gpus: int, hardware: Hardware) -> Optional[Layout]:
    """The first layout on `gpus` GPUs that fits by the count, unpriced."""
    for layout in enumerate_layouts(config.model, counts, gpus, config.training.global_batch_size, pins_of(config),
                                    hardware.gpus_per_node):
        if layout_memory_bytes(counts, layout) <= hardware.gpu_memory_bytes:
            return layout
    return None


# past this each step takes seconds
MAX_COUNT_WALKED = 2**16


def smallest_fitting_gpus(config: PretrainConfig, counts: ModelCounts, gpus: int, hardware: Hardware,
                          parameter_bytes: float = 0.0) -> Optional[tuple[int, Layout]]:
    """The smallest GPU count above `gpus` on which a layout fits by the count, with it; None up to MAX_COUNT_WALKED."""
    below, power = gpus, 1 << gpus.bit_length()
    while power <= MAX_COUNT_WALKED:
        if parameter_bytes <= power * hardware.gpu_memory_bytes:
            found = first_fit_by_count(config, counts, power, hardware)
            if found is not None:
                break
        below, power = power, power * 2
    else:
        return None
    node = hardware.gpus_per_node
    for count in range((below // node + 1) * node, power, node):
        if parameter_bytes <= count * hardware.gpu_memory_bytes:
            layout = first_fit_by_count(config, counts, count, hardware)
            if layout is not None:
                return count, layout
    return power, found
