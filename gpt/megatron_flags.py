"""Megatron-LM's and DeepSpeed-Megatron's flags, honoured with their meaning.

Three kinds, each a table:

- `ALIASES`: another name for one of our flags (`--batch-size` is `--micro-batch-size`). `build_parser`
  adds the alias to the flag itself, so the value lands in the same setting.
- `MEANINGS` (flags with a dest of their own, not a setting): a Megatron flag whose meaning becomes
  our settings (`--use-distributed-optimizer` is ZeRO stage 1, `--recompute-granularity full` is
  `--checkpoint-activations`), or that has no effect on the math here (`--deepspeed`,
  `--no-masked-softmax-fusion`), said once at the start, or that would change the math in a way not
  implemented (`--pipeline-model-parallel-size 4`, `--sequence-parallel`), refused in one line naming
  what to use instead.
- `gpt/flag_equivalents.py`: flags not accepted at all, with the equivalent to suggest.

`resolve_meanings` turns the parsed values of `MEANINGS` into setting changes, notes and refusals.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from gpt.config_sources import FLAG, JSON, Source
from gpt.errors import ConfigError

# alias -> (our flag, whose name it is)
ALIASES: dict[str, tuple[str, str]] = {
    "--batch-size": ("--micro-batch-size", "DeepSpeed-Megatron"),
    "--model-parallel-size": ("--tensor-model-parallel-size", "DeepSpeed-Megatron"),
    "--warmup": ("--lr-warmup-fraction", "DeepSpeed-Megatron"),
    "--deepspeed_config": ("--zero-config", "DeepSpeed"),
    "--deepspeed-config": ("--zero-config", "DeepSpeed"),
    "--checkpoint-in-cpu": ("--cpu-checkpointing", "DeepSpeed-Megatron"),
    "--contigious-checkpointing": ("--contiguous-checkpointing", "DeepSpeed-Megatron (their spelling)"),
    "--synchronize-each-layer": ("--synchronize-checkpoint-boundary", "DeepSpeed-Megatron"),
    "--train-data": ("--data-path", "DeepSpeed-Megatron"),
    "--tokenizer-model": ("--tokenizer-file", "Megatron-LM"),
    "--recompute-num-layers": ("--checkpoint-num-layers", "Megatron-LM (with --recompute-method uniform)"),
    "--wandb-exp-name": ("--wandb-run-name", "Megatron-LM"),
    "--overlap-grad-reduce": ("--overlap-comm", "Megatron-LM"),
}


def aliases_of(flag: str) -> list[str]:
    return [alias for alias, (target, _) in ALIASES.items() if target == flag]


def describe_alias(option: str) -> str:
    """'--batch-size (DeepSpeed-Megatron's name for --micro-batch-size)', or the option itself."""
    if option in ALIASES:
        target, whose = ALIASES[option]
        return f"{option} ({whose}'s name for {target})"
    return option


@dataclass(frozen=True)
class Meaning:
    options: tuple[str, ...]
    dest: str
    whose: str
    add: dict                       # argparse keyword arguments
    help: str


NO_EFFECT_FLAGS: dict[str, str] = {
    # dest -> why the math is the same
    "deepspeed": "DeepSpeed's engine switch: ZeRO is always on here (--zero-stage, --zero-config)",
    "local_rank": "set by DeepSpeed's launcher: each process reads its rank from LOCAL_RANK (torchrun, SLURM)",
    "resume_dataloader": "a resumed run always continues the data where its checkpoint stopped (consumed samples)",
    "lazy_loader": "the .bin/.idx data is always memory-mapped and read lazily",
    "cache_dir": "where DeepSpeed-Megatron cached downloaded tokenizer files; nothing is ever downloaded here",
    "deepspeed_activation_checkpointing": "--checkpoint-activations already uses ZeRO-R's checkpointing "
                                          "(partitioned with --partition-activations)",
    "no_masked_softmax_fusion": "SDPA computes the causal softmax; there is no separate masked-softmax kernel",
    "no_bias_gelu_fusion": "a kernel fusion switch: the bias and GeLU compute the same values either way",
    "no_bias_dropout_fusion": "a kernel fusion switch: the bias, dropout and residual add compute the same values",
    "no_gradient_accumulation_fusion": "a kernel fusion switch: gradients accumulate to the same values",
}

SELECTIVE_RECOMPUTE = ("Megatron's selective recompute keeps the s x s attention scores out of memory by "
                       "recomputing the core attention; here SDPA's fused kernels never store them (flash and "
                       "memory-efficient on CUDA, flash on a CPU without attention dropout), so nothing is "
                       "checkpointed (--recompute-granularity full checkpoints whole blocks for more memory savings)")
NO_PIPELINE = ("pipeline parallelism is not implemented; ZeRO replaces it: --zero-stage 3 partitions the parameters, "
               "gradients and optimizer states over data parallelism, with --tensor-model-parallel-size inside a node "
               "and --checkpoint-activations --partition-activations for activation memory")
NO_SEQUENCE_PARALLEL = ("sequence parallelism is not implemented yet; --checkpoint-activations "
                        "--partition-activations (ZeRO-R's P_a) splits the checkpointed activations over the "
                        "tensor-parallel ranks instead")
NO_BLOCK_RECOMPUTE = ("--recompute-method block (checkpoint only the first --recompute-num-layers blocks) is not "
                      "implemented; use --recompute-method uniform (every block, in groups of "
                      "--recompute-num-layers)")


MEANINGS: list[Meaning] = [
    Meaning(("--deepspeed",), "deepspeed", "DeepSpeed-Megatron", {"action": "store_true"},
            NO_EFFECT_FLAGS["deepspeed"]),
    Meaning(("--local_rank", "--local-rank"), "local_rank", "DeepSpeed's launcher", {"type": int},
            NO_EFFECT_FLAGS["local_rank"]),
    Meaning(("--resume-dataloader",), "resume_dataloader", "DeepSpeed-Megatron", {"action": "store_true"},
            NO_EFFECT_FLAGS["resume_dataloader"]),
    Meaning(("--lazy-loader",), "lazy_loader", "DeepSpeed-Megatron", {"action": "store_true"},
            NO_EFFECT_FLAGS["lazy_loader"]),
    Meaning(("--cache-dir",), "cache_dir", "DeepSpeed-Megatron", {"metavar": "DIR"}, NO_EFFECT_FLAGS["cache_dir"]),
    Meaning(("--deepspeed-activation-checkpointing",), "deepspeed_activation_checkpointing", "DeepSpeed-Megatron",
            {"action": "store_true"}, NO_EFFECT_FLAGS["deepspeed_activation_checkpointing"]),
    Meaning(("--no-masked-softmax-fusion",), "no_masked_softmax_fusion", "Megatron-LM", {"action": "store_true"},
            NO_EFFECT_FLAGS["no_masked_softmax_fusion"]),
    Meaning(("--no-bias-gelu-fusion",), "no_bias_gelu_fusion", "Megatron-LM", {"action": "store_true"},
            NO_EFFECT_FLAGS["no_bias_gelu_fusion"]),
    Meaning(("--no-bias-dropout-fusion",), "no_bias_dropout_fusion", "Megatron-LM", {"action": "store_true"},
            NO_EFFECT_FLAGS["no_bias_dropout_fusion"]),
    Meaning(("--no-gradient-accumulation-fusion",), "no_gradient_accumulation_fusion", "Megatron-LM",
            {"action": "store_true"}, NO_EFFECT_FLAGS["no_gradient_accumulation_fusion"]),
    Meaning(("--distributed-backend",), "distributed_backend", "Megatron-LM", {"choices": ("nccl", "gloo", "ccl")},
            "torch.distributed's backend; here it follows the device: NCCL for CUDA processes, gloo for CPU ones"),
    Meaning(("--use-distributed-optimizer",), "use_distributed_optimizer", "Megatron-LM", {"action": "store_true"},
            "Megatron's distributed optimizer shards the optimizer state over data parallelism: ZeRO stage 1 "
            "(stages 2 and 3 shard it too)"),
    Meaning(("--recompute-activations",), "recompute_activations", "Megatron-LM", {"action": "store_true"},
            f"selective recompute: {SELECTIVE_RECOMPUTE}"),
    Meaning(("--recompute-granularity",), "recompute_granularity", "Megatron-LM",
            {"choices": ("full", "selective")},
            f"full: --checkpoint-activations, in groups of --recompute-num-layers blocks; selective: "
            f"{SELECTIVE_RECOMPUTE}"),
    Meaning(("--recompute-method",), "recompute_method", "Megatron-LM", {"choices": ("uniform", "block")},
            "uniform: groups of --recompute-num-layers blocks (--checkpoint-num-layers); block is not implemented"),
    Meaning(("--pipeline-model-parallel-size",), "pipeline_model_parallel_size", "Megatron-LM", {"type": int},
            "1 only: pipeline parallelism is not implemented; ZeRO replaces it"),
    Meaning(("--sequence-parallel",), "sequence_parallel", "Megatron-LM", {"action": "store_true"},
            "not implemented yet"),
]
MEANING_DESTS = tuple(meaning.dest for meaning in MEANINGS)

def add_meanings(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Megatron-LM and DeepSpeed flags with their meaning here (see --print-config)")
    for meaning in MEANINGS:
        group.add_argument(*meaning.options, dest=meaning.dest, default=None,
                           help=f"{meaning.whose}: {meaning.help}", **meaning.add)


@dataclass
class Resolved:
    """What the Megatron-meaning flags do: setting changes (with their source) and lines to say once."""
    changes: dict[str, tuple[Any, Source]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def resolve_meanings(values: dict[str, Any], settings: dict[str, Any], sources: dict[str, Source],
                     option_used: Callable[[str], Optional[str]]) -> Resolved:
    """`values`: the parsed MEANINGS dests; `settings`: the parsed settings (read, never written);
    `option_used(dest)`: the option the user wrote for a dest. Raises one ConfigError for every
    refused flag at once."""
    resolved = Resolved()
    given = {dest: value for dest, value in values.items() if value is not None and value is not False}

    def change(setting: str, value: Any, dest: str, why: str) -> None:
        resolved.changes[setting] = (value, Source(FLAG, option_used(dest) or dest, note=why))

    for dest in NO_EFFECT_FLAGS:
        if dest in given:
            resolved.notes.append(f"{option_used(dest)}: accepted, no effect on the math ({NO_EFFECT_FLAGS[dest]})")
    if "distributed_backend" in given:
        resolved.notes.append(f"--distributed-backend {given['distributed_backend']}: accepted; the backend follows "
                              f"the device here (NCCL for CUDA processes, gloo for CPU ones)")
    if given.get("use_distributed_optimizer"):
        stage = settings["stage"]
        if stage == 0 and sources["stage"].kind in (FLAG, JSON):
            resolved.refused.append(f"--use-distributed-optimizer (ZeRO stage 1) contradicts ZeRO stage 0 from "
                                    f"{sources['stage'].describe()}: drop one of them")
        elif stage == 0:
            change("stage", 1, "use_distributed_optimizer", "Megatron's distributed optimizer is ZeRO stage 1")
    granularity = given.get("recompute_granularity")
    if given.get("recompute_activations") and granularity is None:
        granularity = "selective"  # Megatron: --recompute-activations means selective recompute
    if granularity == "full":
        change("checkpoint_activations", True, "recompute_granularity",
               "full recompute is activation checkpointing of every block, in groups of --recompute-num-layers")
    elif granularity == "selective":
        resolved.notes.append(f"{option_used('recompute_granularity') or '--recompute-activations'} selective: "
                              f"{SELECTIVE_RECOMPUTE}")
    if given.get("recompute_method") == "block":
        resolved.refused.append(NO_BLOCK_RECOMPUTE)
    pipeline = given.get("pipeline_model_parallel_size")
    if pipeline is not None and pipeline != 1:
        resolved.refused.append(f"--pipeline-model-parallel-size {pipeline}: {NO_PIPELINE}")
    elif pipeline == 1:
        resolved.notes.append("--pipeline-model-parallel-size 1: accepted (no pipeline parallelism, as here)")
    if given.get("sequence_parallel"):
        resolved.refused.append(f"--sequence-parallel: {NO_SEQUENCE_PARALLEL}")
    if resolved.refused:
        raise ConfigError("; ".join(resolved.refused))
    return resolved
