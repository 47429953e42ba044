"""Each decoder layer's parts, chosen once when the model is built: its mixer and its MLP, each named by its
--hybrid-layer-pattern symbol (`*` attention, `+` multi-latent attention, `M` Mamba-2, `G` Gated DeltaNet; `-` the
dense or gated MLP, `E` an MoE layer with its settings) or None where the pattern's block has only the other half,
its sliding window and whether its attention rotates.

One path computes them for every layer, from the GPT flags (--multi-latent-attention for every layer,
--experimental-attention-variant gated_delta_net with --linear-attention-freq, --moe-layer-freq, --window-size and
--window-attn-skip-freq, --no-rope-freq) or from --hybrid-layer-pattern, whose blocks give each layer's mixer and
MLP (gpt/hybrid_pattern.py; --moe-layer-freq says the same MoE blocks). The block (gpt/model.py TransformerBlock)
builds each part by its symbol, one builder per symbol beside the module it builds (gpt/model.py build_attention,
gpt/mla.py build_mla, gpt/mamba.py build_mamba, gpt/gated_delta_net.py build_gated_delta_net, gpt/mlp.py build_mlp,
gpt/moe/layer.py build_moe_layer), so a layer's parts are chosen here once, as Megatron-Core's ModuleSpec chooses
them, and never tested at a call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gpt.hybrid_pattern import ATTENTION, GDN, MLA, MLP, MOE, parse_hybrid_pattern
from gpt.model_config import ModelConfig
from gpt.moe.settings import MoESettings


@dataclass(frozen=True)
class LayerSpec:
    """One layer: its mixer's and its MLP's symbols (one None for a pattern's one-part block, `M` or `-` alone), an
    `E` layer's MoE settings (ModelConfig.moe_of), its window (the keys before each query it sees, None for the whole
    causal context) and whether its attention rotates (--no-rope-freq)."""
    mixer: Optional[str]
    mlp: Optional[str]
    moe: Optional[MoESettings] = None
    window: Optional[int] = None
    rotary: bool = True


def mixer_symbols(config: ModelConfig) -> tuple[Optional[str], ...]:
    """Each layer's mixer symbol: the pattern's (None for an MLP block), or the GPT flags' (`G` on the Gated DeltaNet
    layers of --experimental-attention-variant gated_delta_net and --linear-attention-freq, the others `+` with
    --multi-latent-attention, else `*`: Megatron-Core's experimental layer specs)."""
    if config.hybrid_layer_pattern is not None:
        return parse_hybrid_pattern(config.hybrid_layer_pattern).mixers()
    attention = MLA if config.mla.multi_latent_attention else ATTENTION
    return tuple(GDN if gdn else attention for gdn in config.gdn.gdn_layers(config.num_layers))


def layer_specs(config: ModelConfig) -> tuple[LayerSpec, ...]:
    """Every decoder layer's spec, in order (an MTP layer's block takes the last one's, as Megatron-Core's GPT MTP)."""
    windows, rotary = config.attention_windows(), config.positions.rotary_layers(config.num_layers)
    moe = config.moe_layers()
    mlps = tuple(MOE if layer_moe else MLP for layer_moe in moe) if config.hybrid_layer_pattern is None else \
        parse_hybrid_pattern(config.hybrid_layer_pattern).mlps()
    return tuple(LayerSpec(mixer, mlps[layer], config.moe_of(layer) if moe[layer] else None,
                           windows[layer], rotary[layer]) for layer, mixer in enumerate(mixer_symbols(config)))
