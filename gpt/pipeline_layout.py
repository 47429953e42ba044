"""Megatron-Core's --pipeline-model-parallel-layout: virtual stages separated by `|`, each a run of E (embedding), t
(layer), m (MTP layer) and L (loss), with `(...)*n` and `x*n` repeats; the k-th stage is chunk k // PP of rank k % PP.
Checked as validate_layer_layout checks it."""

from __future__ import annotations

import re

from base.errors import ConfigError

LAYOUT_FLAG = "--pipeline-model-parallel-layout"
LAYER_CHARS = "ELtm"


# parse_str_to_list's two unrollings, in order
REPEATS = (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)")
# a layout no launch could use, refused before it is unrolled in memory
MAX_UNROLLED = 10**6


def parse_layout(text: str, max_length: int = MAX_UNROLLED) -> list[str]:
    """The virtual stages' strings, repeats unrolled; lengths are counted first, so `t*1000000000000` is one line, not a
    huge string."""
    unrolled = text.replace(",", "")
    for pattern in REPEATS:
        matches = list(re.finditer(pattern, unrolled))
        length = len(unrolled) + sum(len(match.group(1)) * _repeat(match.group(2)) - len(match.group(0))
                                     for match in matches)
        if length > max(max_length, len(unrolled)):
            raise ConfigError(f"{LAYOUT_FLAG} {text} unrolls to {length:.3g} characters, more than the layers, E, L "
                              f"and stage separators a layout of this model can hold ({max_length}): give each "
                              f"repetition the count of layers it places", flags=(LAYOUT_FLAG,))
        unrolled = re.sub(pattern, lambda match: match.group(1) * int(match.group(2)), unrolled)
    stages = unrolled.split("|")
    for stage in stages:
        for char in stage:
            if char not in LAYER_CHARS:
                raise ConfigError(f"{LAYOUT_FLAG} {text}: invalid layer character {char!r}; known: E (embedding), "
                                  f"t (transformer layer), m (MTP layer), L (loss)", flags=(LAYOUT_FLAG,))
    return stages


def _repeat(digits: str) -> int:
    return int(digits) if len(digits) <= 18 else 10**18


def layout_chunks(text: str, pipeline_size: int, num_layers: int, mtp_num_layers: int) -> list[list[str]]:
    """[pipeline rank][model chunk] -> that stage's string, validated."""
    # a valid layout is at most (PP + 1) x (layers + 2) characters
    stages = parse_layout(text, max_length=(pipeline_size + 1) * (num_layers + mtp_num_layers + 2))
    if len(stages) % pipeline_size:
        raise ConfigError(f"{LAYOUT_FLAG} {text} has {len(stages)} stages, not a multiple of "
                          f"--pipeline-model-parallel-size {pipeline_size}",
                          flags=(LAYOUT_FLAG, "--pipeline-model-parallel-size"))
    virtual = len(stages) // pipeline_size
    chunks = [[stages[chunk * pipeline_size + rank] for chunk in range(virtual)] for rank in range(pipeline_size)]
    flat = "".join(stages)

    def refuse(why: str, *flags: str) -> None:
        raise ConfigError(f"{LAYOUT_FLAG} {text}: {why}", flags=(LAYOUT_FLAG, *flags))

    if not flat.startswith("E") or flat.count("E") != 1:
        refuse("the embedding E must come first, once")
    if not flat.endswith("L") or flat.count("L") != 1:
        refuse("the loss L must come last, once")
    if flat.count("t") != num_layers:
        refuse(f"{flat.count('t')} transformer layers (t), not --num-layers {num_layers}", "--num-layers")
    if flat.count("m") != mtp_num_layers:
        refuse(f"{flat.count('m')} MTP layers (m), not --mtp-num-layers {mtp_num_layers}", "--mtp-num-layers")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        refuse("decoder layers (t) must be placed before MTP layers (m)")
    if "m" in flat and "m" not in chunks[-1][-1]:
        # Megatron's mtp_standalone: MTP on its own rank before the last
        refuse("MTP layers (m) on a stage other than the last (Megatron's standalone MTP stage) are not "
               "implemented here: the MTP layers run on the last stage's last chunk", "--mtp-num-layers")
    for rank, rank_chunks in enumerate(chunks):
        # an empty virtual stage passes its input on; a rank with no layer at all is refused
        if not any("t" in stage for stage in rank_chunks):
            refuse(f"pipeline rank {rank} ({', '.join(repr(stage) for stage in rank_chunks)}) holds no transformer "
                   f"layer: not implemented here; give every rank at least one t")
    return chunks


def layout_layer_counts(text: str, pipeline_size: int, num_layers: int, mtp_num_layers: int
                        ) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(stage.count("t") for stage in rank_chunks)
                 for rank_chunks in layout_chunks(text, pipeline_size, num_layers, mtp_num_layers))


def pipeline_layout_counts(model, parallel) -> tuple[tuple[int, ...], ...] | None:
    """The run's layout as layers per stage and chunk, or None."""
    if parallel.pipeline_model_parallel_layout is None:
        return None
    return layout_layer_counts(parallel.pipeline_model_parallel_layout, parallel.pipeline_model_parallel_size,
                               model.num_layers, model.mtp.num_layers)
