"""FP8 that guards itself (--fp8-guard, issue 65 item 4): each FP8 linear counts, per cast, the values
saturated (|x * scale| above the format's largest value, clipped there) and flushed to zero (non-zero values
whose cast is 0), tracks its input's amax, and checks every GEMM pass it runs:

- forward: the FP8 output non-finite, or a forward cast (input or weight) saturating more than `threshold`
  of its values -> that micro-batch's forward GEMM runs again in high precision (the activations' dtype,
  bf16 in a bf16 run), and its backward GEMMs too;
- backward: the FP8 data or weight gradient non-finite, or the gradient cast saturating more than
  `threshold` -> the backward GEMMs run again in high precision.

The FP8 pass always runs first and is the check: delayed scaling's histories and amax reductions see the
same casts as without the guard (every rank joins the same collectives), and a layer in high precision goes
back to FP8 the first time its FP8 pass passes ("stays in bf16 until the next check passes"). Under tensor
parallelism the verdict is all-reduced (max) over the TP group, so every TP rank of a layer takes the same
path and the ranks never diverge. One log line when a layer falls back (layer, reason, iteration) and one
when it returns.

Counting is two reductions per cast over tensors the cast already reads (a compare-and-sum for the
saturated, a compare-and-sum for the flushed), accumulated on the device: nothing is read back until the
iteration's metrics (GuardMonitor.finish_iteration)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

# The threshold's default (--fp8-guard-saturation-threshold, gpt/model_config.py) is 5%: a correctly scaled
# cast saturates at most its amax's element (current scaling, where fp8_max / amax * amax may round an ulp
# above fp8_max: 0.1% of a tiny run's casts at worst) or the values above the last micro-batch's amax
# (delayed scaling: 1.8% at worst in docs/fp8.md's healthy 20-iteration run), while a scale 2x too large
# clips every value above half the amax (about 8% of a normally distributed tensor of 2048 values).


class CastCounts:
    """The counts of the casts of one GEMM pass (forward, or backward), as device tensors: values cast,
    saturated and flushed to zero, and the worst single cast's saturated fraction (the threshold's test)."""

    def __init__(self) -> None:
        self.values = 0
        self.saturated: torch.Tensor | int = 0
        self.flushed: torch.Tensor | int = 0
        self.worst_fraction: torch.Tensor | float = 0.0

    def add(self, scaled: torch.Tensor, clamped: torch.Tensor, data: torch.Tensor) -> None:
        """`scaled`: the values before the cast (fp32, scale applied); `clamped`: them clamped to +-fp8_max;
        `data`: the FP8 cast of `clamped`. Saturated: |scaled| > fp8_max, i.e. scaled - clamped non-zero (NaN
        is not clipped: nan_to_num makes its difference 0; the output's finiteness catches it). Flushed: the
        cast's zeros (every FP8 format here codes zero as a sign bit alone) less the zeros the values had.
        count_nonzero, not bool.sum(): on the CPU the latter costs several times the cast itself."""
        count = scaled.numel()
        saturated = torch.count_nonzero(torch.nan_to_num_(scaled - clamped))
        cast_zeros = count - torch.count_nonzero(data.view(torch.uint8) & 0x7F)
        flushed = cast_zeros - (count - torch.count_nonzero(scaled))
        self.values += count
        self.saturated = self.saturated + saturated
        self.flushed = self.flushed + flushed
        self.worst_fraction = torch.maximum(torch.as_tensor(self.worst_fraction, dtype=torch.float32),
                                            saturated.float() / max(count, 1))


@dataclass
class LayerGuard:
    """One FP8 linear's guard: its name, the threshold, the TP verdict reduction (an in-place max all-reduce
    of the pass's two figures, non-finite and worst saturated fraction; None in one process or TP 1), and what
    it saw this iteration."""
    name: str
    threshold: float
    reduce_verdict: Optional[Callable[[torch.Tensor], None]] = None
    log: Callable[[str], None] = print
    iteration: int = 0
    in_high_precision: bool = False
    # this iteration's totals (device tensors until read)
    values: int = 0
    saturated: torch.Tensor | int = 0
    flushed: torch.Tensor | int = 0
    worst_fraction: torch.Tensor | float = 0.0
    input_amax: torch.Tensor | float = 0.0
    previous_input_amax: float = 0.0
    fell_back: bool = False  # at least one pass this iteration ran in high precision

    def record(self, counts: CastCounts) -> None:
        self.values += counts.values
        self.saturated = self.saturated + counts.saturated
        self.flushed = self.flushed + counts.flushed
        self.worst_fraction = torch.maximum(torch.as_tensor(self.worst_fraction, dtype=torch.float32),
                                            torch.as_tensor(counts.worst_fraction, dtype=torch.float32))

    def record_input_amax(self, amax: torch.Tensor) -> None:
        self.input_amax = torch.maximum(torch.as_tensor(self.input_amax, dtype=torch.float32), amax.float())

    def verdict(self, counts: CastCounts, outputs: tuple[torch.Tensor, ...], what: str) -> bool:
        """Record `counts`; True when this pass must run again in high precision (the same on every TP rank).
        Logs the transitions into and out of high precision. Only a forward check brings the layer back to
        FP8: a backward after a high-precision forward runs in high precision whatever its check says."""
        self.record(counts)
        non_finite = torch.stack([torch.isfinite(out).all().logical_not() for out in outputs]).any()
        figures = torch.stack([non_finite.float(), torch.as_tensor(counts.worst_fraction, dtype=torch.float32)])
        if self.reduce_verdict is not None:
            self.reduce_verdict(figures)  # the TP group's worst: every rank of the layer takes the same path
        # The host reads the verdict to choose the path: one read-back (a device sync on a GPU) per linear and pass.
        non_finite, worst_fraction = figures.tolist()
        non_finite, saturating = non_finite > 0, worst_fraction > self.threshold
        bad = non_finite or saturating
        if bad:
            self.fell_back = True
            if not self.in_high_precision:
                reason = (f"its FP8 {what} is not finite" if non_finite else
                          f"a {what} cast saturated {worst_fraction * 100:.3g}% of its values "
                          f"(threshold {self.threshold * 100:g}%)")
                self.log(f" FP8 guard: {self.name} runs in high precision from iteration {self.iteration}: {reason}; "
                         f"the {what} GEMMs ran again in high precision")
            self.in_high_precision = True
        elif self.in_high_precision and what == "forward":
            self.log(f" FP8 guard: {self.name} back in FP8 at iteration {self.iteration}: its forward check passed")
            self.in_high_precision = False
        return bad

    def take_iteration(self) -> dict:
        """This iteration's figures (read back now), and the counters reset for the next."""
        amax = float(self.input_amax)
        figures = {"values": self.values, "saturated": int(self.saturated), "flushed": int(self.flushed),
                   "worst_fraction": float(self.worst_fraction), "input_amax": amax,
                   "amax_growth": amax / self.previous_input_amax if self.previous_input_amax > 0 else None,
                   "fell_back": self.fell_back}
        self.previous_input_amax = amax
        self.values, self.saturated, self.flushed, self.worst_fraction = 0, 0, 0, 0.0
        self.input_amax, self.fell_back = 0.0, False
        return figures


@dataclass
class GuardMonitor:
    """Every FP8 linear's guard of this rank's model, and the iteration's metrics from them."""
    layers: list = field(default_factory=list)

    def begin_iteration(self, iteration: int) -> None:
        for layer in self.layers:
            layer.iteration = iteration

    def finish_iteration(self) -> dict:
        """The metrics record's FP8 fields (this rank's casts): totals over the layers, the worst layer by its
        worst cast's saturated fraction, the largest input amax and its largest growth from the last
        iteration (the amax trend), and the layers that ran any pass in high precision."""
        per_layer = [(layer.name, layer.take_iteration()) for layer in self.layers]
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
