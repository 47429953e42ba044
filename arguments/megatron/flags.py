"""Megatron-LM's and Megatron-DeepSpeed's flags, with their meaning here: ALIASES (another name for our flag), MEANINGS
(a flag of its own that sets our settings, has no effect on the math, or is refused with the alternative) and SPELLINGS
(a name for one value of a setting). They stay tables here, as the other programs' vocabulary read as a whole."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from arguments.config import PretrainConfig
from arguments.config_sources import FLAG, JSON, Source
from arguments.logging_config import GENIAC_FORK
from arguments.megatron.ckpt_step import resolve_ckpt_step
from arguments.megatron.cpu_offload_flags import ignored_state_dtypes, resolve_cpu_offload_flags
from arguments.megatron.cuda_graph_flags import SCOPE_ADD, resolve_cuda_graph_flags
from arguments.megatron.harvested_flags import resolve_harvested
from arguments.option_table import OptionTable, option_table
from base.errors import ConfigError
from base.options import aliases as declared_aliases
from base.options import flag_of, option_fields

# alias -> (our flag, whose name it is); the settings' aliases are declared on their fields
NOT_SETTING_ALIASES: dict[str, tuple[str, str]] = {
    "--deepspeed_config": ("--zero-config", "DeepSpeed"),
    "--deepspeed-config": ("--zero-config", "DeepSpeed"),
    "--deepscale_config": ("--zero-config", "DeepSpeed (deprecated)"),
}


def _declared_aliases() -> dict[str, tuple[str, str]]:
    config = PretrainConfig()
    return {alias: (flag_of(setting), whose) for section in config.SECTIONS
            for setting, _ in option_fields(type(getattr(config, section))) for alias, whose in declared_aliases(setting).items()}


ALIASES: dict[str, tuple[str, str]] = {**_declared_aliases(), **NOT_SETTING_ALIASES}

# option -> (dest, value, what it means, whose): a name for one value of one of our settings
SPELLINGS: dict[str, tuple[str, Any, str, str]] = {
    "--use-flash-attn": ("attention_backend", "flash", "--attention-backend flash", "Megatron-LM"),
    "--use-flash-attn-v1": ("attention_backend", "flash", "--attention-backend flash", "DeepSpeed-Megatron"),
    "--use-flash-attn-v2": ("attention_backend", "flash", "--attention-backend flash", "DeepSpeed-Megatron"),
    "--use-flash-attn-triton": ("attention_backend", "flash", "--attention-backend flash", "DeepSpeed-Megatron"),
    "--use-flash-attn-builder": ("attention_backend", "flash", "--attention-backend flash", "DeepSpeed-Megatron"),
    "--openai-gelu": ("activation", "gelu_tanh", "--activation gelu_tanh (OpenAI's tanh approximation)",
                      "Megatron-LM"),
    "--squared-relu": ("activation", "squared_relu", "--activation squared_relu (relu(x)^2)", "Megatron-LM"),
    "--xielu": ("activation", "xielu", "--activation xielu (xIELU, two learned scalars per MLP)",
                "swiss-ai's Megatron-LM fork"),
    "--grad-reduce-in-bf16": ("accumulate_allreduce_grads_in_fp32", False,
                              "--no-accumulate-allreduce-grads-in-fp32 (reduce gradients in bf16)", "Megatron-LM"),
}


def aliases_of(flag: str) -> list[str]:
    return [alias for alias, (target, _) in ALIASES.items() if target == flag]


def describe_alias(option: str) -> str:
    if option in ALIASES:
        target, whose = ALIASES[option]
        return f"{option} ({whose}'s name for {target})"
    if option in SPELLINGS:
        _, _, means, whose = SPELLINGS[option]
        return f"{option} ({whose}'s name for {means})"
    return option


def add_spellings(group, table: OptionTable, dest: str) -> None:
    for option, (target, value, means, whose) in SPELLINGS.items():
        if target == dest:
            table.add(group, option, dest=dest, action="store_const", const=value, help=f"{whose}'s name for {means}")


@dataclass(frozen=True)
class Meaning:
    options: tuple[str, ...]
    dest: str
    whose: str
    add: dict                       # argparse keyword arguments
    help: str


# Megatron-FSDP's --data-parallel-sharding-strategy -> the ZeRO stage that shards the same states
FSDP_STAGES: dict[str, int] = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
MEGATRON_FSDP_DEFAULT_STRATEGY = "optim_grads_params"  # Megatron-LM's default

# Megatron-LM's precision-aware optimizer dtypes (fp32 by default) -> what they hold; the moments' dtypes are settings,
# the other two meanings.
STORED_MOMENT_DTYPES = ("exp_avg_dtype", "exp_avg_sq_dtype")
PRECISION_AWARE_DTYPES: dict[str, str] = {
    "main_grads_dtype": "main gradients",
    "main_params_dtype": "master weights",
    "exp_avg_dtype": "Adam first moments",
    "exp_avg_sq_dtype": "Adam second moments",
}

NO_EFFECT_FLAGS: dict[str, str] = {
    # dest -> why the math is the same
    "deepspeed": "DeepSpeed's engine switch: ZeRO is always on here (--zero-stage, --zero-config)",
    "local_rank": "set by DeepSpeed's launcher: each process reads its rank from LOCAL_RANK (torchrun, SLURM)",
    "resume_dataloader": "a resumed run always continues the data where its checkpoint stopped (consumed samples)",
    "lazy_loader": "the .bin/.idx data is always memory-mapped and read lazily",
    "cache_dir": "where DeepSpeed-Megatron cached downloaded tokenizer files; nothing is ever downloaded here",
    "deepspeed_activation_checkpointing": "--checkpoint-activations already uses ZeRO-R's checkpointing "
                                          "(partitioned with --partition-activations); beside --deepspeed, "
                                          "Megatron-DeepSpeed's --partition-activations, --checkpoint-in-cpu, "
                                          "--contigious-checkpointing, --synchronize-each-layer count only with it",
    "no_masked_softmax_fusion": "SDPA computes the causal softmax; there is no separate masked-softmax kernel",
    "no_bias_gelu_fusion": "a kernel fusion switch: the bias and GeLU compute the same values either way",
    "no_bias_dropout_fusion": "a kernel fusion switch: the bias, dropout and residual add compute the same values",
    # GENIAC's fork parses --wandb-tag and never reads it
    "use_wandb": "W&B logging is on here whenever --wandb-project names a project",
    "wandb_group": "the W&B run's group, a label: runs here are not grouped",
    "wandb_tag": "GENIAC's fork parses it and never reads it",
}

SELECTIVE_RECOMPUTE = ("Megatron's selective recompute keeps the s x s attention scores out of memory by "
                       "recomputing the core attention (its default --recompute-modules core_attn); here SDPA's fused "
                       "kernels never store them (flash and memory-efficient on CUDA, flash on a CPU without "
                       "attention dropout), so nothing is checkpointed for it; --recompute-modules layernorm makes the "
                       "blocks' RMSNorms keep only their input (the next linear still keeps their output, which "
                       "Megatron recomputes too); its other modules have no effect here (--recompute-granularity full "
                       "checkpoints whole blocks for more memory savings)")
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
    Meaning(("--use-wandb", "--use_wandb"), "use_wandb", GENIAC_FORK, {"action": "store_true"},
            NO_EFFECT_FLAGS["use_wandb"]),
    Meaning(("--wandb-group", "--wandb_group"), "wandb_group", GENIAC_FORK, {}, NO_EFFECT_FLAGS["wandb_group"]),
    Meaning(("--wandb-tag", "--wandb_tag"), "wandb_tag", GENIAC_FORK, {}, NO_EFFECT_FLAGS["wandb_tag"]),
    Meaning(("--distributed-backend",), "distributed_backend", "Megatron-LM",
            {"choices": ("nccl", "gloo", "ccl", "hccl")},
            "torch.distributed's backend; here it follows the device: NCCL for CUDA processes, gloo for CPU ones"),
    Meaning(("--use-distributed-optimizer",), "use_distributed_optimizer", "Megatron-LM", {"action": "store_true"},
            "Megatron's distributed optimizer shards the optimizer state over data parallelism: ZeRO stage 1 "
            "(stages 2 and 3 shard it too)"),
    Meaning(("--use-torch-fsdp2",), "use_torch_fsdp2", "Megatron-LM", {"action": "store_true"},
            "PyTorch FSDP2 shards parameters, gradients and optimizer states over data parallelism: ZeRO stage 3 "
            "(stage 2 with --torch-fsdp2-no-reshard-after-forward)"),
    Meaning(("--torch-fsdp2-no-reshard-after-forward",), "torch_fsdp2_no_reshard_after_forward", "Megatron-LM",
            {"action": "store_true"}, "FSDP2 keeps the gathered parameters from the forward to the backward "
            "(Megatron's help: 'FSDP ZeRO-2'): ZeRO stage 2 under --use-torch-fsdp2; alone, no effect"),
    Meaning(("--use-megatron-fsdp",), "use_megatron_fsdp", "Megatron-LM", {"action": "store_true"},
            "Megatron-FSDP shards what --data-parallel-sharding-strategy names (default optim_grads_params): "
            f"{', '.join(f'{name} is ZeRO stage {stage}' for name, stage in FSDP_STAGES.items())}"),
    Meaning(("--data-parallel-sharding-strategy",), "data_parallel_sharding_strategy", "Megatron-LM",
            {"choices": tuple(FSDP_STAGES)}, "Megatron-FSDP's sharding: the ZeRO stage that shards the same states "
            "under --use-megatron-fsdp; alone, no effect (Megatron reads it only there)"),
    Meaning(("--use-precision-aware-optimizer",), "use_precision_aware_optimizer", "Megatron-LM",
            {"action": "store_true"},
            "TransformerEngine's FusedAdam with main params, moments and main grads in the dtypes given (--exp-avg-dtype, "
            "--exp-avg-sq-dtype, --main-grads-dtype, --main-params-dtype); with fp32 ones (the defaults) it is the fp32 "
            "AdamW here, bf16 moments are stored as bf16 between fp32 updates; as in Megatron-LM, only with the "
            "distributed optimizer (ZeRO stage 1 or above)"),
    Meaning(("--optimizer-cpu-offload",), "optimizer_cpu_offload", "Megatron-LM", {"action": "store_true"},
            "Megatron-LM's hybrid CPU optimizer: --offload-optimizer for --optimizer-offload-fraction (default 1.0) of "
            "each rank's optimizer partition, its fp32 master, Adam moments and step in host memory; as in "
            "Megatron-LM only with --use-precision-aware-optimizer (so the distributed optimizer) and Adam, the "
            "state dtypes then fp32 (arguments/megatron/cpu_offload_flags.py)"),
    Meaning(("--main-grads-dtype",), "main_grads_dtype", "Megatron-LM", {"choices": ("fp32", "bf16")},
            "the precision-aware optimizer's main gradients: bf16 with --bf16 is --no-accumulate-allreduce-grads-in-"
            "fp32 (gradients accumulated and reduced in bf16); fp32 is the default for bf16 here as there"),
    Meaning(("--main-params-dtype",), "main_params_dtype", "Megatron-LM", {"choices": ("fp32", "fp16")},
            "the precision-aware optimizer's master weights: fp32, as here; fp16 is not implemented"),
    Meaning(("--ckpt-step",), "ckpt_step", "Megatron-LM", {"type": int, "metavar": "N"},
            "the iteration --load loads instead of the one its tracker file names: --load DIR/iter_000000N "
            "(arguments/megatron/ckpt_step.py)"),
    Meaning(("--recompute-activations",), "recompute_activations", "Megatron-LM", {"action": "store_true"},
            f"selective recompute: {SELECTIVE_RECOMPUTE}"),
    Meaning(("--recompute-granularity",), "recompute_granularity", "Megatron-LM",
            {"choices": ("full", "selective")},
            f"full: --checkpoint-activations, the blocks --recompute-method picks (uniform: every block, in groups "
            f"of --recompute-num-layers; block: the first --recompute-num-layers of each model chunk); selective: "
            f"{SELECTIVE_RECOMPUTE}"),
    Meaning(("--group-query-attention",), "group_query_attention", "Megatron-LM", {"action": "store_true"},
            "grouped-query attention with --num-query-groups key/value heads (Megatron-LM's default: 1)"),
    Meaning(("--use-rotary-position-embeddings",), "use_rotary_position_embeddings", "Megatron-DeepSpeed",
            {"action": "store_true"}, "--position-embedding-type rope (learned positions off)"),
    Meaning(("--no-position-embedding",), "no_position_embedding", "Megatron-DeepSpeed", {"action": "store_true"},
            "no learned positions: --position-embedding-type none, or rope with --use-rotary-position-embeddings"),
    Meaning(("--no-weight-decay-cond-type",), "no_weight_decay_cond_type", "Megatron-LM (deprecated)",
            {"choices": ("apply_wd_to_qk_layernorm",)},
            "apply_wd_to_qk_layernorm: --apply-wd-to-qk-layernorm (validate_args turns it into that flag)"),
    Meaning(("--ds-sequence-parallel-size",), "ds_sequence_parallel_size", "Megatron-DeepSpeed", {"type": int},
            "DeepSpeed-Ulysses over N ranks: --context-parallel-size N --cp-comm-type a2a (the all-to-all that "
            "turns the sequence split into a head split around attention; gradients average over DP x N)"),
    Meaning(("--enable-cuda-graph",), "enable_cuda_graph", "Megatron-LM (deprecated)", {"action": "store_true"},
            "--cuda-graph-impl local (arguments/megatron/cuda_graph_flags.py)"),
    Meaning(("--external-cuda-graph",), "external_cuda_graph", "Megatron-LM (deprecated)", {"action": "store_true"},
            "--cuda-graph-impl transformer_engine"),
    Meaning(("--cuda-graph-scope",), "cuda_graph_scope", "Megatron-LM (deprecated)", SCOPE_ADD,
            "--cuda-graph-modules (full: the whole layer, as an empty list)"),
    Meaning(("--pipe-parallel-size",), "pipe_parallel_size", "DeepSpeedExamples' Megatron 3D", {"type": int},
            "DeepSpeed's pipeline engine stages: N > 0 is --pipeline-model-parallel-size N (the same even split of "
            "the transformer layers), 0 (no engine) one stage"),
]
MEANING_DESTS = tuple(meaning.dest for meaning in MEANINGS)

def add_meanings(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Megatron-LM and DeepSpeed flags with their meaning here (see --print-config)")
    for meaning in MEANINGS:
        option_table(parser).add(group, *meaning.options, dest=meaning.dest, default=None,
                                 help=f"{meaning.whose}: {meaning.help}", **meaning.add)


@dataclass
class Resolved:
    """What the Megatron-meaning flags do: setting changes (with their source) and lines to say once."""
    changes: dict[str, tuple[Any, Source]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class RefusedFlags(ConfigError):
    """Every refused flag in one message, carrying what the accepted flags change, so the rest of the launch is checked
    as translated."""

    def __init__(self, resolved: Resolved) -> None:
        super().__init__("; ".join(resolved.refused))
        self.resolved = resolved


NO_EFFECT_LINE = "Megatron-LM and DeepSpeed flags accepted with no effect on the math"


def no_effect_line(accepted: list[tuple[str, str]]) -> str:
    """One line for the flags accepted with no effect, those sharing a reason listed together."""
    by_reason: dict[str, list[str]] = {}
    for shown, reason in accepted:
        by_reason.setdefault(reason, []).append(shown)
    return f"{NO_EFFECT_LINE}: " + "; ".join(f"{', '.join(flags)} ({reason})" for reason, flags in by_reason.items())


def resolve_meanings(values: dict[str, Any], settings: dict[str, Any], sources: dict[str, Source],
                     option_used: Callable[[str], Optional[str]],
                     harvested: Optional[dict[str, Any]] = None) -> Resolved:
    """The MEANINGS dests' parsed `values` as setting changes, notes and refusals. `settings` is read, never written;
    `option_used(dest)` is the option typed; `harvested` the other Megatron/DeepSpeed flags given. Raises RefusedFlags
    for every refused flag at once."""
    resolved = Resolved()
    given = {dest: value for dest, value in values.items() if value is not None and value is not False}

    def change(setting: str, value: Any, dest: str, why: str) -> None:
        resolved.changes[setting] = (value, Source(FLAG, option_used(dest) or dest, note=why))

    accepted = [(option_used(dest), NO_EFFECT_FLAGS[dest]) for dest in NO_EFFECT_FLAGS if dest in given]
    if given.get("ds_sequence_parallel_size") == 1:
        accepted.append(("--ds-sequence-parallel-size 1", "sequence parallelism over 1 rank is none"))
    harvested_accepted, resolved.refused = resolve_harvested(harvested or {}, settings)
    accepted += harvested_accepted
    if accepted:
        resolved.notes.append(no_effect_line(accepted))
    if "distributed_backend" in given:
        resolved.notes.append(f"--distributed-backend {given['distributed_backend']}: accepted; the backend follows "
                              f"the device here (NCCL for CUDA processes, gloo for CPU ones)")
    fsdp_stage = _resolve_fsdp(given, settings, sources, option_used, change, resolved)
    if given.get("use_distributed_optimizer") and fsdp_stage is None:
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
               "full recompute is activation checkpointing of the blocks --recompute-method picks")
    elif granularity == "selective":
        resolved.notes.append(f"{option_used('recompute_granularity') or '--recompute-activations'} selective: "
                              f"{SELECTIVE_RECOMPUTE}")
    if settings.get("recompute_modules") and granularity != "selective":
        change("recompute_modules", (), "recompute_granularity",
               "Megatron-Core reads --recompute-modules only under --recompute-granularity selective")
    if settings.get("sequence_parallel") and settings.get("tensor_model_parallel_size") == 1:
        resolved.notes.append("--sequence-parallel with --tensor-model-parallel-size 1: accepted, no effect (one "
                              "tensor-parallel rank holds the whole sequence)")
    if given.get("no_weight_decay_cond_type") == "apply_wd_to_qk_layernorm":
        change("apply_wd_to_qk_layernorm", True, "no_weight_decay_cond_type",
               "Megatron-LM's deprecated spelling of --apply-wd-to-qk-layernorm")
    _resolve_precision_aware_optimizer(given, settings, option_used, resolved)
    resolve_ckpt_step(given, settings, change, resolved)
    resolve_cpu_offload_flags(given, settings, sources, option_used, change, resolved)
    if (harvested or {}).get("--reuse-grad-buf-for-mxfp8-param-ag") and not settings["fp8_param_gather"] \
            and not given.get("use_torch_fsdp2"):
        # Megatron-LM's DistributedDataParallelConfig asserts it, for every run but torch FSDP2's
        resolved.refused.append("--reuse-grad-buf-for-mxfp8-param-ag without --fp8-param-gather: Megatron-LM asserts "
                                "'Reuse grad buffer only when keeping params in MXFP8.' (the gradient buffer holds "
                                "the weights' all-gather only when they are kept in FP8); add --fp8-param-gather or "
                                "drop the flag")
    _resolve_main_grads_dtype(given, settings, sources, change, resolved)
    _resolve_query_groups(given, settings, option_used, change, resolved)
    _resolve_pipe_parallel_size(given, settings, sources, change, resolved)
    _resolve_ulysses(given, settings, sources, change, resolved)
    _resolve_positions(given, settings, change)
    resolve_cuda_graph_flags(given, settings, option_used, change, resolved, harvested or {})
    if resolved.refused:
        raise RefusedFlags(resolved)
    return resolved


def _resolve_fsdp(given: dict[str, Any], settings: dict[str, Any], sources: dict[str, Source],
                  option_used: Callable[[str], Optional[str]], change: Callable, resolved: Resolved) -> Optional[int]:
    """Megatron-LM's fully sharded switches as the ZeRO stage that shards the same states, or None. --use-torch-fsdp2 is
    stage 3 (2 without resharding after the forward, "FSDP ZeRO-2") and keeps Megatron's validate_args refusals;
    --use-megatron-fsdp shards what --data-parallel-sharding-strategy names. An explicit stage that differs is a
    contradiction, never a silent downgrade."""
    strategy = given.get("data_parallel_sharding_strategy")
    if given.get("use_torch_fsdp2"):
        if given.get("use_megatron_fsdp"):
            resolved.refused.append("--use-torch-fsdp2 and --use-megatron-fsdp are two implementations of one "
                                    "thing: keep one")
            return None
        stage = 2 if given.get("torch_fsdp2_no_reshard_after_forward") else 3
        origin = "use_torch_fsdp2"
        why = ("PyTorch FSDP2 shards parameters, gradients and optimizer states" if stage == 3 else
               "FSDP2 without resharding after the forward keeps gathered parameters through the backward "
               "(Megatron's 'FSDP ZeRO-2')")
        megatron_refuses = [(settings["pipeline_model_parallel_size"] > 1, "pipeline parallelism"),
                            (given.get("use_distributed_optimizer"), "MCore's distributed optimizer"),
                            (not settings["untie_embeddings_and_output_weights"],
                             "a tied output layer (it requires --untie-embeddings-and-output-weights)"),
                            (settings["fp16"], "fp16")]
        for refused, what in megatron_refuses:
            if refused:
                resolved.refused.append(f"--use-torch-fsdp2 with {what}: Megatron-LM refuses this combination "
                                        f"(validate_args), and so does this program")
    elif given.get("use_megatron_fsdp"):
        strategy = strategy or MEGATRON_FSDP_DEFAULT_STRATEGY
        stage = FSDP_STAGES[strategy]
        origin = "use_megatron_fsdp"
        why = f"Megatron-FSDP with --data-parallel-sharding-strategy {strategy}"
    else:
        for dest, needs in (("data_parallel_sharding_strategy", "--use-megatron-fsdp"),
                            ("torch_fsdp2_no_reshard_after_forward", "--use-torch-fsdp2")):
            if dest in given:
                resolved.notes.append(f"{option_used(dest)}: accepted, no effect without {needs} (Megatron-LM reads "
                                      f"it only there)")
        return None
    if sources["stage"].kind in (FLAG, JSON) and settings["stage"] != stage:
        resolved.refused.append(f"{option_used(origin)} (ZeRO stage {stage}) contradicts ZeRO stage "
                                f"{settings['stage']} from {sources['stage'].describe()}: drop one of them")
    elif settings["stage"] != stage:
        change("stage", stage, origin, f"{why}: ZeRO stage {stage}")
    return stage


def _resolve_precision_aware_optimizer(given: dict[str, Any], settings: dict[str, Any],
                                       option_used: Callable[[str], Optional[str]], resolved: Resolved) -> None:
    """Megatron-LM's rules for --use-precision-aware-optimizer and what of it exists here: without the switch every
    dtype must be fp32 (OptimizerConfig), and it needs the distributed optimizer. Here bf16 Adam moments are stored in
    bf16 and updated in fp32; fp16/fp8 moments, fp16 master weights and bf16 AdEMAMix moments are refused."""
    aware = bool(given.get("use_precision_aware_optimizer"))
    values = {dest: (settings.get(dest, "fp32") if dest in STORED_MOMENT_DTYPES else given.get(dest, "fp32"))
              for dest in PRECISION_AWARE_DTYPES}
    ignored = ignored_state_dtypes(given, settings)  # --optimizer-cpu-offload's fp32 states: said there
    for dest, what in PRECISION_AWARE_DTYPES.items():
        value = values[dest]
        if value == "fp32" or dest in ignored:
            continue
        requires = ("" if aware else f"; Megatron-LM takes {option_used(dest)} other than fp32 only with "
                                     f"--use-precision-aware-optimizer (OptimizerConfig)")
        if dest == "main_grads_dtype":
            if not aware:
                resolved.refused.append(f"{option_used(dest)} {value} without --use-precision-aware-optimizer: "
                                        f"Megatron-LM asserts main_grads_dtype can only be fp32 when not using the "
                                        f"precision-aware optimizer (OptimizerConfig); add the flag, or drop this one")
            continue
        if dest in STORED_MOMENT_DTYPES and value == "bf16":
            if not aware:
                resolved.refused.append(f"{option_used(dest)} {value} without --use-precision-aware-optimizer: "
                                        f"Megatron-LM takes {option_used(dest)} other than fp32 only with "
                                        f"--use-precision-aware-optimizer (OptimizerConfig); add the flag, or drop "
                                        f"this one")
            elif settings.get("optimizer", "adam") != "adam":
                resolved.refused.append(f"{option_used(dest)} {value} with --optimizer {settings['optimizer']}: "
                                        f"bf16 moments are TransformerEngine's FusedAdam's (Adam only); swiss-ai's "
                                        f"fork steps AdEMAMix as a plain torch optimizer with fp32 states; use fp32, "
                                        f"or --optimizer adam")
            continue
        resolved.refused.append(f"{option_used(dest)} {value}: {what} stored in {value} are not implemented (they are "
                                f"fp32 or bf16 here; TransformerEngine's FusedAdam keeps {value} ones with a "
                                f"per-tensor scale){requires}; use fp32 (or bf16 for the moments), or drop the flag")
    accepted = [f"{option_used(dest)} {values[dest]}" for dest in PRECISION_AWARE_DTYPES
                if dest != "main_grads_dtype" and option_used(dest) and values[dest] in ("fp32", "bf16")
                and dest not in ignored]
    if aware:
        stage = resolved.changes["stage"][0] if "stage" in resolved.changes else settings["stage"]
        if given.get("use_torch_fsdp2"):
            resolved.refused.append("--use-precision-aware-optimizer with --use-torch-fsdp2: Megatron-LM supports it "
                                    "only with distributed optimizer (get_megatron_optimizer), which FSDP2 excludes; "
                                    "drop one of them")
        elif stage == 0 and not given.get("use_megatron_fsdp"):
            resolved.refused.append("--use-precision-aware-optimizer without the distributed optimizer: Megatron-LM "
                                    "supports it only with distributed optimizer (get_megatron_optimizer); add "
                                    "--use-distributed-optimizer (ZeRO stage 1 here), or drop the flag")
        accepted.insert(0, "--use-precision-aware-optimizer")
    if accepted:
        stored = {dest: "fp32" if dest in ignored else values[dest] for dest in STORED_MOMENT_DTYPES}
        moments = ("fp32" if set(stored.values()) == {"fp32"} else
                   ", ".join(f"{'first' if dest == 'exp_avg_dtype' else 'second'} {value}"
                             for dest, value in stored.items()))
        if moments == "fp32":
            resolved.notes.append(f"{', '.join(accepted)}: accepted; the master weights and Adam moments are fp32 here "
                                  f"(Megatron-LM's defaults), the AdamW of this program")
        else:
            resolved.notes.append(f"{', '.join(accepted)}: accepted; the master weights are fp32 and the Adam moments "
                                  f"{moments}: bf16 ones are stored as bf16 between updates computed in fp32, as "
                                  f"TransformerEngine's FusedAdam does")


def _resolve_main_grads_dtype(given: dict[str, Any], settings: dict[str, Any], sources: dict[str, Source],
                              change: Callable, resolved: Resolved) -> None:
    """--main-grads-dtype bf16 under --bf16: gradients accumulate and reduce in bf16, as Megatron-LM's validate_args
    leaves --accumulate-allreduce-grads-in-fp32 off."""
    if given.get("main_grads_dtype") != "bf16":
        return
    if not settings["bf16"]:
        resolved.refused.append("--main-grads-dtype bf16 without --bf16: bf16 main gradients of fp32 or fp16 "
                                "parameters are not implemented; train with --bf16, or drop the flag")
    elif settings["accumulate_allreduce_grads_in_fp32"] and sources["accumulate_allreduce_grads_in_fp32"].kind in (
            FLAG, JSON):
        resolved.refused.append("--main-grads-dtype bf16 with --accumulate-allreduce-grads-in-fp32: Megatron-LM "
                                "asserts the main gradients are fp32 when they accumulate in fp32; drop one")
    else:
        change("accumulate_allreduce_grads_in_fp32", False, "main_grads_dtype",
               "bf16 main gradients: accumulated and reduced in bf16, as Megatron-LM leaves "
               "--accumulate-allreduce-grads-in-fp32 off for them")


def _resolve_query_groups(given: dict[str, Any], settings: dict[str, Any],
                          option_used: Callable[[str], Optional[str]], change: Callable, resolved: Resolved) -> None:
    """Megatron-LM reads --num-query-groups (default 1) only under --group-query-attention; Megatron-DeepSpeed's
    --num-key-value-heads needs no switch."""
    if given.get("group_query_attention") and settings["num_query_groups"] is None:
        change("num_query_groups", 1, "group_query_attention",
               "Megatron-LM's --num-query-groups default under --group-query-attention is 1 (multi-query)")
    elif option_used("num_query_groups") == "--num-query-groups" and not given.get("group_query_attention"):
        change("num_query_groups", None, "num_query_groups",
               "without --group-query-attention Megatron-LM does not read it: multi-head attention")
        resolved.notes.append(f"--num-query-groups {settings['num_query_groups']} without --group-query-attention: "
                              f"not read, as in Megatron-LM (multi-head attention, one key/value head per query "
                              f"head); add --group-query-attention for grouped-query attention")


def _resolve_pipe_parallel_size(given: dict[str, Any], settings: dict[str, Any], sources: dict[str, Source],
                                change: Callable, resolved: Resolved) -> None:
    """DeepSpeedExamples' v1.1.5-3D --pipe-parallel-size N: N pipeline stages split evenly over the transformer layers,
    as here; 0, its default, is no pipeline engine."""
    stages = given.get("pipe_parallel_size")
    if stages is None:
        return
    if stages < 0:
        resolved.refused.append(f"--pipe-parallel-size {stages}: the stage count is 0 (no pipeline engine) or more")
        return
    stages = max(stages, 1)
    typed = sources["pipeline_model_parallel_size"].kind in (FLAG, JSON)
    if typed and settings["pipeline_model_parallel_size"] != stages:
        resolved.refused.append(f"--pipe-parallel-size {given['pipe_parallel_size']} contradicts "
                                f"--pipeline-model-parallel-size {settings['pipeline_model_parallel_size']}: "
                                f"both set the pipeline stages; keep one")
    elif not typed:
        change("pipeline_model_parallel_size", stages, "pipe_parallel_size",
               "DeepSpeed's pipeline engine stages (PipelineModule, partition_method 'type:transformer': the "
               "transformer layers split evenly, as Megatron's stages)" if stages > 1
               else "no DeepSpeed pipeline engine: one stage")


def _resolve_ulysses(given: dict[str, Any], settings: dict[str, Any], sources: dict[str, Source],
                     change: Callable, resolved: Resolved) -> None:
    """Megatron-DeepSpeed's --ds-sequence-parallel-size N (DeepSpeed-Ulysses) is --context-parallel-size N
    --cp-comm-type a2a here: the same all-to-all over the same ranks. A contradicting flag is refused."""
    size = given.get("ds_sequence_parallel_size")
    if size is None or size == 1:
        return
    if size < 1:
        resolved.refused.append(f"--ds-sequence-parallel-size {size}: the sequence-parallel size is at least 1")
        return
    if sources["context_parallel_size"].kind in (FLAG, JSON) and settings["context_parallel_size"] not in (1, size):
        resolved.refused.append(f"--ds-sequence-parallel-size {size} contradicts --context-parallel-size "
                                f"{settings['context_parallel_size']}: both split the sequence; keep one")
        return
    if sources["cp_comm_type"].kind in (FLAG, JSON) and settings["cp_comm_type"] != "a2a":
        resolved.refused.append(f"--ds-sequence-parallel-size {size} is DeepSpeed-Ulysses' all-to-all; it "
                                f"contradicts --cp-comm-type {settings['cp_comm_type']}: drop one")
        return
    change("context_parallel_size", size, "ds_sequence_parallel_size",
           "DeepSpeed-Ulysses' sequence-parallel ranks are context-parallel ranks here")
    change("cp_comm_type", "a2a", "ds_sequence_parallel_size", "DeepSpeed-Ulysses' all-to-all around attention")


def _resolve_positions(given: dict[str, Any], settings: dict[str, Any], change: Callable) -> None:
    """--use-rotary-position-embeddings means rotary positions alone in both programs; Megatron-DeepSpeed's
    --no-position-embedding without it leaves no positions."""
    if given.get("use_rotary_position_embeddings"):
        if settings["position_embedding_type"] != "rope":
            change("position_embedding_type", "rope", "use_rotary_position_embeddings",
                   "rotary positions alone (Megatron-DeepSpeed turns its learned positions off under it)")
    elif given.get("no_position_embedding") and settings["position_embedding_type"] == "learned_absolute":
        change("position_embedding_type", "none", "no_position_embedding",
               "Megatron-DeepSpeed's --no-position-embedding without rotary positions")


HONOURED, ALIAS, NO_EFFECT = "honoured", "alias", "no-effect"


def classify_harvested(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{harvested option: its class}; an option in no class is missing. `parser` is build_parser()'s."""
    from arguments.megatron.flag_classes import CLASS_OF
    from arguments.megatron.harvested_flags import harvested_options

    meaning_class = {}
    for meaning in MEANINGS:
        kind = (NO_EFFECT if meaning.dest in NO_EFFECT_FLAGS or meaning.dest == "distributed_backend"
                else HONOURED)
        meaning_class[meaning.options[0]] = kind
        meaning_class.update({option: ALIAS for option in meaning.options[1:]})
    classes = {}
    for option in harvested_options():
        if option in CLASS_OF:
            classes[option] = CLASS_OF[option][0]
        elif option in ALIASES or option in SPELLINGS:
            classes[option] = ALIAS
        elif option in meaning_class:
            classes[option] = meaning_class[option]
        elif option in option_table(parser):
            classes[option] = HONOURED
    return classes
