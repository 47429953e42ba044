"""Megatron-LM's --hybrid-layer-pattern read as GPT blocks: `*` attention, `+` MLA, `M` Mamba-2, `G` Gated DeltaNet, `-`
MLP, `E` MoE; `|` separates pipeline segments and `/` starts the MTP patterns. A mixer followed by an MLP symbol is one
pre-norm block; others stand alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError

FLAG = "--hybrid-layer-pattern"
ATTENTION, MLA, MAMBA, GDN, MLP, MOE, PIPE, MTP_SEPARATOR = "*", "+", "M", "G", "-", "E", "|", "/"
MIXERS = (ATTENTION, MLA, MAMBA, GDN)
MLPS = (MLP, MOE)
# the blocks an MTP layer may be: attention or Gated DeltaNet, then its MLP
BLOCKS = tuple(mixer + mlp for mixer in (ATTENTION, MLA, GDN) for mlp in MLPS)
# Megatron-Core's other layer symbols, not built here
NOT_BUILT = {"D": "DeepSeek sparse attention (DSA)"}


@dataclass(frozen=True)
class HybridPattern:
    text: str
    segments: tuple[tuple[str, ...], ...]  # the main pattern's `|` segments, each its blocks
    mtp_block: Optional[str]               # the block of each MTP depth, None without MTP
    mtp_depth: int

    @property
    def blocks(self) -> tuple[str, ...]:
        return tuple(block for segment in self.segments for block in segment)

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def megatron_layers(self) -> int:
        """Megatron's num_layers for the pattern: one per symbol of the main pattern."""
        return sum(len(block) for block in self.blocks)

    def layer_offsets(self) -> tuple[int, ...]:
        """Each block's first Megatron layer (0-based)."""
        offsets = [0]
        for block in self.blocks[:-1]:
            offsets.append(offsets[-1] + len(block))
        return tuple(offsets)

    def moe_layers(self) -> tuple[bool, ...]:
        return tuple(block[-1] == MOE for block in self.blocks)

    def mixers(self) -> tuple[Optional[str], ...]:
        return tuple(block[0] if block[0] in MIXERS else None for block in self.blocks)

    def mlps(self) -> tuple[Optional[str], ...]:
        return tuple(block[-1] if block[-1] in MLPS else None for block in self.blocks)

    def moe_layer_freq(self) -> str:
        """--moe-layer-freq as a list expression, one 0/1 per block."""
        return "[" + ",".join(str(int(moe)) for moe in self.moe_layers()) + "]"

    def pipeline_layout(self) -> str:
        """The segments as --pipeline-model-parallel-layout: the k-th is chunk k // PP of rank k % PP."""
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
    """The blocks of one segment: a mixer with the MLP symbol after it, else each symbol alone."""
    blocks, at = [], 0
    while at < len(part):
        take = 2 if part[at] in MIXERS and part[at + 1:at + 2] in MLPS else 1
        blocks.append(part[at:at + take])
        at += take
    return tuple(blocks)


def parse_hybrid_pattern(text: str) -> HybridPattern:
    """The pattern's blocks, stages and MTP depth; ConfigError in one line for what is not built."""
    _check_symbols(text)
    main, *mtp_parts = text.split(MTP_SEPARATOR)
    if any(part != mtp_parts[0] for part in mtp_parts):  # Megatron: "All MTP patterns must be identical"
        raise _refuse(text, f"the MTP patterns after `/` differ ({', '.join(repr(part) for part in mtp_parts)}): "
                            f"each `/` gives one MTP depth, all identical (as Megatron-Core requires)")
    mtp_block = None
    if mtp_parts and mtp_parts[0]:  # "<main>/" alone is no MTP, as Megatron reads it
        if PIPE in mtp_parts[0]:
            raise _refuse(text, "`|` in an MTP pattern: pipeline segments are the main pattern's (before the `/`)")
        mtp = pattern_blocks(mtp_parts[0])
        if len(mtp) != 1 or mtp[0] not in BLOCKS:
            raise _refuse(text, f"the MTP pattern {mtp_parts[0]!r} is not one attention or GDN block: an MTP layer "
                                f"here is one block (Megatron-Core's GPT MTP layer), `*-`, `*E`, `+-`, `+E`, `G-` "
                                f"or `GE`")
        mtp_block = mtp[0]
    segments = main.split(PIPE)
    pattern = HybridPattern(text, tuple(pattern_blocks(segment) for segment in segments), mtp_block,
                            len(mtp_parts) if mtp_block else 0)
    if pattern.num_layers == 0:
        raise _refuse(text, "no decoder layers before the MTP patterns: give at least one layer symbol")
    if mtp_block is not None and mtp_block != pattern.blocks[-1]:
        # each MTP layer's block is of the last decoder layer's kind, as Megatron-Core's GPT MTP
        raise _refuse(text, f"the MTP block {mtp_block!r} differs from the last decoder block "
                            f"{pattern.blocks[-1]!r}: an MTP layer here is a block of the last decoder layer's kind "
                            f"(Megatron-Core's GPT MTP), its mixer and its MLP (dense or MoE) as they are")
    return pattern


def residual_branches(text: Optional[str], num_layers: int) -> int:
    """What the output projections' init std divides over (sqrt): 2 per GPT layer, or 1 per symbol of a hybrid pattern,
    as Megatron."""
    return 2 * num_layers if text is None else parse_hybrid_pattern(text).megatron_layers


def check_model_follows_pattern(model) -> None:
    """A ModelConfig with a pattern holds the depth, MoE layers and MTP depth it gives."""
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
        # Megatron-LM builds MLA sizes only under --multi-latent-attention; here the pattern names its MLA layers, so
        # the flag without a `+` names nothing
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
