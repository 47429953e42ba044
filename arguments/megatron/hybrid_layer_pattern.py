"""`--hybrid-layer-pattern` (and `--hybrid-override-pattern`) as the GPT settings it gives: --num-layers,
--moe-layer-freq, --pipeline-model-parallel-layout and --mtp-num-layers, so both build one model through one path. Where
Megatron-LM warns and takes the pattern's count over a differing --num-layers, this refuses it."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from arguments.config_sources import DEFAULT, FLAG, PRESET, Source
from base.errors import ConfigError
from gpt.hybrid_pattern import ATTENTION, MLA, HybridPattern, parse_hybrid_pattern
from gpt.hybrid_pattern import FLAG as PATTERN_FLAG
from gpt.moe.settings import largest_expert_count, moe_layer_pattern
from gpt.pipeline_layout import LAYOUT_FLAG, layout_chunks

OLD_FLAG = "--hybrid-override-pattern"
# Megatron-LM asserts each is absent beside a pattern: "Pipeline stage layout is defined by | separators"
PLACEMENT_FLAGS = {"pipeline_model_parallel_layout": LAYOUT_FLAG,
                   "num_layers_per_virtual_pipeline_stage": "--num-layers-per-virtual-pipeline-stage",
                   "num_virtual_stages_per_pipeline_rank": "--num-virtual-stages-per-pipeline-rank",
                   "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
                   "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split"}
UNEVEN_FLAGS = {"decoder_first_pipeline_num_layers": "--decoder-first-pipeline-num-layers",
                "decoder_last_pipeline_num_layers": "--decoder-last-pipeline-num-layers"}


def apply_hybrid_pattern(settings: dict[str, Any], sources: dict[str, Source], typed: Sequence[str]
                         ) -> tuple[list[str], list[str]]:
    """(problems, notes): the pattern's depth, MoE layers, stages and MTP depth written into `settings`. `typed`: the
    pattern options given (both spellings together are refused, as in Megatron-LM)."""
    text = settings.get("hybrid_layer_pattern")
    if text is None:
        return [], []
    if len(set(typed)) > 1:
        settings["hybrid_layer_pattern"] = None
        return [f"{OLD_FLAG} with {PATTERN_FLAG}: give one ({OLD_FLAG} is its deprecated name; Megatron-LM asserts "
                f"they are not both given)"], []
    given = Source(FLAG, typed[-1] if typed else PATTERN_FLAG, note="the pattern's blocks")
    before = dict(settings)
    try:
        pattern = parse_hybrid_pattern(text)
        changes = _depths(pattern, settings, sources)
        settings.update(changes)  # the depths hold even where the rest is refused
        changes.update(_moe_layers(pattern, settings, sources))
        changes.update(_stages(pattern, settings))
    except ConfigError as error:
        settings["hybrid_layer_pattern"] = None
        return [str(error)], []
    changes = {name: value for name, value in changes.items()
               if name == "num_layers" or value != before.get(name)}
    for name, value in changes.items():
        settings[name], sources[name] = value, given
    notes = [f"> {PATTERN_FLAG} {text}: {pattern.num_layers} blocks, a mixer and the MLP after it or either alone "
             f"(Megatron's {pattern.megatron_layers} layers), " + ", ".join(f"{_flag(name)} {value}"
                                                                           for name, value in changes.items())]
    if {ATTENTION, MLA} <= set(pattern.mixers()):
        # Megatron-Core refuses attention beside MLA in one model; each block here builds its own mixer
        notes.append(f"> {PATTERN_FLAG} {text}: `*` attention and `+` MLA layers in one model, which Megatron-LM "
                     f"refuses (\"Not supported to have both Attention and MLA/DSA in one model\"); built here")
    variant = settings.get("experimental_attention_variant")
    if variant is not None:
        # only GPTModel's experimental specs read the variant and --linear-attention-freq
        notes.append(f"> --experimental-attention-variant {variant}: not read beside {PATTERN_FLAG}, whose symbols "
                     f"place the layers (as Megatron-Core's HybridModel): write `G` for a Gated DeltaNet layer")
    return [], notes


def _flag(name: str) -> str:
    return {**PLACEMENT_FLAGS, **UNEVEN_FLAGS}.get(name, "--" + name.replace("_", "-"))


def _refuse(pattern: HybridPattern, why: str, *flags: str) -> ConfigError:
    return ConfigError(f"{PATTERN_FLAG} {pattern.text}: {why}", flags=(PATTERN_FLAG, *flags))


def _explicit(sources: dict[str, Source], name: str) -> bool:
    """Typed by the user (flag, JSON, Hugging Face folder), not a preset's or a default."""
    return name in sources and sources[name].kind not in (DEFAULT, PRESET)


def _depths(pattern: HybridPattern, settings: dict[str, Any], sources: dict[str, Source]) -> dict[str, Any]:
    """The blocks and the MTP depth; refused where --num-layers or --mtp-num-layers names another model."""
    layers = settings["num_layers"]
    if _explicit(sources, "num_layers") and layers not in (pattern.num_layers, pattern.megatron_layers):
        raise _refuse(pattern, f"{pattern.num_layers} blocks, a mixer and the MLP after it or either alone "
                               f"(Megatron's {pattern.megatron_layers} layers, one per symbol), not --num-layers "
                               f"{layers}: drop "
                               f"--num-layers, the pattern sets the depth (as in Megatron-LM)", "--num-layers")
    mtp = settings.get("mtp_num_layers") or 0
    if _explicit(sources, "mtp_num_layers") and mtp not in (0, pattern.mtp_depth):
        raise _refuse(pattern, f"{pattern.mtp_depth} MTP layers (one block after each `/`), not --mtp-num-layers "
                               f"{mtp}: drop --mtp-num-layers, or write each depth in the pattern ('.../*-/*-')",
                      "--mtp-num-layers")
    return {"num_layers": pattern.num_layers, "mtp_num_layers": pattern.mtp_depth}


def _moe_layers(pattern: HybridPattern, settings: dict[str, Any], sources: dict[str, Source]) -> dict[str, Any]:
    moe = pattern.moe_layers()
    experts = largest_expert_count(settings.get("num_experts"))
    if any(moe) and experts is None:
        raise _refuse(pattern, "its `E` (MoE) layers need --num-experts", "--num-experts")
    if experts is None:
        return {}
    if _explicit(sources, "moe_layer_freq"):
        freq = settings["moe_layer_freq"]
        if moe_layer_pattern(freq, pattern.num_layers) != moe:
            raise _refuse(pattern, f"its MoE blocks are {pattern.moe_layer_freq()}, not --moe-layer-freq {freq}: "
                                   f"drop --moe-layer-freq, the pattern places the MoE layers", "--moe-layer-freq")
    return {"moe_layer_freq": 1 if all(moe) else pattern.moe_layer_freq()}


def _stages(pattern: HybridPattern, settings: dict[str, Any]) -> dict[str, Any]:
    """The segments as --pipeline-model-parallel-layout; without `|`, Megatron's even split of its layers."""
    for name, flag in PLACEMENT_FLAGS.items():
        if settings.get(name):
            raise _refuse(pattern, f"{flag} beside the pattern: the pattern's `|` segments place the layers on the "
                                   f"stages (Megatron-LM asserts it is not given); drop {flag}", flag)
    stages = settings.get("pipeline_model_parallel_size") or 1
    if len(pattern.segments) > 1:
        for name, flag in UNEVEN_FLAGS.items():
            if settings.get(name) is not None:
                raise _refuse(pattern, f"{flag} with `|` in the pattern: the segments are the stages (Megatron-LM "
                                       f"asserts it is not given); drop {flag}", flag)
        if len(pattern.segments) % stages:
            raise _refuse(pattern, f"{len(pattern.segments)} pipeline segments, not a multiple of "
                                   f"--pipeline-model-parallel-size {stages} (as Megatron-LM asserts)",
                          "--pipeline-model-parallel-size")
        layout = pattern.pipeline_layout()
        try:
            layout_chunks(layout, stages, pattern.num_layers, pattern.mtp_depth)
        except ConfigError as error:
            raise _refuse(pattern, f"its segments as {error}", "--pipeline-model-parallel-size") from None
        return {"pipeline_model_parallel_layout": layout}
    return _uneven_split(pattern, settings) or _even_symbol_split(pattern, stages)


def _uneven_split(pattern: HybridPattern, settings: dict[str, Any]) -> dict[str, Any]:
    """--decoder-first/last-pipeline-num-layers beside a pattern without `|` count Megatron's layers (one per symbol):
    here the blocks they end at."""
    changes: dict[str, Optional[int]] = {}
    boundaries = (*pattern.layer_offsets(), pattern.megatron_layers)  # Megatron's layer count before each block
    for name, flag in UNEVEN_FLAGS.items():
        value = settings.get(name)
        if value is not None:
            before = value if name == "decoder_first_pipeline_num_layers" else pattern.megatron_layers - value
            if before not in boundaries:
                raise _refuse(pattern, f"{flag} {value} counts Megatron's layers (one per symbol), so it ends the "
                                       f"stage inside a block (a mixer and the MLP right after it): give a count "
                                       f"that ends between blocks", flag)
            blocks = boundaries.index(before)
            changes[name] = blocks if name == "decoder_first_pipeline_num_layers" else pattern.num_layers - blocks
    return changes


def _even_symbol_split(pattern: HybridPattern, stages: int) -> dict[str, Any]:
    """Megatron's even split of the pattern's layers over `stages`, as a layout where it differs from an even split of
    the blocks; refused where a stage would end inside a block."""
    total = pattern.megatron_layers
    if stages <= 1:
        return {}
    boundaries = (*pattern.layer_offsets(), total)  # Megatron's layer count before each block
    if total % stages or any(total // stages * k not in boundaries for k in range(1, stages)):
        if pattern.num_layers % stages:
            return {}
        raise _refuse(pattern, f"Megatron's even split of its {total} layers (one per symbol) over "
                               f"--pipeline-model-parallel-size {stages} ends a stage inside a block (a mixer and the "
                               f"MLP right after it): add `|` where each stage ends", "--pipeline-model-parallel-size")
    ends = [boundaries.index(total // stages * k) for k in range(1, stages + 1)]
    counts = [end - start for start, end in zip([0, *ends], ends)]
    if len(set(counts)) == 1:
        return {}
    layout = ["t" * count for count in counts]
    layout[0], layout[-1] = "E" + layout[0], layout[-1] + "m" * pattern.mtp_depth + "L"
    return {"pipeline_model_parallel_layout": "|".join(layout)}
