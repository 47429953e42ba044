"""FP8 that guards itself (--fp8-guard) with no host read inside a micro-batch: each FP8 linear counts saturated and
flushed values and checks each pass's outputs on the device; once an iteration the verdicts are reduced and read in one
go, and a failed layer switches to high precision and the iteration runs again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from parallel.fp8.recipes import FP8_MAX

# 5%: a correctly scaled cast saturates at most ~2%, a scale 2x too large about 8%

# a pass's figures per layer, float64 so counts stay exact
VALUES, SATURATED, FLUSHED, WORST, NON_FINITE, INPUT_AMAX = range(6)
DENSE, EXPERT = "tp", "etp"


class CastCounts:
    """The counts of one GEMM pass's casts, added in place into `figures`, inside the cast regions."""

    def __init__(self, figures: Optional[torch.Tensor] = None, counted: Optional[torch.Tensor] = None) -> None:
        self.figures = figures
        # a compiled block's weight cast counts in the first micro-batch only; None: every cast
        self.counted = counted
        self.values = 0

    def add(self, scaled: torch.Tensor, clamped: torch.Tensor, data: torch.Tensor) -> None:
        """`scaled`: values before the cast; `clamped`: clamped to +-fp8_max; `data`: the cast. Flushed: the cast's
        zeros less the values' own. count_nonzero: bool.sum() is slow on the CPU."""
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
    """NON_FINITE becomes 1 where an output is not finite."""
    non_finite = torch.stack([torch.isfinite(out).all().logical_not() for out in outputs]).any()
    figures[NON_FINITE] = torch.maximum(figures[NON_FINITE], non_finite.double())


def record_finite(figures: torch.Tensor, amax: torch.Tensor) -> None:
    figures[NON_FINITE] = torch.maximum(figures[NON_FINITE], torch.isfinite(amax).logical_not().double())


def output_bound_limit(k: int, first_dtype: torch.dtype, second_dtype: torch.dtype, out_dtype: torch.dtype) -> float:
    """The bound on a GEMM's two largest dequantizing scales' product below which every output is finite."""
    return torch.finfo(out_dtype).max / 2 / (max(k, 1) * FP8_MAX[first_dtype] * FP8_MAX[second_dtype])


def record_output_bounds(figures: torch.Tensor, amax: torch.Tensor, bounds: tuple) -> None:
    """A pass's check made in its last cast instead of reading its outputs: NON_FINITE becomes 1 where the operand is
    not finite or a GEMM's bound is reached. `bounds`: per GEMM, (its scales, the other's, the limit)."""
    failed = torch.isfinite(amax).logical_not()
    for own, other, limit in bounds:
        failed = failed | (own.amax().float() * other.amax().float() < limit).logical_not()
    figures[NON_FINITE] = torch.maximum(figures[NON_FINITE], failed.double())


def record_input_amax(figures: torch.Tensor, amax: torch.Tensor) -> None:
    figures[INPUT_AMAX] = torch.maximum(figures[INPUT_AMAX], amax.double())


@dataclass
class LayerGuard:
    """One FP8 linear's guard: its name, verdict group, path (host state, changed between iterations) and figures."""
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
    """Every FP8 linear's guard on this rank: the iteration's verdict and metrics. `reductions`: max all-reduces per
    group; `any_rank`: over every rank."""
    threshold: float = 0.05
    reductions: dict = field(default_factory=dict)
    any_rank: Optional[Callable[[torch.Tensor], None]] = None
    device: torch.device | str = "cpu"
    layers: list = field(default_factory=list)
    iteration: int = 0
    _figures: dict = field(default_factory=dict)
    _input_amax_before: dict = field(default_factory=dict)
    _running_fp8: Optional[torch.Tensor] = None

    def _ordered(self) -> list[LayerGuard]:
        return [layer for group in (DENSE, EXPERT) for layer in self.layers if layer.group == group]

    def begin_iteration(self, iteration: int) -> None:
        self.iteration = iteration
        self.begin_replay()

    def begin_replay(self) -> None:
        tensors = [tensor for layer in self.layers for tensor in (layer.forward_figures, layer.backward_figures)]
        if tensors:
            torch._foreach_zero_(tensors)

    def finish_passes(self) -> bool:
        """After the micro-batches: reduce, read once, decide. True when a layer in FP8 failed on some rank: every rank
        runs the iteration again. Layers whose forward check passed return to FP8."""
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
        """Verdicts reduced per group, this rank's figures, and whether an FP8 layer failed anywhere: one host read."""
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
            self.any_rank(failed_in_fp8)
        read = torch.cat([verdicts.flatten(), figures.flatten(), failed_in_fp8]).tolist()
        count = len(layers)
        return ([read[4 * index:4 * index + 4] for index in range(count)],
                [read[4 * count + 5 * index:4 * count + 5 * index + 5] for index in range(count)], read[-1] > 0)

    def _fp8_mask(self, layers: list[LayerGuard]) -> torch.Tensor:
        if self._running_fp8 is None:
            self._running_fp8 = torch.ones(len(layers), dtype=torch.float64, device=self.device)
            for index, layer in enumerate(layers):
                if layer.in_high_precision:
                    self._running_fp8[index] = 0.0
        return self._running_fp8

    def _keep_figures(self, layers: list[LayerGuard], figures: list) -> None:
        self._figures = {}
        for layer, (values, saturated, flushed, worst, input_amax) in zip(layers, figures):
            previous = self._input_amax_before.get(layer.name, 0.0)
            self._figures[layer.name] = {
                "values": int(values), "saturated": int(saturated), "flushed": int(flushed), "worst_fraction": worst,
                "input_amax": input_amax, "amax_growth": input_amax / previous if previous > 0 else None,
                "fell_back": layer.in_high_precision}
        self._input_amax_before = {name: figures["input_amax"] for name, figures in self._figures.items()}

    def _switch(self, index: int, layer: LayerGuard, high_precision: bool) -> None:
        layer.in_high_precision = high_precision
        self._running_fp8[index] = 0.0 if high_precision else 1.0

    def finish_iteration(self) -> dict:
        """The metrics record's FP8 fields for this rank."""
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
    """finish_iteration's fields merged over a logging interval."""
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
