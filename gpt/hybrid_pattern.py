"""Megatron-LM's --hybrid-layer-pattern, read as the GPT blocks it names.

Megatron-Core's HybridModel (megatron/core/models/hybrid/hybrid_layer_allocation.py @ d98e8a64) builds one layer
per symbol: `*` attention, `+` multi-latent attention, `M` Mamba-2, `G` Gated DeltaNet, `-` MLP, `E` MoE (and `D`
DeepSeek sparse attention); `|` separates pipeline segments, segment vp * PP + pp_rank being model chunk vp of
pipeline rank pp_rank (select_pipeline_segment); `/` starts the MTP patterns, "<main>/<mtp>/<mtp>", one per MTP
depth, all identical (parse_hybrid_pattern).

A block here is a pre-norm residual mixer then its MLP, either half of which may be absent. A mixer followed at
once by an MLP symbol is one block (`*-`, `*E`, `+-`, `M-`, `G-`, `GE`: so the patterns built before one-part
blocks, all of `*-`, `*E`, `+-`, `+E`, `G-` and `GE` (Qwen3-Next's layers), keep their blocks and parameter names);
every other symbol is a block of its own half, `M` a Mamba block without an MLP, a lone `-` an MLP block without a
mixer. Two Megatron layers x + f(norm(x)) then x + g(norm(x)) are exactly the one block's two halves, so the
pairing changes no math: block k starts at Megatron's layer `layer_offsets()[k]` (one per symbol), which is how
names and counts map between the two numberings. What no block here is (another layer family) is refused in one
line.

The settings the pattern gives are the GPT path's own (the depth in blocks, --moe-layer-freq's per-block list, the
stages as --pipeline-model-parallel-layout, --mtp-num-layers); arguments/megatron/hybrid_layer_pattern.py sets them,
and gpt/layer_spec.py reads each block's mixer and MLP. `+` layers take multi-latent attention's sizes from
--multi-latent-attention's flags, as Megatron-LM builds them only under it (MLATransformerConfig); `G` layers
their sizes from the --linear-* flags (gpt/gdn_settings.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError

FLAG = "--hybrid-layer-pattern"
ATTENTION, MLA, MAMBA, GDN, MLP, MOE, PIPE, MTP_SEPARATOR = "*", "+", "M", "G", "-", "E", "|", "/"
MIXERS = (ATTENTION, MLA, MAMBA, GDN)
MLPS = (MLP, MOE)
# the blocks an MTP layer may be (Megatron-Core's GPT MTP layer: attention, or here Gated DeltaNet, then its MLP)
BLOCKS = tuple(mixer + mlp for mixer in (ATTENTION, MLA, GDN) for mlp in MLPS)
# Megatron-Core's other layer symbols (Symbols, hybrid_layer_allocation.py @ d98e8a64), each a layer family not
# built here
NOT_BUILT = {"D": "DeepSeek sparse attention (DSA)"}


@dataclass(frozen=True)
class HybridPattern:
    text: str
    segments: tuple[tuple[str, ...], ...]  # the main pattern's `|` segments, each its blocks ("*-", "M", "-", ...)
    mtp_block: Optional[str]               # the block of each MTP depth, None without MTP
    mtp_depth: int

    @property
    def blocks(self) -> tuple[str, ...]:
        return tuple(block for segment in self.segments for block in segment)

    @property
    def num_layers(self) -> int:
        """The GPT blocks (--num-layers here)."""
        return len(self.blocks)

    @property
    def megatron_layers(self) -> int:
        """Megatron's num_layers for the pattern (get_hybrid_total_layer_count): one per symbol of the main pattern."""
        return sum(len(block) for block in self.blocks)

    def layer_offsets(self) -> tuple[int, ...]:
        """Each block's first Megatron layer (0-based; a block is one or two of Megatron's layers)."""
        offsets = [0]
        for block in self.blocks[:-1]:
            offsets.append(offsets[-1] + len(block))
        return tuple(offsets)

    def moe_layers(self) -> tuple[bool, ...]:
        return tuple(block[-1] == MOE for block in self.blocks)

    def mixers(self) -> tuple[Optional[str], ...]:
        """Each block's mixer symbol, `*` (attention), `+` (MLA), `M` (Mamba) or `G` (Gated DeltaNet); None for an
        MLP block."""
        return tuple(block[0] if block[0] in MIXERS else None for block in self.blocks)

    def mlps(self) -> tuple[Optional[str], ...]:
        """Each block's MLP symbol, `-` (dense) or `E` (MoE); None for a mixer block."""
        return tuple(block[-1] if block[-1] in MLPS else None for block in self.blocks)

    def moe_layer_freq(self) -> str:
        """--moe-layer-freq as a list expression, one 0 (dense) or 1 (MoE) per block."""
        return "[" + ",".join(str(int(moe)) for moe in self.moe_layers()) + "]"

    def pipeline_layout(self) -> str:
        """The segments as --pipeline-model-parallel-layout (gpt/pipeline_layout.py): the same virtual stages, the
        k-th being chunk k // PP of rank k % PP there as here; E on the first, the MTP layers and L on the last."""
        stages = ["t" * len(segment) for segment in self.segments]
        stages[0] = "E" + stages[0]
        stages[-1] += "m" * self.mtp_depth + "L"
        return "|".join(stages)


def _refuse(text: str, why: str) -> ConfigError:
    return ConfigError(f"{FLAG} {text}: {why}", flags=(FLAG,))


def _check_symbols(text: str) -> None:
    for symbol in text:
        if symbol in NOT_BUILT:
            raise _refuse(text, f"`{symbol}` ({NOT_BUILT[symbol]}) layers are not built here; the pattern builds "
                                f"`*` attention, `+` MLA, `M` Mamba, `G` Gated DeltaNet, `-` MLP and `E` MoE "
                                f"layers")
        if symbol not in (*MIXERS, *MLPS, PIPE, MTP_SEPARATOR):
            raise _refuse(text, f"{symbol!r} is not a layer symbol (Megatron-Core's: `*` attention, `-` MLP, `E` MoE, "
                                f"`M` Mamba, `G` GDN, `D` DSA, `+` MLA; `|` a pipeline segment boundary, `/` MTP)")


def pattern_blocks(part: str) -> tuple[str, ...]:
    """The blocks of one segment: a mixer with the MLP symbol right after it, else each symbol alone."""
    blocks, at = [], 0
    while at < len(part):
        take = 2 if part[at] in MIXERS and part[at + 1:at + 2] in MLPS else 1
        blocks.append(part[at:at + take])
        at += take
    return tuple(blocks)


def parse_hybrid_pattern(text: str) -> HybridPattern:
    """The pattern's blocks, stages and MTP depth; ConfigError in one line for what is not built here."""
    _check_symbols(text)
    main, *mtp_parts = text.split(MTP_SEPARATOR)
    if any(part != mtp_parts[0] for part in mtp_parts):  # Megatron: "All MTP patterns must be identical"
        raise _refuse(text, f"the MTP patterns after `/` differ ({', '.join(repr(part) for part in mtp_parts)}): "
                            f"each `/` gives one MTP depth, all identical (as Megatron-Core requires)")
    mtp_block = None
    if mtp_parts and mtp_parts[0]:  # "<main>/" alone (or "/" parts all empty) is no MTP, as Megatron reads it
        if PIPE in mtp_parts[0]:
            raise _refuse(text, "`|` in an MTP pattern: pipeline segments are the main pattern's (before the `/`)")
        mtp = pattern_blocks(mtp_parts[0])
        if len(mtp) != 1 or mtp[0] not in BLOCKS:
            raise _refuse(text, f"the MTP pattern {mtp_parts[0]!r} is not one attention or GDN block: an MTP layer "
                                f"here is one block (Megatron-Core's GPT MTP layer), `*-`, `*E`, `+-`, `+E`, `G-` "
                                f"or `GE`")
        mtp_block = mtp[0]
    segments = main.split(PIPE)  # a `|` between a mixer and an MLP makes them two blocks, as Megatron's two layers
    pattern = HybridPattern(text, tuple(pattern_blocks(segment) for segment in segments), mtp_block,
                            len(mtp_parts) if mtp_block else 0)
    if pattern.num_layers == 0:
        raise _refuse(text, "no decoder layers before the MTP patterns: give at least one layer symbol")
    if mtp_block is not None and mtp_block != pattern.blocks[-1]:
        # gpt/model.py builds each MTP layer's block of the last decoder layer's kind, as Megatron-Core's GPT MTP
        raise _refuse(text, f"the MTP block {mtp_block!r} differs from the last decoder block "
                            f"{pattern.blocks[-1]!r}: an MTP layer here is a block of the last decoder layer's kind "
                            f"(Megatron-Core's GPT MTP), its mixer and its MLP (dense or MoE) as they are")
    return pattern


def residual_branches(text: Optional[str], num_layers: int) -> int:
    """What the output projections' std divides over, sqrt of it (Megatron's output_layer_init_method,
    scaled_init_method_normal): GPT-2's and Megatron's 2 per GPT layer, or a hybrid model's 1 per layer, one per
    symbol (TransformerConfig's multiplier 1.0 under is_hybrid_model), the same for patterns of mixer-then-MLP
    blocks."""
    return 2 * num_layers if text is None else parse_hybrid_pattern(text).megatron_layers


def check_model_follows_pattern(model) -> None:
    """A ModelConfig with a pattern holds the depth, MoE layers and MTP depth the pattern gives (set from the flags
    by arguments/megatron/hybrid_layer_pattern.py; a config built in code must give them too)."""
    pattern = parse_hybrid_pattern(model.hybrid_layer_pattern)
    if model.num_layers != pattern.num_layers:
        raise ConfigError(f"{FLAG} {pattern.text} is {pattern.num_layers} blocks (Megatron's {pattern.megatron_layers} "
                          f"layers), not --num-layers {model.num_layers}: drop --num-layers, the pattern sets the "
                          f"depth (as in Megatron-LM)", flags=(FLAG, "--num-layers"))
    if model.mtp.num_layers != pattern.mtp_depth:
        raise ConfigError(f"{FLAG} {pattern.text} gives {pattern.mtp_depth} MTP layers (one per `/`), not "
                          f"--mtp-num-layers {model.mtp.num_layers}: drop --mtp-num-layers, or write its depths in "
                          f"the pattern", flags=(FLAG, "--mtp-num-layers"))
    mla = MLA in pattern.mixers()
    if mla != model.mla.multi_latent_attention:
        # Megatron-LM's `+` layers read MLATransformerConfig's sizes, which it builds only under
        # --multi-latent-attention (megatron/training/arguments.py core_transformer_config_from_args); here a pattern
        # names its MLA layers itself, so the flag without a `+` would name nothing
        raise ConfigError(f"{FLAG} {pattern.text}: " + (
            "its `+` (MLA) layers need --multi-latent-attention, whose flags (--kv-lora-rank, --q-lora-rank, "
            "--qk-head-dim, ...) give their sizes (as in Megatron-LM)" if mla else
            "--multi-latent-attention beside a pattern without `+`: its `*` layers are plain attention; write `+` "
            "for the MLA layers, or drop --multi-latent-attention"), flags=(FLAG, "--multi-latent-attention"))
    if any(pattern.moe_layers()) and model.moe is None:
        raise ConfigError(f"{FLAG} {pattern.text}: its `E` (MoE) layers need --num-experts",
                          flags=(FLAG, "--num-experts"))
    if model.moe is not None and model.moe_layers() != pattern.moe_layers():
        raise ConfigError(f"{FLAG} {pattern.text} places the MoE layers ({pattern.moe_layer_freq()}, one per block), "
                          f"not --moe-layer-freq {model.experts.layer_freq}: drop --moe-layer-freq",
                          flags=(FLAG, "--moe-layer-freq"))
