"""Megatron-style command-line flags merged over a YAML preset.

A preset (`--config tiny` or `--config path/to/x.yaml`) is a flat mapping whose keys are flag names
(`num_layers: 48` or `num-layers: 48`). Its values are turned into flags placed *before* the user's
flags, so argparse checks their types the same way and a flag given on the command line wins.
`--zero-config ds.json` (a DeepSpeed-style JSON) is turned into flags the same way and placed between
the two, so the precedence is YAML preset < --zero-config JSON < command line.
Every bad input ends in `ConfigError` with one line naming the key or flag.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from gpt.config import ACTIVATIONS, LR_DECAY_STYLES, ConfigError, PretrainConfig
from gpt.errors import OneLineArgumentParser
from zero.config import ZERO_STAGES, load_deepspeed_config, resolve_zero_config

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "models"
DEFAULT_PRESET = "tiny"


# Flags that choose where settings come from; they are not settings themselves.
SOURCE_FLAGS = ("config", "zero_config")


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


def build_parser() -> argparse.ArgumentParser:
    defaults = PretrainConfig()
    m, o, t, d, log = defaults.model, defaults.optimizer, defaults.training, defaults.data, defaults.logging
    z, a, c = defaults.zero, defaults.activations, defaults.checkpoint
    parser = OneLineArgumentParser(prog="pretrain_gpt.py", description="Pretrain a GPT (Megatron-style flags).",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    parser.add_argument("--config", default=DEFAULT_PRESET,
                        help=f"YAML preset: a name in configs/models ({', '.join(preset_names())}; the ZeRO "
                             "paper's Table 4 models as zero_paper/NAME) or a path")

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

    g = parser.add_argument_group("optimizer and learning-rate schedule")
    g.add_argument("--lr", type=float, default=o.lr)
    g.add_argument("--min-lr", type=float, default=o.min_lr)
    g.add_argument("--lr-warmup-iters", type=int, default=o.lr_warmup_iters)
    g.add_argument("--lr-decay-iters", type=int, default=o.lr_decay_iters, help="default: --train-iters")
    g.add_argument("--lr-decay-style", choices=LR_DECAY_STYLES, default=o.lr_decay_style)
    g.add_argument("--weight-decay", type=float, default=o.weight_decay,
                   help="AdamW decay; biases and LayerNorm parameters are never decayed")
    g.add_argument("--clip-grad", type=float, default=o.clip_grad, help="global gradient-norm clip; 0 disables")
    g.add_argument("--adam-beta1", type=float, default=o.adam_beta1)
    g.add_argument("--adam-beta2", type=float, default=o.adam_beta2)
    g.add_argument("--adam-eps", type=float, default=o.adam_eps)

    g = parser.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, default=t.micro_batch_size)
    g.add_argument("--global-batch-size", type=int, default=t.global_batch_size,
                   help="micro batch x gradient-accumulation steps x data-parallel size "
                        "(set from --gradient-accumulation-steps when that is given)")
    g.add_argument("--gradient-accumulation-steps", dest="accumulation_steps", type=int,
                   default=t.accumulation_steps,
                   help="micro batches per rank per iteration; when given, it determines the global batch "
                        "(default: --global-batch-size / (micro batch x data-parallel size))")
    g.add_argument("--train-iters", type=int, default=t.train_iters)
    g.add_argument("--seed", type=int, default=t.seed)
    g.add_argument("--device", default=t.device, help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=t.compile,
                   help="torch.compile each transformer block (the first iterations compile; every TP size and "
                        "ZeRO stage)")
    g.add_argument("--dry-run", action="store_true", default=t.dry_run,
                   help="print what this rank would hold and send (python -m zero.plan dry-run) and exit")
    g.add_argument("--tensor-model-parallel-size", type=int, default=t.tensor_model_parallel_size)
    g.add_argument("--eval-interval", type=int, default=t.eval_interval)
    g.add_argument("--eval-iters", type=int, default=t.eval_iters, help="batches per evaluation; 0 disables")
    g.add_argument("--log-interval", type=int, default=t.log_interval)

    g = parser.add_argument_group("data and tokenizer")
    g.add_argument("--data-path", nargs="+", default=d.data_path,
                   help="a dataset prefix, or 'weight prefix weight prefix ...' to blend; "
                        "omit to train on the embedded corpus")
    g.add_argument("--split", default=d.split, help="train,valid,test ratio of documents")
    g.add_argument("--data-cache-dir", default=d.data_cache_dir,
                   help="where the embedded corpus and index caches go (default ~/.cache/zero-gpt)")
    g.add_argument("--num-workers", type=int, default=d.num_workers, help="data-loader worker processes")
    g.add_argument("--tokenizer-file", default=d.tokenizer_file, help="a tokenizers tokenizer.json")
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
    g.add_argument("--wandb-run-name", default=log.wandb_run_name)
    g.add_argument("--wandb-entity", default=log.wandb_entity)
    g.add_argument("--peak-tflops", type=float, default=log.peak_tflops,
                   help="the device's dense 16-bit peak for the mfu metric (default: by CUDA device name, "
                        "H100 SXM 989, A100 312, V100 125; no mfu on CPU without it)")
    g.add_argument("--report-memory", action=argparse.BooleanOptionalAction, default=log.report_memory,
                   help="log per-rank model-state bytes held and the zero/memory.py prediction")

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
    g.add_argument("--zero-config", metavar="FILE.json",
                   help="DeepSpeed-style JSON (a path, or a name in configs/zero: "
                        f"{', '.join(zero_config_names())}); its zero_optimization, fp16, bf16, "
                        "activation_checkpointing, batch and clipping keys become flags: "
                        "YAML preset < this file < command-line flags")
    g.add_argument("--zero-stage", dest="stage", type=int, choices=ZERO_STAGES, default=z.stage,
                   help="0: data parallelism on flat buckets; 1: partition optimizer states (P_os); "
                        "2: and gradients (P_os+g); 3: and parameters (P_os+g+p)")
    g.add_argument("--reduce-bucket-size", type=count, default=z.reduce_bucket_size,
                   help="elements per gradient reduce(-scatter)")
    g.add_argument("--allgather-bucket-size", type=count, default=z.allgather_bucket_size,
                   help="elements per parameter all-gather after the optimizer step")
    g.add_argument("--overlap-comm", action=argparse.BooleanOptionalAction, default=z.overlap_comm,
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
    g.add_argument("--checkpoint-num-layers", type=int, default=a.checkpoint_num_layers,
                   help="transformer blocks per checkpointed group")
    g.add_argument("--partition-activations", action=argparse.BooleanOptionalAction,
                   default=a.partition_activations,
                   help="P_a: each tensor-parallel rank keeps 1/TP of every checkpointed input and they are "
                        "all-gathered before the recompute")
    g.add_argument("--cpu-checkpointing", action=argparse.BooleanOptionalAction, default=a.cpu_checkpointing,
                   help="P_a+cpu: keep checkpointed inputs (their 1/TP slices with --partition-activations) in "
                        "host memory")
    g.add_argument("--contiguous-checkpointing", action=argparse.BooleanOptionalAction,
                   default=a.contiguous_checkpointing,
                   help="M_D: copy a micro-batch's checkpoints into one pre-allocated buffer (DeepSpeed's "
                        "contiguous_memory_optimization)")
    g.add_argument("--number-checkpoints", type=int, default=a.number_checkpoints,
                   help="checkpoints the contiguous buffer holds (None: one per group, "
                        "ceil(num layers / checkpoint num layers))")
    g.add_argument("--synchronize-checkpoint-boundary", action=argparse.BooleanOptionalAction,
                   default=a.synchronize_checkpoint_boundary,
                   help="CUDA synchronize at each checkpoint boundary (debugging)")
    g.add_argument("--profile-checkpointing", action=argparse.BooleanOptionalAction,
                   default=a.profile_checkpointing,
                   help="time each checkpoint's forward and recompute (DeepSpeed's profile)")
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
    raise ConfigError(f"--config {name_or_path}: no such preset file ({candidates[-1]}); "
                      f"presets: {', '.join(preset_names())}")


def read_preset(path: Path) -> Any:
    """A preset file's YAML, every way it can be unreadable reported as a ConfigError naming it."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as error:
        raise ConfigError(f"--config {path}: cannot read it ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a preset (a preset is a flat mapping)") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({error})") from None


def preset_to_flags(preset: dict[str, Any], parser: argparse.ArgumentParser, source: Path) -> list[str]:
    """Turn a flat YAML mapping into the equivalent flags, rejecting keys that are not flags.

    A key is a flag's name (`zero_stage`, `zero-stage`) or its setting's (`stage`)."""
    flags = {}
    for action in parser._actions:
        if action.option_strings and action.dest not in SOURCE_FLAGS + ("help",):
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


def parse_config(argv: Optional[Sequence[str]] = None) -> PretrainConfig:
    """CLI flags over a YAML preset -> a validated PretrainConfig (vocab_size still unset)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    known, _ = parser.parse_known_args(argv)
    preset_path = resolve_preset(known.config)
    preset = read_preset(preset_path)
    if not isinstance(preset, dict):
        raise ConfigError(f"{preset_path}: a preset must be a mapping of flag names to values")
    preset_argv = preset_to_flags(preset, parser, preset_path)
    try:
        parser.parse_args(preset_argv)
    except ConfigError as error:
        raise ConfigError(f"{preset_path}: {error}") from None
    zero_argv: list[str] = []
    if known.zero_config is not None:
        zero_path = resolve_zero_config(known.zero_config)
        zero_argv = load_deepspeed_config(zero_path)
        try:  # the JSON's own errors, named with its file before they mix with the preset and the flags
            json_only = PretrainConfig.from_flat(_settings(parser.parse_args(zero_argv)))
            json_only.zero.validate()
            json_only.activations.validate()
        except ConfigError as error:
            raise ConfigError(f"{zero_path}: {error}") from None
    config = PretrainConfig.from_flat(_settings(parser.parse_args(preset_argv + zero_argv + argv)))
    config.validate()
    return config


def _settings(namespace: argparse.Namespace) -> dict[str, Any]:
    values = vars(namespace)
    for name in SOURCE_FLAGS:
        values.pop(name)
    return values

