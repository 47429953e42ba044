"""The FP8 section of the model settings: Megatron-LM's --fp8-* flags with TransformerConfig's defaults,
DeepSpeed-Megatron's --fp8-e4m3 / --fp8-hybrid, and --first-last-layers-bf16; gpt/fp8.py applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from base.errors import ConfigError
from base.options import Const, option

FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPE_CHOICES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
# the largest margin whose 2**margin fits int64, as torch takes the divisor
MAX_FP8_MARGIN = 62


@dataclass(frozen=True)
class FP8Settings:
    SETTING_PREFIX: ClassVar[str] = "fp8_"

    format: Optional[str] = option(
        None, setting="fp8", flags=("--fp8-format",), choices=FP8_FORMATS, group="zero",
        consts=[Const(("--fp8-e4m3",), "e4m3", help="DeepSpeed-Megatron: --fp8-format e4m3"),
                Const(("--fp8-hybrid",), "hybrid", help="DeepSpeed-Megatron: --fp8-format hybrid")],
        help="the blocks' linears' GEMMs in FP8 through torch._scaled_mm (docs/fp8.md): e4m3 everywhere, or "
             "hybrid (e4m3 forward, e5m2 gradients); no model parallelism so far")
    recipe: str = option(
        "delayed", choices=FP8_RECIPE_CHOICES, group="zero",
        help="with --fp8-format, TransformerEngine's recipe: delayed (amax history), tensorwise (current "
             "per-tensor scales), blockwise (1x128 activations, 128x128 weights), mxfp8 (1x32 blocks, E8M0 scales, "
             "emulated); custom is refused")
    margin: int = option(0, group="zero", help="delayed scaling: scale = fp8_max / amax / 2^margin")
    amax_history_len: int = option(1, group="zero", help="delayed scaling: the amax history's length")
    amax_compute_algo: str = option(
        "most_recent", choices=("most_recent", "max"), group="zero",
        help="delayed scaling: the amax from the history's most recent entry or its max")
    wgrad: bool = option(
        True, group="zero", consts=[Const(("--disable-fp8-wgrad",), False,
                                          help="Megatron-LM: --no-fp8-wgrad")],
        help="the weight-gradient GEMM in FP8 (Megatron passes --no-fp8-wgrad to delayed scaling only)")
    param_gather: bool = option(
        False, action="store_true", group="zero",
        help="with --fp8-format and ZeRO stages 1-3, the FP8 linears' weights cast to e4m3 from the fp32 master after "
             "each step and all-gathered as FP8 bytes (1 byte per element, mxfp8 2: its rowwise and columnwise casts)")
    # not Megatron-LM's: see docs/fp8.md "The guard"
    guard: bool = option(
        True, group="zero",
        help="with --fp8-format, count each FP8 cast's saturated and flushed values per layer into the metrics, and "
             "run a layer's GEMMs again in high precision where its FP8 output could be non-finite or a cast saturates "
             "more than --fp8-guard-saturation-threshold of its values (--no-fp8-guard: none of it)")
    guard_saturation_threshold: float = option(
        0.05, group="zero",
        help="--fp8-guard: the fraction of one cast's values saturated above which its layer falls back to high "
             "precision (default 0.05: a well scaled cast clips at most the values above its last amax; a scale "
             "2x too large clips about 8%% of a normal tensor)")
    # not Megatron-LM's: see docs/fp8.md "Fused casts"
    fused_casts: str = option(
        "auto", choices=("auto", "on", "off"), group="zero",
        help="with --fp8-format, each FP8 cast (amax, scale, quantize, its transpose, the guard's counts) and each "
             "GEMM's epilogue as one torch.compile'd region: auto fuses on CUDA and not on a CPU (compiling costs "
             "seconds a region), on fuses wherever inductor compiles, off never")
    first_last_layers_bf16: bool = option(
        False, action="store_true", group="zero", setting="first_last_layers_bf16",
        help="with --fp8-format, keep the first and last blocks' linears in high precision")
    num_layers_at_start_in_bf16: int = option(1, group="zero", setting="num_layers_at_start_in_bf16",
                                              help="--first-last-layers-bf16's blocks at the start")
    num_layers_at_end_in_bf16: int = option(1, group="zero", setting="num_layers_at_end_in_bf16",
                                            help="--first-last-layers-bf16's blocks at the end")

    @property
    def enabled(self) -> bool:
        return self.format is not None

    def keeps_high_precision(self, layer: int, num_layers: int) -> bool:
        """Whether block `layer` stays in high precision (Megatron's is_first_last_bf16_layer)."""
        if not self.first_last_layers_bf16:
            return False
        return layer < self.num_layers_at_start_in_bf16 or layer >= num_layers - self.num_layers_at_end_in_bf16

    def validate(self, num_layers: int) -> None:
        if not self.enabled:
            return
        what = f"--fp8-format {self.format} --fp8-recipe {self.recipe}"
        if self.recipe == "custom":
            raise ConfigError(f"{what}: the custom recipe (--fp8-quantizer-factory, a TE quantizer factory) is not "
                              f"available here; use delayed, tensorwise, blockwise or mxfp8")
        threshold = self.guard_saturation_threshold
        if self.guard and not 0.0 <= threshold <= 1.0:  # a fraction of a cast's values
            raise ConfigError(f"--fp8-guard-saturation-threshold {threshold:g} must be a fraction between 0 and 1 "
                              f"(of one cast's values)")
        if self.amax_history_len < 1:
            raise ConfigError(f"--fp8-amax-history-len {self.amax_history_len} must be at least 1")
        if self.margin > MAX_FP8_MARGIN:
            raise ConfigError(f"--fp8-margin {self.margin}: delayed scaling divides by 2**margin as an integer "
                              f"(TransformerEngine's _default_sf_compute, parallel/fp8/recipes.py), which a tensor "
                              f"cannot take beyond int64: at most {MAX_FP8_MARGIN}")
        if self.first_last_layers_bf16:
            self._validate_first_last(what, num_layers)

    def _validate_first_last(self, what: str, num_layers: int) -> None:
        if self.recipe == "delayed":  # Megatron-Core's TransformerConfig.__post_init__
            raise ConfigError(f"{what} --first-last-layers-bf16: delayed scaling does not support first / last "
                              f"layer in BF16 (as in Megatron-Core); use tensorwise, blockwise or mxfp8")
        for flag, count in (("--num-layers-at-start-in-bf16", self.num_layers_at_start_in_bf16),
                            ("--num-layers-at-end-in-bf16", self.num_layers_at_end_in_bf16)):
            if not 0 <= count <= num_layers:
                raise ConfigError(f"{flag} {count} must be between 0 and the number of layers ({num_layers})")
