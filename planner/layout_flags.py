"""A searched layout as the pretrain_gpt.py flags that run it, and the launch command around them. Only the dimensions
left to the search get a flag (a pinned one keeps the user's), and the precision is always on it; flags this trainer
accepts with no effect are left out with a note."""

from __future__ import annotations

import shlex
from typing import Iterable, Optional, Sequence

from arguments.config_sources import DEFAULT
from arguments.training_config import TrainingConfig
from gpt.hybrid_pattern import FLAG as PATTERN_FLAG
from gpt.hybrid_pattern import MTP_SEPARATOR, parse_hybrid_pattern
from planner.layout_perf import Layout
from planner.layout_pins import Pins
from planner.pipeline_split import StageCounts, layout_string

RECOMPUTE_WORDS = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
ZERO_WORDS = {0: [], 1: ["--use-distributed-optimizer"], 2: ["--zero-stage", "2"], 3: ["--zero-stage", "3"]}


def gathers_behind_forward(stage: int) -> bool:
    """Whether the search runs `stage` with --overlap-param-gather: only stages 1 and 2 publish parameters after the
    step."""
    return stage in (1, 2)


def staged_pattern(text: str, counts: StageCounts) -> str:
    """--hybrid-layer-pattern `text` with `|` where each virtual stage of `counts` ends (the k-th segment is chunk
    k // PP of rank k % PP, as the trainer reads them), its MTP part kept."""
    blocks = iter(parse_hybrid_pattern(text).blocks)
    pp, vp = len(counts), len(counts[0])
    segments = ["".join(next(blocks) for _ in range(counts[k % pp][k // pp])) for k in range(pp * vp)]
    main = text.split(MTP_SEPARATOR)[0]
    return "|".join(segments) + text[len(main):]


def layout_flag_words(layout: Layout, pins: Pins, moe: bool, fp32_runs: bool = False,
                      pattern: Optional[str] = None, mtp_depth: int = 0) -> list[str]:
    """The flags for what the search chose of `layout`. `moe`: the model has experts; `fp32_runs`: the profile runs
    fp32; `pattern`: the model's --hybrid-layer-pattern, whose `|` carry its pipeline split (Megatron-LM refuses a
    --pipeline-model-parallel-layout beside it); `mtp_depth`: the MTP layers the last stage holds."""
    words = []
    if pins.tp is None:
        words += ["--tensor-model-parallel-size", str(layout.tp)]
    if pins.pp is None:
        words += ["--pipeline-model-parallel-size", str(layout.pp)]
    if layout.pp > 1 and pins.stage_counts is None:
        words += [PATTERN_FLAG, staged_pattern(pattern, layout.stage_counts)] if pattern else \
            ["--pipeline-model-parallel-layout", layout_string(layout.stage_counts, mtp_depth)]
    if layout.cp > 1 and pins.cp is None:
        words += ["--context-parallel-size", str(layout.cp)]
    if layout.ep > 1 and pins.ep is None:
        words += ["--expert-model-parallel-size", str(layout.ep)]
    if moe and layout.tp > 1 and not pins.expert_tp:
        words += ["--expert-tensor-parallel-size", "1"]  # Bridge's MoE recipes' expert TP: the one priced
    if moe and layout.ep > 1 and pins.dispatcher is None:
        words += ["--moe-token-dispatcher-type", layout.moe_dispatcher]
    if layout.tp > 1 and not pins.sequence_parallel:
        words += ["--sequence-parallel"]
    if pins.micro_batch_size is None:
        words += ["--micro-batch-size", str(layout.micro_batch_size)]
    if pins.zero_stage is None:
        words += ZERO_WORDS[layout.stage]
    if pins.overlap_param_gather is None and layout.overlap_param_gather:
        words += ["--overlap-param-gather"]
    if pins.recompute is None and layout.recompute_fraction >= 1.0:
        words += RECOMPUTE_WORDS
    if not pins.sixteen_bit and not fp32_runs:
        words += ["--bf16"]
    return words


def global_batch_given(sources: dict) -> bool:
    """Whether the launch names its global batch (a flag, the DeepSpeed JSON or a preset)."""
    source = sources.get("global_batch_size")
    return source is not None and source.kind != DEFAULT


def planned_batch_flags(training: TrainingConfig, sources: dict) -> list[str]:
    """The planned global batch as a flag where the launch names none: otherwise pretrain_gpt.py runs micro batch x DP,
    a different batch for each printed layout."""
    return [] if global_batch_given(sources) else ["--global-batch-size", str(training.global_batch_size)]


def drop_no_effect_flags(argv: Sequence[str], no_effect: Iterable[str]) -> tuple[list[str], list[str]]:
    """`argv` without the flags in `no_effect` (each with the values that follow it), and those dropped."""
    no_effect = set(no_effect)
    kept, dropped, dropping = [], [], False
    for word in argv:
        name = word.split("=", 1)[0]
        if name.startswith("--"):
            dropping = name in no_effect
            if dropping:
                dropped.append(name)
                continue
        if not dropping:
            kept.append(word)
    return kept, dropped


def without_flags_set_again(model_flags: Sequence[str], words: Sequence[str]) -> list[str]:
    """`model_flags` without the flags `words` set again (a staged --hybrid-layer-pattern replaces the user's, under
    either spelling)."""
    again = {word for word in words if word.startswith("--")}
    if PATTERN_FLAG in again:
        again.add("--hybrid-override-pattern")
    return drop_no_effect_flags(model_flags, again)[0]


def launch_command(gpus: int, gpus_per_node: int, flags: Sequence[str]) -> str:
    """The command that trains with `flags` on `gpus` GPUs: torchrun on one node; on several,
    scripts/launch_multi_node.sh run on every node with its NODE_RANK and MASTER_ADDR."""
    if gpus <= gpus_per_node:
        return f"torchrun --nproc-per-node {gpus} {shlex.join(['pretrain_gpt.py', *flags])}"
    nodes = -(-gpus // gpus_per_node)
    return f"NNODES={nodes} GPUS_PER_NODE={gpus_per_node} {shlex.join(['scripts/launch_multi_node.sh', *flags])}"
