"""Megatron-style command-line flags merged over a YAML preset.

A preset (`--config tiny` or `--config path/to/x.yaml`) is a flat mapping whose keys are flag names
(`num_layers: 48` or `num-layers: 48`). Its values are turned into flags placed *before* the user's
flags, so argparse checks their types the same way and a flag given on the command line wins.
Every bad input ends in `ConfigError` with one line naming the key or flag.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from gpt.config import ACTIVATIONS, LR_DECAY_STYLES, ConfigError, PretrainConfig

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "models"
DEFAULT_PRESET = "tiny"


class _RaisingParser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> None:
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    defaults = PretrainConfig()
    m, o, t, d, log = defaults.model, defaults.optimizer, defaults.training, defaults.data, defaults.logging
    parser = _RaisingParser(prog="pretrain_gpt.py", description="Pretrain a GPT (Megatron-style flags).",
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False)
    parser.add_argument("--config", default=DEFAULT_PRESET,
                        help=f"YAML preset: a name in configs/models ({', '.join(preset_names())}) or a path")

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
                   help="micro batch x gradient-accumulation steps x data-parallel size")
    g.add_argument("--train-iters", type=int, default=t.train_iters)
    g.add_argument("--seed", type=int, default=t.seed)
    g.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=t.bf16,
                   help="bf16 autocast for matmuls (fp32 weights and optimizer)")
    g.add_argument("--device", default=t.device, help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
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
    return parser


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def resolve_preset(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.parent != Path("."):
        candidate = path
    else:
        candidate = PRESET_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        raise ConfigError(f"--config {name_or_path}: no such preset file ({candidate}); "
                          f"presets: {', '.join(preset_names())}")
    return candidate


def preset_to_flags(preset: dict[str, Any], parser: argparse.ArgumentParser, source: Path) -> list[str]:
    """Turn a flat YAML mapping into the equivalent flags, rejecting keys that are not flags."""
    flags = {action.dest: action for action in parser._actions if action.option_strings}
    argv: list[str] = []
    for key, value in preset.items():
        dest = str(key).replace("-", "_")
        if dest not in flags or dest in ("config", "help"):
            raise ConfigError(f"{source}: unknown key {key!r} (keys are flag names, e.g. num_layers)")
        option = flags[dest].option_strings[0]
        if value is None:
            continue
        if isinstance(flags[dest], argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
            argv.append(option if value else "--no-" + option[2:])
        elif isinstance(value, list):
            argv += [option, *map(str, value)]
        else:
            argv += [option, str(value)]
    return argv


def parse_config(argv: Optional[Sequence[str]] = None) -> PretrainConfig:
    """CLI flags over a YAML preset -> a validated PretrainConfig (vocab_size still unset)."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    known, _ = parser.parse_known_args(argv)
    preset_path = resolve_preset(known.config)
    try:
        preset = yaml.safe_load(preset_path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{preset_path}: not valid YAML ({error})") from None
    if not isinstance(preset, dict):
        raise ConfigError(f"{preset_path}: a preset must be a mapping of flag names to values")
    preset_argv = preset_to_flags(preset, parser, preset_path)
    try:
        parser.parse_args(preset_argv)
    except ConfigError as error:
        raise ConfigError(f"{preset_path}: {error}") from None
    namespace = parser.parse_args(preset_argv + argv)
    values = vars(namespace)
    values.pop("config")
    config = PretrainConfig.from_flat(values)
    config.validate()
    return config

