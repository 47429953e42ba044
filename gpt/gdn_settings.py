"""Gated DeltaNet's section of the model settings: Megatron-LM 0.19's --experimental-attention-variant gated_delta_net,
--linear-attention-freq and --linear-* sizes, which also size a pattern's `G` layers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Union

from base.errors import ConfigError
from base.options import flag_of_setting, option
from gpt.layer_pattern import freq_value, layer_flags

VARIANT_FLAG, FREQ_FLAG = "--experimental-attention-variant", "--linear-attention-freq"
# Megatron-LM's spellings of the variant
GDN_VARIANTS = ("gated_delta_net", "gdn")
# what else the flag names in Megatron-LM, not built here
OTHER_VARIANTS = {"gdn2": "Gated DeltaNet 2", "dsa": "DeepSeek sparse attention (DSA)"}


@dataclass(frozen=True)
class GatedDeltaNetSettings:
    """The Gated DeltaNet section; defaults are Megatron-LM's."""
    SETTING_PREFIX: ClassVar[str] = ""

    experimental_attention_variant: Optional[str] = option(
        None, choices=(*GDN_VARIANTS, *OTHER_VARIANTS),
        help="gated_delta_net (or gdn): Gated DeltaNet layers where --linear-attention-freq says, attention on the "
             "others (Megatron-LM's experimental layer specs)")
    linear_attention_freq: Union[None, int, str] = option(
        None, type=freq_value,
        help="with --experimental-attention-variant gated_delta_net: N, a Gated DeltaNet layer except at every N-th "
             "layer (attention); or a list expression, one 1 (GDN) or 0 (attention) per layer")
    linear_conv_kernel_dim: int = option(4, help="the Gated DeltaNet layers' causal convolution width")
    linear_key_head_dim: int = option(128, help="each Gated DeltaNet query/key head's dims")
    linear_value_head_dim: int = option(128, help="each Gated DeltaNet value head's dims")
    linear_num_key_heads: int = option(16, help="the Gated DeltaNet layers' query/key heads")
    linear_num_value_heads: int = option(32, help="the Gated DeltaNet layers' value heads, a multiple of the key heads")

    @property
    def gated_delta_net(self) -> bool:
        return self.experimental_attention_variant in GDN_VARIANTS

    def gdn_layers(self, num_layers: int) -> tuple[bool, ...]:
        """Per layer, whether it is Gated DeltaNet: an int N puts attention at each (i + 1) % N == 0 and GDN elsewhere,
        as Megatron-Core."""
        if not self.gated_delta_net:
            return (False,) * num_layers
        freq = self.linear_attention_freq
        if freq is None:
            raise ConfigError(f"{VARIANT_FLAG} {self.experimental_attention_variant} needs {FREQ_FLAG} (N, or a list "
                              f"of 1s and 0s per layer), as Megatron-LM requires", flags=(VARIANT_FLAG, FREQ_FLAG))
        if isinstance(freq, int):
            if freq < 1:
                raise ConfigError(f"{FREQ_FLAG} must be at least 1, got {freq}", flags=(FREQ_FLAG,))
            return tuple((layer + 1) % freq != 0 for layer in range(num_layers))
        return tuple(bool(value) for value in layer_flags(str(freq), FREQ_FLAG, num_layers,
                                                            "1 (Gated DeltaNet) or 0 (attention)"))

    def has_layers(self, num_layers: int) -> bool:
        """Whether some layer is Gated DeltaNet, without a tuple per layer."""
        freq = self.linear_attention_freq
        if self.gated_delta_net and isinstance(freq, int) and freq >= 1:
            return freq > 1 and num_layers > 0
        return self.gated_delta_net and any(self.gdn_layers(num_layers))

    def validate(self, has_gdn_layers: bool) -> None:
        """The variant, and the sizes where some layer is Gated DeltaNet."""
        variant = self.experimental_attention_variant
        if variant in OTHER_VARIANTS:
            raise ConfigError(f"{VARIANT_FLAG} {variant}: {OTHER_VARIANTS[variant]} is not implemented here; the "
                              f"variant built is gated_delta_net (Gated DeltaNet)", flags=(VARIANT_FLAG,))
        if not has_gdn_layers:
            return
        for name in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                     "linear_num_key_heads", "linear_num_value_heads"):
            if getattr(self, name) < 1:
                flag = flag_of_setting(GatedDeltaNetSettings, name)
                raise ConfigError(f"{flag} must be at least 1, got {getattr(self, name)}", flags=(flag,))
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ConfigError(f"--linear-num-value-heads {self.linear_num_value_heads} must be a multiple of "
                              f"--linear-num-key-heads {self.linear_num_key_heads}: each query/key head serves "
                              f"a group of value heads (as Megatron-Core asserts)",
                              flags=("--linear-num-value-heads", "--linear-num-key-heads"))
