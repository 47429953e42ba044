"""Megatron-style command-line flags merged over a YAML preset.

A preset (`--config tiny` or `--config path/to/x.yaml`) is a flat mapping whose keys are flag names
(`num_layers: 48` or `num-layers: 48`). Its values are turned into flags placed *before* the user's
flags, so argparse checks their types the same way and a flag given on the command line wins.
`--zero-config ds.json` (a DeepSpeed JSON, zero/deepspeed_json.py) is turned into flags the same way
and placed between the two, so the precedence is YAML preset < JSON < command line; a command-line
flag that contradicts a JSON key is an error naming both rather than a silent override. Megatron-LM's
and DeepSpeed-Megatron's flags are aliases or meanings (gpt/megatron_flags.py). Each value keeps its
source (gpt/config_sources.py) for --print-config and for errors about values the user did not type.
Every bad input ends in `ConfigError` with one line naming the key or flag.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import yaml

from gpt.config import (ACTIVATIONS, ATTENTION_BACKENDS, LR_DECAY_STYLES, TOKENIZER_TYPES, ConfigError,
                        PretrainConfig)
from gpt.config_sources import (DEFAULT, FLAG, JSON, PRESET, Source, name_inherited_values, options_typed,
                                show_value, values_set_by)
from gpt.errors import OneLineArgumentParser
from gpt.input_files import irregularity, read_text_file
from gpt.flag_equivalents import unknown_flags_message
from gpt.megatron_flags import MEANING_DESTS, add_meanings, aliases_of, describe_alias, resolve_meanings
from zero.config import ZERO_STAGES
from zero.deepspeed_json import DeepSpeedTranslation, load_deepspeed_config, resolve_zero_config

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "models"
DEFAULT_PRESET = "tiny"


# Flags that choose where settings come from, or what the program does; they are not settings.
SOURCE_FLAGS = ("config", "zero_config", "print_config")
NOT_SETTINGS = SOURCE_FLAGS + MEANING_DESTS


def count(text: str) -> int:
    """An element count: a whole number, also written as 5e8."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"invalid count {text!r} (a whole number such as 500000000 or 5e8)")
    return int(value)


def _with_aliases(group, *options: str, **kwargs) -> argparse.Action:
    """add_argument, with the Megatron/DeepSpeed names of the flag (gpt/megatron_flags.py) as aliases."""
    return group.add_argument(*options, *[alias for option in options for alias in aliases_of(option)], **kwargs)


def build_parser() -> argparse.ArgumentParser:
    defaults = PretrainConfig()
    m, o, t, d, log = defaults.model, defaults.optimizer, defaults.training, defaults.data, defaults.logging
    z, a, c = defaults.zero, defaults.activations, defaults.checkpoint
    parser = OneLineArgumentParser(prog="pretrain_gpt.py", description="Pretrain a GPT (Megatron-style flags).",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    parser.add_argument("--config", default=DEFAULT_PRESET,
                        help=f"YAML preset: a name in configs/models ({', '.join(preset_names())}; the ZeRO "
                             "paper's Table 4 models as zero_paper/NAME) or a path")
    parser.add_argument("--print-config", action="store_true",
                        help="print every setting with its value and where it came from (default, preset, JSON, "
                             "flag), then exit without training")

    g = parser.add_argument_group("model")
    g.add_argument("--num-layers", type=int, default=m.num_layers)
    g.add_argument("--hidden-size", type=int, default=m.hidden_size)
    g.add_argument("--num-attention-heads", type=int, default=m.num_attention_heads)
    g.add_argument("--ffn-hidden-size", type=int, default=m.ffn_hidden_size, help="default: 4 x hidden size")
    g.add_argument("--seq-length", type=int, default=m.seq_length)
    g.add_argument("--max-position-embeddings", type=int, default=m.max_position_embeddings)
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=m.make_vocab_size_divisible_by,
                   help="pad the vocabulary to a multiple of this x tensor-parallel size")
    g.add_argument("--hidden-dropout", type=float, default=m.hidden_dropout)
    g.add_argument("--attention-dropout", type=float, default=m.attention_dropout)
    g.add_argument("--layernorm-epsilon", type=float, default=m.layernorm_epsilon)
    g.add_argument("--init-method-std", type=float, default=m.init_method_std)
    g.add_argument("--activation", choices=ACTIVATIONS, default=m.activation,
                   help="gelu_tanh is GPT-2's approximation, gelu the exact erf form")
    g.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=m.attention_backend,
                   help="the SDPA kernel (Megatron's names): flash = flash attention, fused = cuDNN or the "
                        "memory-efficient kernel, unfused/local = the math kernel, auto = PyTorch's choice")
    g.add_argument("--use-flash-attn", dest="attention_backend", action="store_const", const="flash",
                   help="Megatron-LM's older name for --attention-backend flash")

    g = parser.add_argument_group("optimizer and learning-rate schedule")
    g.add_argument("--lr", type=float, default=o.lr)
    g.add_argument("--min-lr", type=float, default=o.min_lr)
    g.add_argument("--lr-warmup-iters", type=int, default=o.lr_warmup_iters)
    _with_aliases(g, "--lr-warmup-fraction", type=float, default=o.lr_warmup_fraction,
                  help="warm up over this fraction of --lr-decay-iters (Megatron-LM; instead of --lr-warmup-iters)")
    g.add_argument("--lr-decay-iters", type=int, default=o.lr_decay_iters, help="default: --train-iters")
    g.add_argument("--lr-decay-style", choices=LR_DECAY_STYLES, default=o.lr_decay_style)
    g.add_argument("--weight-decay", type=float, default=o.weight_decay,
                   help="AdamW decay; biases and LayerNorm parameters are never decayed")
    g.add_argument("--clip-grad", type=float, default=o.clip_grad, help="global gradient-norm clip; 0 disables")
    g.add_argument("--adam-beta1", type=float, default=o.adam_beta1)
    g.add_argument("--adam-beta2", type=float, default=o.adam_beta2)
    g.add_argument("--adam-eps", type=float, default=o.adam_eps)

    g = parser.add_argument_group("training")
    _with_aliases(g, "--micro-batch-size", type=int, default=t.micro_batch_size)
    g.add_argument("--global-batch-size", type=int, default=t.global_batch_size,
                   help="micro batch x gradient-accumulation steps x data-parallel size "
                        "(set from --gradient-accumulation-steps when that is given)")
    g.add_argument("--gradient-accumulation-steps", dest="accumulation_steps", type=int,
                   default=t.accumulation_steps,
                   help="micro batches per rank per iteration; when given, it determines the global batch "
                        "(default: --global-batch-size / (micro batch x data-parallel size))")
    g.add_argument("--rampup-batch-size", nargs=3, type=count, default=t.rampup_batch_size,
                   metavar=("START", "INCREMENT", "SAMPLES"),
                   help="grow the global batch from START by INCREMENT, evenly over the first SAMPLES samples, "
                        "to --global-batch-size (Megatron-LM)")
    g.add_argument("--train-iters", type=int, default=t.train_iters)
    g.add_argument("--seed", type=int, default=t.seed)
    g.add_argument("--device", default=t.device, help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=t.compile,
                   help="torch.compile each transformer block (the first iterations compile; every TP size and "
                        "ZeRO stage)")
    g.add_argument("--dry-run", action="store_true", default=t.dry_run,
                   help="print what this rank would hold and send (python -m zero.plan dry-run) and exit")
    _with_aliases(g, "--tensor-model-parallel-size", type=int, default=t.tensor_model_parallel_size)
    g.add_argument("--eval-interval", type=int, default=t.eval_interval)
    g.add_argument("--eval-iters", type=int, default=t.eval_iters, help="batches per evaluation; 0 disables")
    g.add_argument("--log-interval", type=int, default=t.log_interval)

    g = parser.add_argument_group("data and tokenizer")
    _with_aliases(g, "--data-path", nargs="+", default=d.data_path,
                   help="a dataset prefix, or 'weight prefix weight prefix ...' to blend; "
                        "omit to train on the embedded corpus")
    g.add_argument("--split", default=d.split, help="train,valid,test ratio of documents")
    g.add_argument("--data-cache-dir", default=d.data_cache_dir,
                   help="where the embedded corpus and index caches go (default ~/.cache/zero-gpt)")
    g.add_argument("--num-workers", type=int, default=d.num_workers, help="data-loader worker processes")
    g.add_argument("--tokenizer-type", choices=TOKENIZER_TYPES, default=d.tokenizer_type,
                   help="Megatron-LM's: GPT2BPETokenizer (--vocab-file, --merge-file), HuggingFaceTokenizer "
                        "(--tokenizer-model), NullTokenizer (--vocab-size; data tokenized elsewhere); default: "
                        "from the files given")
    _with_aliases(g, "--tokenizer-file", default=d.tokenizer_file,
                  help="a tokenizers tokenizer.json (or, as --tokenizer-model, a folder holding one); without "
                       "--data-path the embedded corpus is tokenized with it")
    g.add_argument("--vocab-size", type=int, default=m.vocab_size,
                   help="with --tokenizer-type NullTokenizer: token ids are 0..N-1 and the end-of-document id is N")
    g.add_argument("--vocab-file", "--tokenizer-vocab-file", dest="vocab_file", default=d.vocab_file,
                   help="GPT-2 style vocab.json (with --merge-file)")
    g.add_argument("--merge-file", "--tokenizer-merge-file", dest="merge_file", default=d.merge_file,
                   help="GPT-2 style merges.txt (with --vocab-file)")
    g.add_argument("--tokenizer-vocab-size", type=int, default=d.tokenizer_vocab_size,
                   help="vocabulary of the BPE trained on the embedded corpus")

    g = parser.add_argument_group("logging")
    g.add_argument("--metrics-file", default=log.metrics_file, help="JSON lines, one record per log/eval")
    g.add_argument("--wandb-project", default=log.wandb_project,
                   help="log to W&B (offline unless W&B is configured on this machine)")
    _with_aliases(g, "--wandb-run-name", default=log.wandb_run_name)
    g.add_argument("--wandb-entity", default=log.wandb_entity)
    g.add_argument("--peak-tflops", type=float, default=log.peak_tflops,
                   help="the device's dense 16-bit peak for the mfu metric (default: by CUDA device name, "
                        "H100 SXM 989, A100 312, V100 125; no mfu on CPU without it)")
    g.add_argument("--report-memory", action=argparse.BooleanOptionalAction, default=log.report_memory,
                   help="log per-rank model-state bytes held and the zero/memory.py prediction")
    g.add_argument("--tensorboard-dir", default=log.tensorboard_dir, metavar="DIR",
                   help="also write TensorBoard events here, with the same keys as --metrics-file")

    g = parser.add_argument_group("checkpoints, resume and preemption")
    g.add_argument("--save", default=c.save, metavar="DIR",
                   help="write checkpoints here: one iter_NNNNNNN/ per save and a 'latest' pointer")
    g.add_argument("--save-interval", type=int, default=c.save_interval,
                   help="save every N iterations (always also at the end of training and on an exit)")
    g.add_argument("--keep-last", type=int, default=c.keep_last, help="keep only the newest K checkpoints")
    g.add_argument("--load", default=c.load, metavar="CKPT",
                   help="resume from a --save directory (its latest checkpoint) or one iter_NNNNNNN "
                        "directory, at any data-parallel size and ZeRO stage; when it is also the --save "
                        "directory and holds no checkpoint yet, the run starts fresh, so restarts can use "
                        "the same command")
    g.add_argument("--load-optim", action=argparse.BooleanOptionalAction, default=c.load_optim,
                   help="--no-load-optim: take the weights only, with fresh Adam moments")
    g.add_argument("--load-rng", action=argparse.BooleanOptionalAction, default=c.load_rng,
                   help="--no-load-rng: random streams from --seed instead of the checkpoint's")
    g.add_argument("--finetune", action=argparse.BooleanOptionalAction, default=c.finetune,
                   help="load weights only and start at iteration 0")
    g.add_argument("--init-from-hf", default=c.init_from_hf, metavar="DIR",
                   help="start from a transformers GPT2LMHeadModel folder (config.json + model.safetensors)")
    g.add_argument("--exit-signal-handler", action=argparse.BooleanOptionalAction,
                   default=c.exit_signal_handler,
                   help="on SIGTERM or SIGUSR1, finish the iteration, save and exit 0")
    g.add_argument("--exit-interval", type=int, default=c.exit_interval,
                   help="save and exit 0 after an iteration that is a multiple of N")
    g.add_argument("--exit-duration-in-mins", type=float, default=c.exit_duration_in_mins,
                   help="save and exit 0 once the run has lasted this many minutes")
    g.add_argument("--overwrite-save", action=argparse.BooleanOptionalAction, default=c.overwrite_save,
                   help="let this run write into a --save directory holding checkpoints it did not resume "
                        "from (its saves replace same-numbered iterations and move 'latest')")
    g.add_argument("--override-data-on-resume", action=argparse.BooleanOptionalAction,
                   default=c.override_data_on_resume,
                   help="resume although --data-path, --split, --seq-length or --seed differ from the "
                        "checkpoint's (the samples then differ from the original run's)")
    g.add_argument("--verify-checkpoint", action=argparse.BooleanOptionalAction, default=c.verify_checkpoint,
                   help="check every checkpoint file's content hash before loading (--no-verify-checkpoint "
                        "keeps the size, header and dtype checks and skips reading whole files)")
    g.add_argument("--distributed-timeout-minutes", type=float, default=t.distributed_timeout_minutes,
                   help="how long a collective waits for a peer before the job fails (a dead rank)")

    g = parser.add_argument_group("ZeRO and mixed precision")
    _with_aliases(g, "--zero-config", metavar="FILE.json",
                   help="a DeepSpeed config JSON (a path, or a name in configs/zero: "
                        f"{', '.join(zero_config_names())}); every key is honoured as a flag, accepted with no "
                        "effect on the math, or refused with the alternative (zero/deepspeed_keys.py). YAML preset "
                        "< this file < command-line flags; a flag that contradicts the file is an error")
    g.add_argument("--zero-stage", dest="stage", type=int, choices=ZERO_STAGES, default=z.stage,
                   help="0: data parallelism on flat buckets; 1: partition optimizer states (P_os); "
                        "2: and gradients (P_os+g); 3: and parameters (P_os+g+p)")
    g.add_argument("--reduce-bucket-size", type=count, default=z.reduce_bucket_size,
                   help="elements per gradient reduce(-scatter)")
    g.add_argument("--allgather-bucket-size", type=count, default=z.allgather_bucket_size,
                   help="elements per parameter all-gather after the optimizer step")
    _with_aliases(g, "--overlap-comm", action=argparse.BooleanOptionalAction, default=z.overlap_comm,
                   help="reduce gradient buckets while backward is still running")
    g.add_argument("--overlap-param-gather", action=argparse.BooleanOptionalAction, default=z.overlap_param_gather,
                   help="stages 1-2: start the parameter all-gather after the step and wait for each bucket "
                        "just before the forward that needs it (Megatron's overlap-param-gather)")
    g.add_argument("--contiguous-gradients", action=argparse.BooleanOptionalAction,
                   default=z.contiguous_gradients,
                   help="copy gradients into contiguous buckets (always on; --no- is rejected)")
    g.add_argument("--reduce-scatter", action=argparse.BooleanOptionalAction, default=z.reduce_scatter,
                   help="reduce-scatter gradients (--no-: all-reduce, then keep this rank's shard)")
    g.add_argument("--stage3-prefetch-bucket-size", type=count, default=z.stage3_prefetch_bucket_size,
                   help="stage 3: elements of parameters fetched ahead of their use")
    g.add_argument("--stage3-param-persistence-threshold", type=count,
                   default=z.stage3_param_persistence_threshold,
                   help="stage 3: parameters with fewer elements stay whole on every rank "
                        "(DeepSpeed's default is 1e5; 0 partitions everything, as in the paper)")
    g.add_argument("--stage3-max-live-parameters", type=count, default=z.stage3_max_live_parameters,
                   help="stage 3: most parameter elements gathered at once")
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=t.bf16,
                   help="bf16 mixed precision: bf16 parameters and gradients, fp32 master weights and Adam "
                        "states in the ZeRO optimizer")
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action=argparse.BooleanOptionalAction,
                   default=t.accumulate_allreduce_grads_in_fp32,
                   help="accumulate and reduce gradients in fp32 (Megatron's flag; default: on with --bf16, "
                        "off with --fp16, whose gradients stay 16-bit as in the ZeRO paper)")
    g.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=t.fp16,
                   help="fp16 mixed precision: fp16 parameters and gradients, fp32 master weights and Adam "
                        "states in the ZeRO optimizer, with dynamic loss scaling (or --loss-scale)")
    g.add_argument("--loss-scale", type=float, default=t.loss_scale,
                   help="fp16: a static loss scale (None: dynamic scaling)")
    g.add_argument("--initial-loss-scale", type=float, default=t.initial_loss_scale,
                   help="fp16: where dynamic loss scaling starts")
    g.add_argument("--loss-scale-window", type=int, default=t.loss_scale_window,
                   help="fp16: overflow-free steps before the loss scale doubles")
    g.add_argument("--hysteresis", type=int, default=t.hysteresis,
                   help="fp16: overflows tolerated before the loss scale is lowered")
    g.add_argument("--min-loss-scale", type=float, default=t.min_loss_scale,
                   help="fp16: dynamic loss scaling never goes below this")

    g = parser.add_argument_group("activation checkpointing (ZeRO-R)")
    g.add_argument("--checkpoint-activations", action=argparse.BooleanOptionalAction,
                   default=a.checkpoint_activations,
                   help="keep only each group's input in forward and recompute the group in backward")
    _with_aliases(g, "--checkpoint-num-layers", type=int, default=a.checkpoint_num_layers,
                   help="transformer blocks per checkpointed group")
    g.add_argument("--partition-activations", action=argparse.BooleanOptionalAction,
                   default=a.partition_activations,
                   help="P_a: each tensor-parallel rank keeps 1/TP of every checkpointed input and they are "
                        "all-gathered before the recompute")
    _with_aliases(g, "--cpu-checkpointing", action=argparse.BooleanOptionalAction, default=a.cpu_checkpointing,
                   help="P_a+cpu: keep checkpointed inputs (their 1/TP slices with --partition-activations) in "
                        "host memory")
    _with_aliases(g, "--contiguous-checkpointing", action=argparse.BooleanOptionalAction,
                   default=a.contiguous_checkpointing,
                   help="M_D: copy a micro-batch's checkpoints into one pre-allocated buffer (DeepSpeed's "
                        "contiguous_memory_optimization)")
    g.add_argument("--number-checkpoints", type=int, default=a.number_checkpoints,
                   help="checkpoints the contiguous buffer holds (None: one per group, "
                        "ceil(num layers / checkpoint num layers))")
    _with_aliases(g, "--synchronize-checkpoint-boundary", action=argparse.BooleanOptionalAction,
                   default=a.synchronize_checkpoint_boundary,
                   help="CUDA synchronize at each checkpoint boundary (debugging)")
    g.add_argument("--profile-checkpointing", action=argparse.BooleanOptionalAction,
                   default=a.profile_checkpointing,
                   help="time each checkpoint's forward and recompute (DeepSpeed's profile)")
    add_meanings(parser)
    return parser


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def zero_config_names() -> list[str]:
    return sorted(path.stem for path in (PRESET_DIR.parent / "zero").glob("*.json"))


def resolve_preset(name_or_path: str) -> Path:
    """A path to a YAML file, or a preset's name in configs/models, also in a folder there
    (`zero_paper/100b-125x8192` is configs/models/zero_paper/100b-125x8192.yaml)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        candidates = [path]
    elif path.parent == Path("."):
        candidates = [PRESET_DIR / f"{name_or_path}.yaml"]
    else:
        candidates = [path] + ([] if path.is_absolute() else [PRESET_DIR / f"{name_or_path}.yaml"])
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if path.exists():  # there, but a directory, a FIFO or a device: say which
        raise ConfigError(f"--config {name_or_path}: {irregularity(path)}; give a preset's name or a YAML file")
    raise ConfigError(f"--config {name_or_path}: no such preset file ({candidates[-1]}); "
                      f"presets: {', '.join(preset_names())}")


def preset_label(path: Path) -> str:
    """A preset as a user would name it: `tiny (configs/models/tiny.yaml)`, or its path."""
    if path.resolve().parent == PRESET_DIR:
        return f"{path.stem} (configs/models/{path.name})"
    return str(path)


def read_preset(path: Path) -> Any:
    """A preset file's YAML, every way it can be unreadable reported as a ConfigError naming it."""
    text = read_text_file(path, "--config")  # regular, UTF-8 and of a config's size, or one line
    try:
        return yaml.safe_load(text) or {}
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a preset (a preset is a flat mapping)") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({error})") from None


def preset_to_flags(preset: dict[str, Any], parser: argparse.ArgumentParser, source: Path) -> list[str]:
    """Turn a flat YAML mapping into the equivalent flags, rejecting keys that are not flags.

    A key is a flag's name (`zero_stage`, `zero-stage`) or its setting's (`stage`)."""
    flags = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in NOT_SETTINGS + ("help",):
            flags[action.dest] = action
            for option in action.option_strings:
                if not (isinstance(action, argparse.BooleanOptionalAction) and option.startswith("--no-")):
                    flags[option[2:].replace("-", "_")] = action
    argv: list[str] = []
    for key, value in preset.items():
        name = str(key).replace("-", "_")
        if name in SOURCE_FLAGS:
            raise ConfigError(f"{source}: {key} cannot be set in a preset; pass --{name.replace('_', '-')} "
                              f"on the command line")
        if name not in flags:
            raise ConfigError(f"{source}: unknown key {key!r} (keys are flag names, e.g. num_layers)")
        option = flags[name].option_strings[0]
        if value is None:
            continue
        if isinstance(flags[name], argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
            argv.append(option if value else "--no-" + option[2:])
        elif isinstance(value, list):
            argv += [option, *map(str, value)]
        else:  # one token, so a value such as -1e-3 or -inf is not taken for a flag
            argv.append(f"{option}={value}")
    return argv


@dataclass(frozen=True)
class ParsedArguments:
    config: PretrainConfig            # validated; config.sources says where each value came from
    notes: tuple[str, ...]            # said once at the start: flags and JSON keys with no effect, mappings
    print_config: bool                # --print-config: show the configuration and exit
    deepspeed: Optional[DeepSpeedTranslation]  # the JSON's classification, for --print-config
    preset: str                       # the preset in force, as `preset_label` names it
    meanings: dict[str, Any]          # the Megatron-meaning flags given, for --print-config


def parse_config(argv: Optional[Sequence[str]] = None) -> PretrainConfig:
    """CLI flags over a YAML preset -> a validated PretrainConfig (see `parse_arguments`)."""
    return parse_arguments(argv).config


def parse_arguments(argv: Optional[Sequence[str]] = None) -> ParsedArguments:
    """The layers -- YAML preset < DeepSpeed JSON < command line -- parsed into one validated config,
    with the source of every value. Unknown flags, refused Megatron flags, unsupported JSON keys and
    a JSON value that contradicts a command-line flag are each one ConfigError listing all of them."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    known, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ConfigError(unknown_flags_message(unknown, parser))
    preset_path = resolve_preset(known.config)
    preset = read_preset(preset_path)
    if not isinstance(preset, dict):
        raise ConfigError(f"{preset_path}: a preset must be a mapping of flag names to values")
    preset_argv = preset_to_flags(preset, parser, preset_path)
    try:
        parser.parse_args(preset_argv)
    except ConfigError as error:
        raise ConfigError(f"{preset_path}: {error}") from None
    translation = load_deepspeed_config(resolve_zero_config(known.zero_config)) if known.zero_config else None
    json_argv = translation.argv if translation is not None else []
    if translation is not None:
        try:  # the JSON's own errors, named with its file before they mix with the preset and the flags
            json_only = PretrainConfig.from_flat(_settings(vars(parser.parse_args(json_argv))))
            json_only.zero.validate()
            json_only.activations.validate()
        except ConfigError as error:
            raise ConfigError(f"{translation.source}: {error}") from None

    namespace = vars(parser.parse_args(preset_argv + json_argv + argv))
    sources = layer_sources(parser, preset_path, preset_argv, translation, argv)
    settings = _settings(dict(namespace))
    meanings = {dest: namespace[dest] for dest in MEANING_DESTS}
    typed = options_typed(parser, argv)
    resolved = resolve_meanings(meanings, settings, sources, typed.get)
    for name, (value, source) in resolved.changes.items():
        settings[name], sources[name] = value, source
    check_given_together(sources)
    config = PretrainConfig.from_flat(settings, sources)
    try:
        config.validate()
    except ConfigError as error:
        raise name_inherited_values(error, parser, sources, settings.get) from None
    notes = list(resolved.notes)
    if translation is not None and translation.info_line():
        notes.append(translation.info_line())
    given = {dest: value for dest, value in meanings.items() if value is not None and value is not False}
    return ParsedArguments(config, tuple(notes), bool(namespace["print_config"]), translation,
                           preset_label(preset_path), given)


def layer_sources(parser: argparse.ArgumentParser, preset_path: Path, preset_argv: list[str],
                  translation: Optional[DeepSpeedTranslation], argv: list[str]) -> dict[str, Source]:
    """The source of every setting (the last layer that set it), and the check that the JSON and the
    command line do not contradict each other, nor two JSON keys one another."""
    sources = {dest: Source(DEFAULT) for dest in _settings(vars(parser.parse_args([])))}
    for dest in values_set_by(parser, preset_argv):
        sources[dest] = Source(PRESET, preset_label(preset_path))
    json_values: dict[str, tuple[Any, str, str]] = {}  # dest -> (value, key, the flags the key became)
    contradictions = []
    for setting in translation.settings if translation is not None else []:
        where = f"{translation.source}: {setting.key}"
        for dest, value in values_set_by(parser, list(setting.flags)).items():
            if dest in json_values and json_values[dest][0] != value:
                contradictions.append(f"{json_values[dest][1]} and {setting.key} in {translation.source} ask for "
                                      f"different values ({json_values[dest][2]}; {' '.join(setting.flags)})")
            json_values[dest] = (value, setting.key, " ".join(setting.flags))
            sources[dest] = Source(JSON, where)
    typed = options_typed(parser, argv)
    for dest, value in values_set_by(parser, argv).items():
        agrees = ""
        if dest in json_values:
            json_value, key, json_flags = json_values[dest]
            if json_value != value:
                contradictions.append(f"{_typed_value(typed.get(dest, dest), value)} on the command line "
                                      f"contradicts {key} in {translation.source} ({json_flags})")
            agrees = f"{key} in {translation.source}"
        sources[dest] = Source(FLAG, describe_alias(typed.get(dest, dest)), agrees_with=agrees)
    if contradictions:
        raise ConfigError("; ".join(contradictions) + ": remove one of each pair")
    return sources


# Settings of which only one may be given explicitly (on the command line or in the JSON): the first
# replaces the second, as in Megatron-LM, where giving both is an error. A preset's value for the
# second is simply replaced.
EXCLUSIVE_SETTINGS = (
    ("lr_warmup_fraction", "lr_warmup_iters", "--lr-warmup-fraction", "--lr-warmup-iters"),
)


def check_given_together(sources: dict[str, Source]) -> None:
    for first, second, first_flag, second_flag in EXCLUSIVE_SETTINGS:
        explicit = [sources[name] for name in (first, second) if sources[name].kind in (JSON, FLAG)]
        if len(explicit) == 2:
            raise ConfigError(f"give one of {first_flag} and {second_flag}, not both ({explicit[0].describe()}; "
                              f"{explicit[1].describe()})")


def _typed_value(option: str, value: Any) -> str:
    """How a flag was given: `--fp16`, `--no-bf16`, `--lr 0.0003`."""
    return option if isinstance(value, bool) else f"{option} {show_value(value)}"


def _settings(values: dict[str, Any]) -> dict[str, Any]:
    for name in NOT_SETTINGS:
        values.pop(name, None)
    return values
