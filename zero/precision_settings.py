"""Mixed precision's settings: bf16 or fp16 parameters and gradients, fp16's loss scaling, the gradients'
reduction dtype; a section of TrainingConfig read by the ZeRO optimizer, with its refusal checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from base.errors import ConfigError
from base.options import flag_of_setting, option


@dataclass(frozen=True)
class PrecisionSettings:
    SETTING_PREFIX: ClassVar[str] = ""

    # Mixed precision: bf16 or fp16 parameters and gradients, fp32 master weights and Adam states.
    bf16: bool = option(False, group="zero",
                        help="bf16 mixed precision: bf16 parameters and gradients, fp32 master weights and Adam "
                             "states in the ZeRO optimizer")
    fp16: bool = option(False, group="zero",
                        help="fp16 mixed precision: fp16 parameters and gradients, fp32 master weights and Adam "
                             "states in the ZeRO optimizer, with dynamic loss scaling (or --loss-scale)")
    loss_scale: Optional[float] = option(None, group="zero", help="fp16: a static loss scale (None: dynamic scaling)")
    initial_loss_scale: float = option(2.0**16, group="zero", help="fp16: where dynamic loss scaling starts")
    loss_scale_window: int = option(1000, group="zero",
                                    help="fp16: overflow-free steps before the loss scale doubles")
    hysteresis: int = option(2, group="zero", help="fp16: overflows tolerated before the loss scale is lowered")
    min_loss_scale: float = option(1.0, group="zero", help="fp16: dynamic loss scaling never goes below this",
                                   aliases={"--min-scale": "DeepSpeedExamples' Megatron"})
    # From 2**32, halving on every overflow reaches 1 in 32 + hysteresis steps, so 100 leaves room for any
    # honest start: a run that skips that many in a row found no scale at which the gradients are finite.
    max_consecutive_skipped_iterations: int = option(
        100, group="zero",
        help="fp16: stop as diverged after this many overflow-skipped steps in a row (0: no limit)")
    # None means the default for the precision: on for bf16 (as Megatron and DeepSpeed do), off for fp16
    # (the paper's 16-bit gradients). --grad-reduce-in-bf16 is a SPELLING (arguments/megatron/flags.py).
    accumulate_allreduce_grads_in_fp32: Optional[bool] = option(
        None, group="zero",
        help="accumulate and reduce gradients in fp32 (Megatron's flag; default: on with --bf16, off with --fp16, "
             "whose gradients stay 16-bit as in the ZeRO paper)",
        aliases={"--fp32-allreduce": "DeepSpeedExamples' Megatron"})

    @property
    def precision(self) -> str:
        """The training precision: "fp32", "bf16" or "fp16"."""
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"

    @property
    def gradient_precision(self) -> str:
        """What gradients are accumulated and reduced in: "fp32", or the training precision."""
        fp32 = self.accumulate_allreduce_grads_in_fp32
        if fp32 is None:
            fp32 = self.precision == "bf16"
        return "fp32" if fp32 else self.precision

    def validate(self) -> None:
        """16-bit training and its loss scaler."""
        for name in ("loss_scale_window", "hysteresis"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        if self.fp16 and self.bf16:
            raise ConfigError("--fp16 and --bf16 are exclusive: choose one (add --no-fp16 or --no-bf16 to "
                              "override a preset or --zero-config)", flags=("--fp16", "--bf16"))
        if self.max_consecutive_skipped_iterations < 0:
            raise ConfigError(f"{_flag('max_consecutive_skipped_iterations')} must be 0 (no limit) or more, got "
                              f"{self.max_consecutive_skipped_iterations}",
                              flags=(_flag("max_consecutive_skipped_iterations"),))
        for name in ("loss_scale", "initial_loss_scale", "min_loss_scale"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise ConfigError(f"{_flag(name)} must be a positive number, got {value}", flags=(_flag(name),))
        if self.min_loss_scale > self.initial_loss_scale:
            raise ConfigError(f"--min-loss-scale {self.min_loss_scale} is larger than --initial-loss-scale "
                              f"{self.initial_loss_scale}; lower the former or raise the latter",
                              flags=("--min-loss-scale", "--initial-loss-scale"))


def _flag(name: str) -> str:
    return flag_of_setting(PrecisionSettings, name)
