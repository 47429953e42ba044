"""Each decoder layer's parts, chosen once at build: its mixer and MLP by --hybrid-layer-pattern symbol, its sliding
window and whether it rotates, computed on one path for every layer from the GPT flags or the pattern."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gpt.hybrid_pattern import ATTENTION, GDN, MLA, MLP, MOE, parse_hybrid_pattern
from gpt.model_config import ModelConfig
from gpt.moe.settings import MoESettings


@dataclass(frozen=True)
class LayerSpec:
    """One layer: mixer and MLP symbols (one None for a one-part block), its MoE settings, window and rotation."""
    mixer: Optional[str]
    mlp: Optional[str]
    moe: Optional[MoESettings] = None
    window: Optional[int] = None
    rotary: bool = True


def mixer_symbols(config: ModelConfig) -> tuple[Optional[str], ...]:
    """Each layer's mixer symbol: the pattern's, or the GPT flags' (`G`, `+` or `*`, as Megatron-Core's experimental
    layer specs)."""
    if config.hybrid_layer_pattern is not None:
        return parse_hybrid_pattern(config.hybrid_layer_pattern).mixers()
    attention = MLA if config.mla.multi_latent_attention else ATTENTION
    return tuple(GDN if gdn else attention for gdn in config.gdn.gdn_layers(config.num_layers))


def layer_specs(config: ModelConfig) -> tuple[LayerSpec, ...]:
    """Every decoder layer's spec in order."""
    windows, rotary = config.attention_windows(), config.positions.rotary_layers(config.num_layers)
    moe = config.moe_layers()
    mlps = tuple(MOE if layer_moe else MLP for layer_moe in moe) if config.hybrid_layer_pattern is None else \
        parse_hybrid_pattern(config.hybrid_layer_pattern).mlps()
    return tuple(LayerSpec(mixer, mlps[layer], config.moe_of(layer) if moe[layer] else None,
                           windows[layer], rotary[layer]) for layer, mixer in enumerate(mixer_symbols(config)))
