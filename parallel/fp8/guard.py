"""FP8 that guards itself (--fp8-guard, issue 65 item 4), with no host read inside a micro-batch (issue 76 item 1).

Each FP8 linear counts, per cast, the values saturated (|x * scale| above the format's largest, clipped) and flushed
to zero, tracks its input's amax, and checks every GEMM pass: its FP8 output (forward) or gradients (backward) not
finite, or a cast saturating more than `threshold` of its values. What the passes saw accumulates on the device, per
layer, forward and backward apart: nothing is read back while the micro-batches run.

A layer's path is host state, known when the iteration starts (`LayerGuard.in_high_precision`): FP8, or high
precision with the FP8 pass still run first as the check, so delayed scaling's histories and amax reductions see
every cast as without the guard and every rank joins the same collectives.

Once per iteration (GuardMonitor.finish_passes): each layer's verdict is all-reduced (max) over its TP group (a
routed expert's over its ETP group), so every rank of a layer takes the same path; whether a layer that ran in FP8
failed is all-reduced over every rank; all of it, with the counts for the metrics, comes back in one read. A layer
that failed switches to high precision and the iteration runs again from its start (training/fp8_guard_replay.py);
each replay adds at least one layer, so there are at most as many replays as layers. A layer in high precision
returns to FP8 after the first iteration whose forward check passed. One log line when a layer falls back (layer,
reason, iteration) and one when it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from parallel.fp8.recipes import FP8_MAX

# The threshold's default (--fp8-guard-saturation-threshold, gpt/model_config.py) is 5%: a correctly scaled
# cast saturates at most its amax's element (current scaling, where fp8_max / amax * amax may round an ulp
# above fp8_max: 0.1% of a tiny run's casts at worst) or the values above the last micro-batch's amax
# (delayed scaling: 1.8% at worst in docs/fp8.md's healthy 20-iteration run), while a scale 2x too large
# clips every value above half the amax (about 8% of a normally distributed tensor of 2048 values).

# A pass's figures, per layer (float64: the counts stay exact far past fp32's 2^24): values cast, saturated,
# flushed to zero, the worst single cast's saturated fraction, and whether an output was not finite; the forward's
# also its input's amax.
VALUES, SATURATED, FLUSHED, WORST, NON_FINITE, INPUT_AMAX = range(6)
DENSE, EXPERT = "tp", "etp"  # the group a layer's verdict is reduced over


class CastCounts:
    """The counts of the casts of one GEMM pass (forward, or backward): values cast, saturated and flushed to zero,
    and the worst single cast's saturated fraction, added in place into `figures` (float64 [VALUES .. WORST], a
    layer's forward_figures or backward_figures; None: a tensor of its own, made at the first cast). The cast
    regions (parallel/fp8/casts.py) count inside the region: fused, the counts cost no launch of their own."""

    def __init__(self, figures: Optional[torch.Tensor] = None, counted: Optional[torch.Tensor] = None) -> None:
        self.figures = figures
        # a compiled block's weight cast counts in the iteration's first micro-batch only: 1.0 there, 0.0 after
        # (parallel/fp8/weight_cache.py); None: every cast counts
        self.counted = counted
        self.values = 0  # the values counted by this object (no device read)

    def add(self, scaled: torch.Tensor, clamped: torch.Tensor, data: torch.Tensor) -> None:
        """`scaled`: the values before the cast (fp32, scale applied); `clamped`: them clamped to +-fp8_max;
        `data`: the FP8 cast of `clamped`. Saturated: |scaled| > fp8_max, i.e. scaled - clamped non-zero (NaN
        is not clipped: nan_to_num makes its difference 0; the output's finiteness catches it). Flushed: the
        cast's zeros (every FP8 format here codes zero as a sign bit alone) less the zeros the values had.
        count_nonzero, not bool.sum(): on the CPU the latter costs several times the cast itself. The counts are
        integers held exactly in float64; the fraction is fp32's, widened exactly."""
        count = scaled.numel()
        saturated = torch.count_nonzero(torch.nan_to_num_(scaled - clamped))
        cast_zeros = count - torch.count_nonzero(data.view(torch.uint8) & 0x7F)
        flushed = cast_zeros - (count - torch.count_nonzero(scaled))
        fraction = saturated.float() / max(count, 1)
        self.values += count
        if self.figures is None:
            self.figures = torch.zeros(WORST + 1, dtype=torch.float64, device=scaled.device)
        counted = torch.stack([torch.full_like(saturated, count), saturated, flushed]).double()
        fraction = fraction.double()
        if self.counted is not None:
            counted, fraction = counted * self.counted, fraction * self.counted
        self.figures[VALUES:WORST] += counted
        self.figures[WORST] = torch.maximum(self.figures[WORST], fraction)

    @property
    def saturated(self) -> torch.Tensor:
        return self.figures[SATURATED]

    @property
    def flushed(self) -> torch.Tensor:
        return self.figures[FLUSHED]

    @property
    def worst_fraction(self) -> torch.Tensor:
        return self.figures[WORST]


def record_outputs(figures: torch.Tensor, outputs: tuple[torch.Tensor, ...]) -> None:
    """A pass's check of its outputs, in place: NON_FINITE becomes 1 where one of them is not finite."""
    non_finite = torch.stack([torch.isfinite(out).all().logical_not() for out in outputs]).any()
    figures[NON_FINITE] = torch.maximum(figures[NON_FINITE], non_finite.double())


def record_finite(figures: torch.Tensor, amax: torch.Tensor) -> None:
    """NON_FINITE becomes 1 where a cast tensor's `amax` is not finite (a weight's, at its cast)."""
    figures[NON_FINITE] = torch.maximum(figures[NON_FINITE], torch.isfinite(amax).logical_not().double())


def output_bound_limit(k: int, first_dtype: torch.dtype, second_dtype: torch.dtype, out_dtype: torch.dtype) -> float:
    """What the product of a GEMM's two operands' largest dequantizing scales must stay below for each of its output
    values to be finite (record_output_bounds): each of its K products is at most fp8_max(first) x fp8_max(second) x
    those scales, so their fp32 sum is at most K times that; half the output dtype's largest value leaves the fp32
    accumulation's roundings room."""
    return torch.finfo(out_dtype).max / 2 / (max(k, 1) * FP8_MAX[first_dtype] * FP8_MAX[second_dtype])


def record_output_bounds(figures: torch.Tensor, amax: torch.Tensor, bounds: tuple) -> None:
    """A pass's check made in the cast region of the operand cast last (x in the forward, dy in the backward)
    instead of reading its GEMMs' outputs (issue 87: no launch of its own). `bounds`: per GEMM that operand enters,
    (its scales there, the other operand's scales, output_bound_limit). NON_FINITE becomes 1 where the operand is
    not finite (its `amax`) or a GEMM's bound is not below its limit; a weight that is not finite is recorded at its
    own cast (record_finite), an input at the forward's. So a pass whose outputs could be non-finite fails, as one
    whose outputs were non-finite did. In dtypes of fp32's range the bounds are reached only by values no healthy
    layer has (K x amax x amax near 1e38); fp16's passes keep their epilogue's check of the outputs themselves
    (parallel/fp8/linear.py)."""
    failed = torch.isfinite(amax).logical_not()
    for own, other, limit in bounds:
        failed = failed | (own.amax().float() * other.amax().float() < limit).logical_not()
    figures[NON_FINITE] = torch.maximum(figures[NON_FINITE], failed.double())


def record_input_amax(figures: torch.Tensor, amax: torch.Tensor) -> None:
    """The forward's input amax, in place (its largest over the iteration's passes)."""
    figures[INPUT_AMAX] = torch.maximum(figures[INPUT_AMAX], amax.double())


@dataclass
class LayerGuard:
    """One FP8 linear's guard: its name, the group its verdict is reduced over (DENSE: the TP group; EXPERT: the
    expert tensor-parallel group), where its lines go, its path (host state, changed only by GuardMonitor between
    iterations) and this iteration's figures on the device."""
    name: str
    group: str = DENSE
    log: Callable[[str], None] = print
    device: torch.device | str = "cpu"
    in_high_precision: bool = False
    forward_figures: torch.Tensor = field(init=False)
    backward_figures: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.forward_figures = torch.zeros(INPUT_AMAX + 1, dtype=torch.float64, device=self.device)
        self.backward_figures = torch.zeros(NON_FINITE + 1, dtype=torch.float64, device=self.device)


def _failure(worst: float, non_finite: float, threshold: float, what: str) -> Optional[str]:
    """Why a pass's check failed, or None."""
    if non_finite > 0:
        return f"its FP8 {what} is not finite"
    if worst > threshold:
        return f"a {what} cast saturated {worst * 100:.3g}% of its values (threshold {threshold * 100:g}%)"
    return None


@dataclass
class GuardMonitor:
    """Every FP8 linear's guard of this rank's model: the iteration's verdict (finish_passes) and metrics
    (finish_iteration). `reductions`: the in-place max all-reduce of a verdict block over each group (DENSE,
    EXPERT; missing or None: one rank); `any_rank`: the in-place max all-reduce over every rank (None: one
    process); `device`: where the verdicts are reduced (the run's device)."""
    threshold: float = 0.05
    reductions: dict = field(default_factory=dict)
    any_rank: Optional[Callable[[torch.Tensor], None]] = None
    device: torch.device | str = "cpu"
    layers: list = field(default_factory=list)
    iteration: int = 0
    _figures: dict = field(default_factory=dict)  # the last iteration's read, by layer name
    _input_amax_before: dict = field(default_factory=dict)  # each layer's input amax at the iteration before
    _running_fp8: Optional[torch.Tensor] = None  # 1.0 per layer (in `_ordered()`'s order) that runs in FP8

    def _ordered(self) -> list[LayerGuard]:
        """The layers grouped by their verdict's group, each group's in the model's order: one block per group."""
        return [layer for group in (DENSE, EXPERT) for layer in self.layers if layer.group == group]

    def begin_iteration(self, iteration: int) -> None:
        """A new iteration: its number (for the lines) and zeroed figures (an evaluation's casts since the last
        iteration are not this one's)."""
        self.iteration = iteration
        self.begin_replay()

    def begin_replay(self) -> None:
        """The iteration's passes run (again) from zeroed figures."""
        tensors = [tensor for layer in self.layers for tensor in (layer.forward_figures, layer.backward_figures)]
        if tensors:
            torch._foreach_zero_(tensors)

    def finish_passes(self) -> bool:
        """After the iteration's micro-batches: reduce, read once, decide. True when a layer that ran in FP8
        failed its check on some rank: the failed layers are in high precision now and every rank must run the
        iteration again (from the state it started in). False: the iteration stands (its figures are kept for
        finish_iteration); layers in high precision whose forward check passed go back to FP8 from the next
        iteration."""
        layers = self._ordered()
        verdicts, figures, run_again = self._reduce_and_read(layers)
        for index, (layer, (forward_worst, forward_non_finite, backward_worst, backward_non_finite)) in \
                enumerate(zip(layers, verdicts)):
            reason = (_failure(forward_worst, forward_non_finite, self.threshold, "forward")
                      or _failure(backward_worst, backward_non_finite, self.threshold, "backward"))
            if reason is not None and not layer.in_high_precision:
                layer.log(f" FP8 guard: {layer.name} runs in high precision from iteration {self.iteration}: "
                          f"{reason}; the iteration runs again with its GEMMs in high precision")
                self._switch(index, layer, True)
        if run_again:
            return True
        self._keep_figures(layers, figures)
        for index, (layer, verdict) in enumerate(zip(layers, verdicts)):
            if layer.in_high_precision and _failure(verdict[0], verdict[1], self.threshold, "forward") is None:
                layer.log(f" FP8 guard: {layer.name} back in FP8 from iteration {self.iteration + 1}: its forward "
                          f"check passed at iteration {self.iteration}")
                self._switch(index, layer, False)
        return False

    def _reduce_and_read(self, layers: list[LayerGuard]) -> tuple[list, list, bool]:
        """Per layer (in `layers`' order) its verdict [forward worst, forward non-finite, backward worst, backward
        non-finite] reduced over its group, and this rank's figures [values, saturated, flushed, worst fraction,
        input amax]; and whether a layer that ran in FP8 failed on any rank. One collective per group, one over
        every rank, and one host read."""
        running_fp8 = self._fp8_mask(layers)
        if layers:
            forward = torch.stack([layer.forward_figures for layer in layers])
            backward = torch.stack([layer.backward_figures for layer in layers])
            verdicts = torch.cat([forward[:, WORST:NON_FINITE + 1], backward[:, WORST:NON_FINITE + 1]], dim=1)
            start = 0
            for group in (DENSE, EXPERT):
                size = sum(1 for layer in layers if layer.group == group)
                reduce = self.reductions.get(group)
                if size and reduce is not None:  # the group's worst: every rank of a layer takes the same path
                    block = verdicts[start:start + size].clone()
                    reduce(block)
                    verdicts[start:start + size] = block
                start += size
            failed = ((verdicts[:, 0::2] > self.threshold) | (verdicts[:, 1::2] > 0)).any(dim=1)
            failed_in_fp8 = (failed.double() * running_fp8).amax().reshape(1)
            figures = torch.cat([forward[:, VALUES:FLUSHED + 1] + backward[:, VALUES:FLUSHED + 1],
                                 torch.maximum(forward[:, WORST], backward[:, WORST]).unsqueeze(1),
                                 forward[:, INPUT_AMAX:]], dim=1)
        else:
            verdicts = figures = torch.zeros(0, dtype=torch.float64, device=self.device)
            failed_in_fp8 = torch.zeros(1, dtype=torch.float64, device=self.device)
        if self.any_rank is not None:
            self.any_rank(failed_in_fp8)  # every rank runs the iteration again, or none
        # The one host read of the iteration (a device synchronisation on a GPU).
        read = torch.cat([verdicts.flatten(), figures.flatten(), failed_in_fp8]).tolist()
        count = len(layers)
        return ([read[4 * index:4 * index + 4] for index in range(count)],
                [read[4 * count + 5 * index:4 * count + 5 * index + 5] for index in range(count)], read[-1] > 0)

    def _fp8_mask(self, layers: list[LayerGuard]) -> torch.Tensor:
        """1.0 for each layer that runs in FP8 (made once; _switch keeps it up to date)."""
        if self._running_fp8 is None:
            self._running_fp8 = torch.ones(len(layers), dtype=torch.float64, device=self.device)
            for index, layer in enumerate(layers):
                if layer.in_high_precision:
                    self._running_fp8[index] = 0.0
        return self._running_fp8

    def _keep_figures(self, layers: list[LayerGuard], figures: list) -> None:
        """The iteration's figures by layer, for finish_iteration, with each input amax's growth."""
        self._figures = {}
        for layer, (values, saturated, flushed, worst, input_amax) in zip(layers, figures):
            previous = self._input_amax_before.get(layer.name, 0.0)
            self._figures[layer.name] = {
                "values": int(values), "saturated": int(saturated), "flushed": int(flushed), "worst_fraction": worst,
                "input_amax": input_amax, "amax_growth": input_amax / previous if previous > 0 else None,
                "fell_back": layer.in_high_precision}
        self._input_amax_before = {name: figures["input_amax"] for name, figures in self._figures.items()}

    def _switch(self, index: int, layer: LayerGuard, high_precision: bool) -> None:
        """A layer's path for the passes to come; the device mask follows (a scalar written: no read)."""
        layer.in_high_precision = high_precision
        self._running_fp8[index] = 0.0 if high_precision else 1.0

    def finish_iteration(self) -> dict:
        """The metrics record's FP8 fields (this rank's casts), from finish_passes' read: totals over the layers,
        the worst layer by its worst cast's saturated fraction, the largest input amax and its largest growth from
        the last iteration (the amax trend), and the layers that ran in high precision."""
        per_layer = list(self._figures.items())
        self._figures = {}
        if not per_layer:
            return {}
        worst_name, worst = max(per_layer, key=lambda item: item[1]["worst_fraction"])
        growths = [figures["amax_growth"] for _, figures in per_layer if figures["amax_growth"] is not None]
        return {
            "fp8_cast_values": sum(figures["values"] for _, figures in per_layer),
            "fp8_saturated": sum(figures["saturated"] for _, figures in per_layer),
            "fp8_flushed": sum(figures["flushed"] for _, figures in per_layer),
            "fp8_worst_layer": worst_name,
            "fp8_worst_saturated_fraction": worst["worst_fraction"],
            "fp8_amax_max": max(figures["input_amax"] for _, figures in per_layer),
            "fp8_amax_growth_max": max(growths) if growths else None,
            "fp8_high_precision_layers": [name for name, figures in per_layer if figures["fell_back"]],
        }


def merge_iterations(records: list) -> dict:
    """finish_iteration's fields over a logging interval's iterations: counts summed, the worst layer the
    worst over the interval, the amax and its growth their largest, the high-precision layers' union."""
    records = [record for record in records if record]
    if not records:
        return {}
    worst = max(records, key=lambda record: record["fp8_worst_saturated_fraction"])
    growths = [record["fp8_amax_growth_max"] for record in records if record["fp8_amax_growth_max"] is not None]
    return {
        **{name: sum(record[name] for record in records)
           for name in ("fp8_cast_values", "fp8_saturated", "fp8_flushed")},
        "fp8_worst_layer": worst["fp8_worst_layer"],
        "fp8_worst_saturated_fraction": worst["fp8_worst_saturated_fraction"],
        "fp8_amax_max": max(record["fp8_amax_max"] for record in records),
        "fp8_amax_growth_max": max(growths) if growths else None,
        "fp8_high_precision_layers": sorted({name for record in records for name in record["fp8_high_precision_layers"]}),
    }
