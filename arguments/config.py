"""Configuration dataclasses for a pretraining run, and their validation.

Every field name here is also a CLI flag (`num_layers` <-> `--num-layers`) and a YAML preset key, so there is one
name for each setting wherever it is written; two fields keep another name (`zero.stage` is `--zero-stage`,
`training.accumulation_steps` `--gradient-accumulation-steps`: `FLAG_NAMES`). Each flag's help, argparse shape and
other programs' names are declared on its field (`option()`, base/options.py); arguments/parser.py builds the
parser from them. The defaults are the `tiny` preset: a GPT that trains on a laptop CPU in minutes. Validation
happens in `PretrainConfig.validate()`, before any work, and raises `ConfigError` naming the flag and the fix.

Every class here (and `ModelConfig`, `ZeroConfig`, `ActivationCheckpointConfig`) is a frozen dataclass: a config
is what the user asked for, and nothing changes it after parsing. The parser and the Megatron and DeepSpeed
translations work on a flat draft, {setting: value}, layering presets, JSON and flags by plain dict updates (they
write settings by name, from many sections at once); `PretrainConfig.from_flat` freezes it once at the end. What
depends on the tokenizer, the grid or the device (the vocabulary, each iteration's batch, the precision, the
attention kernel) is resolved once by training/run_settings.py into a new frozen copy; a variant is built with
`dataclasses.replace`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

import torch

from arguments.bounds import check_bounds
from arguments.config_sources import FLAG
from arguments.cuda_graphs import CUDA_GRAPH_IMPLS, MODULE_CHOICES, check_cuda_graphs
from arguments.megatron.beyond_megatron import settings_beyond_megatron
from arguments.megatron.defaults import DEFAULT_SOURCES
from arguments.megatron.harvested_flags import harvested
from arguments.step_batch_schedule import parse_step_schedule
from arguments.upcycling_rules import check_upcycling
from base.errors import ConfigError
from base.options import Const, count, flag_of, option, option_fields, setting_names, setting_values, with_settings
from base.waits import LONGEST_WAIT_TEXT, is_wait
from data import DataError
from data.gpt_dataset import APPENDABLE_ORDER, parse_split
from data.megatron_order import MEGATRON_ORDER
from data.per_split import SPLIT_FLAGS, DataSources, data_sources
from data.sampler import DATALOADER_TYPES, SINGLE
from data.tokenizer_types import OTHER_TOKENIZER_TYPES, TOKENIZER_TYPES, tokenizer_type_name, tokenizer_type_problem
from gpt.hybrid_pattern import ATTENTION, MLA
from gpt.layer_spec import mixer_symbols
from gpt.model_config import ModelConfig  # noqa: F401 - part of the config
from parallel.config import ParallelismConfig, recorded_section
from rendezvous.fault_injector import FaultInjectorSettings
from zero.config import ActivationCheckpointConfig, ZeroConfig

SEED_LIMIT = 2**32
# Matsuo Lab's GENIAC teams ran it (ucllm_nedo_dev's README checks out its tags)
GENIAC_FORK = "GENIAC's Megatron-DeepSpeed fork"
# Below a few heartbeats (one a second), a rank busy on a loaded machine would be taken for a hung one.
MIN_HEARTBEAT_TIMEOUT_S = 5.0
# Megatron-LM's --lr-decay-style choices (megatron/core/optimizer_param_scheduler.py, get_lr)
LR_DECAY_STYLES = ("cosine", "linear", "constant", "inverse-square-root", "WSD")
# "1-sqrt": swiss-ai's Megatron-LM fork's name (its default) for minus_sqrt, 1 - sqrt(ratio) in both
# (megatron/core/optimizer_param_scheduler.py, get_lr: `elif self.lr_wsd_decay_style == "1-sqrt"`).
LR_WSD_DECAY_STYLES = ("exponential", "linear", "cosine", "minus_sqrt", "1-sqrt")
# --optimizer: Megatron-LM's adam (AdamW), swiss-ai's Megatron-LM fork's ademamix, Megatron-LM's muon and ALCF's
# Megatron-DeepSpeed fork's sophiag (their arguments.py choices); ALCF's adamw (torch.optim.AdamW) is adam here
# (`optimizer_name`).
OPTIMIZERS = ("adam", "ademamix", "muon", "sophiag")
OPTIMIZER_ALIASES = {"adamw": "adam"}


def optimizer_name(name: str) -> str:
    """--optimizer's value, ALCF's adamw (torch.optim.AdamW: AdamW, as adam here) read as adam."""
    return OPTIMIZER_ALIASES.get(name, name)
# Megatron-LM's --muon-* choices (megatron/training/arguments.py; the coefficient types are emerging_optimizers'
# NSCoeffT less "custom", which takes coefficients no flag gives)
MUON_SCALE_MODES = ("spectral", "shape_scaling", "unit_rms_norm")
MUON_COEFFICIENT_TYPES = ("quintic", "simple", "polar_express", "aol")
MUON_MATMUL_PRECISIONS = ("low", "medium", "high")
MUON_TP_MODES = ("blockwise", "duplicated", "distributed")  # zero/muon.py scaled_orthogonalize: what each does
# Megatron-LM's --exp-avg-dtype / --exp-avg-sq-dtype choices (megatron/training/arguments.py); of these fp32 and bf16
# are implemented (zero/precision_aware.py), the others refused (arguments/megatron/flags.py)
MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")


# --muon-num-ns-steps' bound: recipes use 5 (quintic) to 8 (polar_express) iterations
MAX_NS_STEPS = 100

@dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 1e-3
    min_lr: float = 1e-4
    # Megatron-LM's separate rate for the input embedding and an untied output layer's weights (their
    # `is_embedding_or_output_parameter`): the same schedule with its own peak and floor.
    decoupled_lr: Optional[float] = option(None, help="the learning rate of the word embedding and the output "
                                                      "layer's weights (Megatron-LM; default: --lr)")
    decoupled_min_lr: Optional[float] = option(None, help="with --decoupled-lr: their minimum rate (default: "
                                                          "--min-lr)")
    lr_warmup_iters: int = option(20, aliases={"--warmup-iters": "DeepSpeedExamples' Megatron ZeRO-3"})
    # When set, the warmup is this fraction of --lr-decay-iters (of --train-iters when that is unset).
    lr_warmup_fraction: Optional[float] = option(
        None, help="warm up over this fraction of --lr-decay-iters (Megatron-LM; instead of --lr-warmup-iters)",
        aliases={"--warmup": "DeepSpeed-Megatron"})
    lr_decay_iters: Optional[int] = option(None, help="default: --train-iters")
    # No argparse choices: a value not here is refused with the launch's other problems (validate), not alone.
    lr_decay_style: str = option("cosine", help=f"one of {', '.join(LR_DECAY_STYLES)} (Megatron-LM's)")
    # Megatron-LM's warmup-stable-decay: the rate stays at --lr after the warmup until the last
    # --lr-wsd-decay-iters (or -samples) of the decay, then anneals to --min-lr in this style.
    lr_wsd_decay_style: str = option("exponential", help=f"with --lr-decay-style WSD: the anneal, one of "
                                                         f"{', '.join(LR_WSD_DECAY_STYLES)}")
    lr_wsd_decay_iters: Optional[int] = option(None, type=count, help="with --lr-decay-style WSD and --train-iters: "
                                                                      "the iterations of the anneal")
    lr_wsd_decay_samples: Optional[int] = option(None, type=count, help="with --lr-decay-style WSD and "
                                                                        "--train-samples: the samples of the anneal")
    # Megatron's sample-based schedule (with --train-samples): warmup and decay lengths in samples.
    lr_warmup_samples: int = option(0, type=count, help="with --train-samples: warm up over this many samples "
                                                        "(Megatron-LM)")
    lr_decay_samples: Optional[int] = option(None, type=count, help="with --train-samples: decay over this many "
                                                                    "samples (default: --train-samples)")
    # Megatron-DeepSpeed's token-based schedule: when set, warmup and decay follow consumed tokens.
    lr_warmup_tokens: Optional[int] = option(None, type=count,
                                             help="warm up over this many consumed tokens (Megatron-DeepSpeed)")
    lr_decay_tokens: Optional[int] = option(None, type=count,
                                            help="decay over this many consumed tokens (Megatron-DeepSpeed)")
    lr_warmup_init: float = option(0.0, help="the rate the linear warmup starts from (Megatron-LM)")
    # On resume, Megatron compares the schedule (lr, min lr, warmup, decay, style) with the checkpoint's:
    # different values are an error unless one of these says which side wins. The flags keep Megatron's
    # own spelling, underscore and all.
    override_opt_param_scheduler: bool = option(
        False, action="store_true",
        flags=("--override-opt_param-scheduler", "--override-opt-param-scheduler", "--override-lr-scheduler"),
        help="on resume, this run's schedule wins over the checkpoint's (Megatron-LM)")
    use_checkpoint_opt_param_scheduler: bool = option(
        False, action="store_true",
        flags=("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-opt-param-scheduler",
               "--use-checkpoint-lr-scheduler"),
        help="on resume, the checkpoint's schedule wins over this run's (Megatron-LM)")
    weight_decay: float = option(0.1, help="AdamW decay; biases and LayerNorm parameters are not decayed")
    # Megatron-LM's exception to that rule (megatron/core/optimizer/__init__.py, get_standard_config_overrides).
    apply_wd_to_qk_layernorm: bool = option(
        False, action="store_true",
        help="decay --qk-layernorm's query and key norms (gains and biases) too (Megatron-LM, Qwen3-Next)")
    clip_grad: float = option(1.0, help="global gradient-norm clip; 0 disables")
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    # Megatron-LM's --optimizer; ademamix is swiss-ai's Megatron-LM fork's AdEMAMix (megatron/core/optimizer/
    # ademamix.py), Adam with a second, slow momentum: zero/ademamix.py. Its knobs keep the fork's defaults
    # (megatron/training/arguments.py, _add_regularization_args: --ademamix-alpha 5, --ademamix-beta3 0.999, warmups
    # -1: none). No argparse choices: another value is refused with the launch's other problems (validate).
    optimizer: str = option("adam", type=optimizer_name,
                            help=f"one of {', '.join(OPTIMIZERS)}: adam is AdamW (decoupled weight decay; ALCF's "
                                 "adamw is the same); ademamix is swiss-ai's Megatron-LM fork's AdEMAMix (a third fp32 "
                                 "state: the slow momentum); muon is Megatron-LM's Muon for 2-D hidden weights, Adam "
                                 "for the rest; sophiag is ALCF's Megatron-DeepSpeed fork's Sophia-G")
    # ALCF's Sophia-G (zero/sophia.py), its flags and their defaults (argonne-lcf/Megatron-DeepSpeed megatron/arguments.py)
    sophiag_beta1: float = option(0.9, help="with --optimizer sophiag: the momentum's decay (ALCF's fork)")
    sophiag_beta2: float = option(0.95, help="with --optimizer sophiag: the Hessian estimate's decay (ALCF's fork)")
    sophiag_rho: float = option(0.01, help="with --optimizer sophiag: the clipping threshold rho (ALCF's fork)")
    # Megatron-LM's Muon (megatron/core/optimizer/emerging_optimizers.py, TensorParallelMuon; zero/muon.py): its
    # flags and their megatron/training/arguments.py defaults (momentum 0.9 there, 0.95 in OptimizerConfig).
    muon_momentum: float = option(0.9, help="with --optimizer muon: the momentum of Muon's internal SGD (Megatron-LM)")
    muon_nesterov: bool = option(False, action="store_true",
                                 help="with --optimizer muon: Nesterov-style momentum (Megatron-LM)")
    muon_split_qkv: bool = option(True, consts=(Const(("--muon-no-split-qkv",), False),),
                                  help="with --optimizer muon: orthogonalize the fused QKV weight's query, key and "
                                       "value blocks apart (Megatron-LM's default; --muon-no-split-qkv: whole)")
    muon_scale_mode: str = option("spectral", choices=MUON_SCALE_MODES,
                                  help="with --optimizer muon: the update's shape factor, spectral sqrt(max(out, in)),"
                                       " shape_scaling sqrt(max(1, out/in)) or unit_rms_norm sqrt(out/in)")
    muon_fp32_matmul_prec: str = option("medium", choices=MUON_MATMUL_PRECISIONS,
                                        help="with --optimizer muon: medium runs Newton-Schulz in bf16, as "
                                             "emerging_optimizers does; low and high in fp32 here")
    muon_coefficient_type: str = option("quintic", choices=MUON_COEFFICIENT_TYPES,
                                        help="with --optimizer muon: the Newton-Schulz coefficients")
    muon_num_ns_steps: int = option(5, help="with --optimizer muon: Newton-Schulz iterations")
    # duplicated is Megatron-LM main's default (d98e8a64); its core_v0.16.1 defaulted to blockwise
    muon_tp_mode: str = option("duplicated", choices=MUON_TP_MODES,
                               help="with --optimizer muon and TP > 1: Newton-Schulz of each TP shard alone, scaled "
                                    "by its shape (blockwise), of the whole matrix gathered over TP on every rank "
                                    "(duplicated), or over the shards with X X^T summed over TP (distributed)")
    muon_extra_scale_factor: float = option(1.0, help="with --optimizer muon: a further factor on the update")
    muon_scalar_optimizer: str = option("adam", help="with --optimizer muon: the optimizer of embeddings, the "
                                                     "output layer, biases and norms: adam (Megatron-LM's default)")
    ademamix_alpha: float = option(5.0, help="with --optimizer ademamix: the slow momentum's weight in the update "
                                             "(swiss-ai's fork)")
    ademamix_beta3: float = option(0.999, help="with --optimizer ademamix: the slow momentum's decay (swiss-ai's fork)")
    ademamix_beta3_warmup: int = option(-1, help="with --optimizer ademamix: steps over which beta3 rises from "
                                                 "--adam-beta1 to --ademamix-beta3 by half-life (swiss-ai's fork; "
                                                 "-1: none)")
    ademamix_alpha_warmup: int = option(-1, help="with --optimizer ademamix: steps over which alpha rises linearly "
                                                 "from 0 to --ademamix-alpha (swiss-ai's fork; -1: none)")
    # Megatron-LM's precision-aware optimizer (TransformerEngine's FusedAdam): the dtype the Adam moments are stored
    # in between steps, each update computed in fp32 (zero/precision_aware.py). Only with
    # --use-precision-aware-optimizer, as in Megatron-LM; fp16 and fp8 (scaled storage) are refused.
    exp_avg_dtype: str = option("fp32", choices=MOMENT_DTYPES,
                                help="with --use-precision-aware-optimizer: the stored Adam first moment, fp32 or "
                                     "bf16 (each update computed in fp32, rounded back; Megatron-LM)")
    exp_avg_sq_dtype: str = option("fp32", choices=MOMENT_DTYPES,
                                   help="with --use-precision-aware-optimizer: the stored Adam second moment, fp32 or "
                                        "bf16 (each update computed in fp32, rounded back; Megatron-LM)")

    def validate(self) -> None:
        self._validate_schedule()
        self._validate_optimizer()

    def _validate_schedule(self) -> None:
        """The learning rate's schedule: its decay, WSD's anneal, the rates, the warmup, whose a resume takes."""
        if self.lr_decay_style not in LR_DECAY_STYLES:
            raise ConfigError(f"--lr-decay-style {self.lr_decay_style!r} is not one of "
                              f"{', '.join(LR_DECAY_STYLES)}", flags=("--lr-decay-style",))
        if self.lr_decay_style == "WSD" and self.lr_wsd_decay_iters is None and self.lr_wsd_decay_samples is None:
            raise ConfigError("--lr-decay-style WSD needs the anneal's length: --lr-wsd-decay-iters (with "
                              "--train-iters) or --lr-wsd-decay-samples (with --train-samples)",
                              flags=("--lr-decay-style", "--lr-wsd-decay-iters", "--lr-wsd-decay-samples"))
        for name in ("lr_wsd_decay_iters", "lr_wsd_decay_samples"):
            # Megatron-LM takes a negative anneal silently and never anneals; 0 is no anneal (--lr to the decay's end)
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{_flag(name)} must be 0 or more (the anneal's length at the end of the decay), "
                                  f"got {value}", flags=(_flag(name),))
        if self.lr_wsd_decay_style not in LR_WSD_DECAY_STYLES:
            raise ConfigError(f"--lr-wsd-decay-style {self.lr_wsd_decay_style!r} is not one of "
                              f"{', '.join(LR_WSD_DECAY_STYLES)}", flags=("--lr-wsd-decay-style",))
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ConfigError(f"need 0 <= --min-lr ({self.min_lr}) <= --lr ({self.lr}) and --lr > 0",
                              flags=("--min-lr", "--lr"))
        if self.decoupled_lr is not None and (self.decoupled_lr < 0 or (self.decoupled_min_lr or 0.0) < 0):
            raise ConfigError(f"--decoupled-lr ({self.decoupled_lr}) and --decoupled-min-lr "
                              f"({self.decoupled_min_lr}) must be >= 0", flags=("--decoupled-lr", "--decoupled-min-lr"))
        for name in ("lr_warmup_iters", "lr_decay_iters", "lr_warmup_samples", "lr_decay_samples", "lr_warmup_tokens",
                     "lr_decay_tokens"):
            value = getattr(self, name)
            if value is not None and value < (0 if "warmup" in name else 1):
                raise ConfigError(f"{_flag(name)} must be at least {0 if 'warmup' in name else 1}, got {value}",
                                  flags=(_flag(name),))
        if not 0.0 <= self.lr_warmup_init <= self.lr:
            raise ConfigError(f"--lr-warmup-init must be in [0, --lr {self.lr}], got {self.lr_warmup_init}",
                              flags=("--lr-warmup-init", "--lr"))
        if self.override_opt_param_scheduler and self.use_checkpoint_opt_param_scheduler:
            raise ConfigError("give one of --override-opt_param-scheduler (this run's schedule) and "
                              "--use-checkpoint-opt_param-scheduler (the checkpoint's), not both",
                              flags=("--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"))
        if self.lr_warmup_fraction is not None and not 0.0 <= self.lr_warmup_fraction <= 1.0:
            raise ConfigError(f"--lr-warmup-fraction must be in [0, 1], got {self.lr_warmup_fraction}",
                              flags=("--lr-warmup-fraction",))

    def _validate_optimizer(self) -> None:
        """The optimizer's own settings: decay, clipping, betas, the choice of optimizer and each one's."""
        if self.weight_decay < 0 or self.clip_grad < 0 or self.adam_eps <= 0:
            raise ConfigError("--weight-decay and --clip-grad must be >= 0, --adam-eps > 0",
                              flags=("--weight-decay", "--clip-grad", "--adam-eps"))
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{_flag(name)} must be in [0, 1), got {getattr(self, name)}", flags=(_flag(name),))
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"--optimizer {self.optimizer} is not implemented: use one of {', '.join(OPTIMIZERS)} "
                              f"(adam is AdamW; ademamix is swiss-ai's Megatron-LM fork's AdEMAMix; muon is Megatron-LM's "
                              f"Muon; sophiag is ALCF's Megatron-DeepSpeed fork's Sophia-G)",
                              flags=("--optimizer",))
        # the fork's SophiaG.__init__ checks: betas in [0, 1), rho >= 0
        if not (0.0 <= self.sophiag_beta1 < 1.0 and 0.0 <= self.sophiag_beta2 < 1.0) or self.sophiag_rho < 0:
            raise ConfigError(f"--sophiag-beta1 and --sophiag-beta2 must be in [0, 1) and --sophiag-rho >= 0, got "
                              f"{self.sophiag_beta1}, {self.sophiag_beta2} and {self.sophiag_rho}",
                              flags=("--sophiag-beta1", "--sophiag-beta2", "--sophiag-rho"))
        if self.optimizer == "muon":
            self.validate_muon()
        # the fork's AdEMAMix.__init__ checks: beta3 in [0, 1), alpha >= 0
        if not 0.0 <= self.ademamix_beta3 < 1.0 or self.ademamix_alpha < 0:
            raise ConfigError(f"--ademamix-beta3 must be in [0, 1) and --ademamix-alpha >= 0, got "
                              f"{self.ademamix_beta3} and {self.ademamix_alpha}",
                              flags=("--ademamix-beta3", "--ademamix-alpha"))



    def validate_muon(self) -> None:
        """emerging_optimizers' checks (newton_schulz: a step count that fits the coefficient sets) and what is not
        built here: Lion as the scalar optimizer."""
        steps, kind = self.muon_num_ns_steps, self.muon_coefficient_type
        sets = {"quintic": 5, "aol": 4, "polar_express": 8, "simple": 1}[kind]
        if steps > MAX_NS_STEPS:  # every step is 3 matrix products a matrix: a typo would run for hours, or exhaust
            # memory building the coefficient list
            raise ConfigError(f"--muon-num-ns-steps {steps} is more than {MAX_NS_STEPS} Newton-Schulz iterations "
                              f"(Megatron-LM's default 5, polar_express 8)", flags=("--muon-num-ns-steps",))
        if steps < 1 or (kind == "polar_express" and steps < sets) or (kind in ("quintic", "aol") and steps % sets):
            raise ConfigError(f"--muon-num-ns-steps {steps} does not fit --muon-coefficient-type {kind} "
                              f"({'at least' if kind == 'polar_express' else 'a multiple of'} {sets})",
                              flags=("--muon-num-ns-steps", "--muon-coefficient-type"))
        if self.muon_scalar_optimizer != "adam":
            raise ConfigError(f"--muon-scalar-optimizer {self.muon_scalar_optimizer} is not implemented: adam "
                              f"(Megatron-LM's default)", flags=("--muon-scalar-optimizer",))
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ConfigError(f"--muon-momentum must be in [0, 1), got {self.muon_momentum}", flags=("--muon-momentum",))


@dataclass(frozen=True)
class TrainingConfig:
    micro_batch_size: int = option(16, aliases={"--batch-size": "DeepSpeed-Megatron"})
    global_batch_size: int = option(32, help="micro batch x gradient-accumulation steps x data-parallel size "
                                             "(set from --gradient-accumulation-steps when that is given)")
    # When set, it determines the global batch instead of --global-batch-size, unless both are given
    # explicitly; see arguments/batch_schedule.py.
    accumulation_steps: Optional[int] = option(
        None, flags=("--gradient-accumulation-steps",),
        help="micro batches per rank per iteration; when given, it determines the global batch "
             "(default: --global-batch-size / (micro batch x data-parallel size))",
        aliases={"--gas": "DeepSpeedExamples' Megatron 3D"})
    # The ramp itself: arguments/batch_schedule.py.
    rampup_batch_size: Optional[list[int]] = option(
        None, nargs=3, type=count, metavar=("START", "INCREMENT", "SAMPLES"),
        help="grow the global batch from START by INCREMENT, evenly over the first SAMPLES samples, to "
             "--global-batch-size (Megatron-LM)")
    step_batch_size_schedule: Optional[str] = option(
        None, type=str, metavar="'THRESHOLD:BATCH ...'",
        help="the global batch in steps: from each THRESHOLD tokens consumed (suffixes K, M, B, T), BATCH; the "
             "first threshold is 0 and the last batch is the run's global batch (Megatron-LM's main branch, "
             "which deprecates --rampup-batch-size; arguments/step_batch_schedule.py)")
    train_iters: Optional[int] = 250  # None with --train-samples: derived as Megatron does (arguments/schedule.py)
    train_samples: Optional[int] = option(
        None, type=count, help="train for this many samples instead of --train-iters (Megatron-LM; the iterations "
                               "are derived as Megatron derives them, a batch ramp included)")
    train_tokens: Optional[int] = option(None, type=count, help="also stop once this many tokens are consumed "
                                                                "(Megatron-DeepSpeed)")
    seed: int = 1234
    # Megatron-LM's _set_random_seed (megatron/training/initialize.py): `seed = seed + 10 * dp_rank` under it, after
    # the pipeline rank's 100 x; the weights stay --seed's (Megatron broadcasts DP rank 0's), as here always.
    # Megatron-LM's --calculate-per-token-loss (training/per_token_loss.py)
    calculate_per_token_loss: bool = option(
        False, help="the iteration's loss is its (masked) per-token losses' sum over their count across DP x CP, "
                    "as Megatron-LM; without it each micro-batch's (masked) mean, averaged")
    data_parallel_random_init: bool = option(
        False, help="each data-parallel rank's random streams (dropout, the experts' random routing) from --seed + 10 "
                    "x its DP rank, as Megatron-LM; the weights stay --seed's")
    # Mixed precision: bf16 or fp16 parameters and gradients, fp32 master weights and Adam states.
    bf16: bool = option(False, group="zero",
                        help="bf16 mixed precision: bf16 parameters and gradients, fp32 master weights and Adam "
                             "states in the ZeRO optimizer")
    fp16: bool = option(False, group="zero",
                        help="fp16 mixed precision: fp16 parameters and gradients, fp32 master weights and Adam "
                             "states in the ZeRO optimizer, with dynamic loss scaling (or --loss-scale)")
    loss_scale: Optional[float] = option(None, group="zero", help="fp16: a static loss scale (None: dynamic scaling)")
    initial_loss_scale: float = option(2.0**16, group="zero", help="fp16: where dynamic loss scaling starts")
    loss_scale_window: int = option(1000, group="zero",
                                    help="fp16: overflow-free steps before the loss scale doubles")
    hysteresis: int = option(2, group="zero", help="fp16: overflows tolerated before the loss scale is lowered")
    min_loss_scale: float = option(1.0, group="zero", help="fp16: dynamic loss scaling never goes below this",
                                   aliases={"--min-scale": "DeepSpeedExamples' Megatron"})
    # From 2**32, halving on every overflow reaches 1 in 32 + hysteresis steps, so 100 leaves room for any
    # honest start: a run that skips that many in a row found no scale at which the gradients are finite.
    max_consecutive_skipped_iterations: int = option(
        100, group="zero",
        help="fp16: stop as diverged after this many overflow-skipped steps in a row (0: no limit)")
    # None means the default for the precision: on for bf16 (as Megatron and DeepSpeed do), off for fp16
    # (the paper's 16-bit gradients). --grad-reduce-in-bf16 is a SPELLING (arguments/megatron/flags.py).
    accumulate_allreduce_grads_in_fp32: Optional[bool] = option(
        None, group="zero",
        help="accumulate and reduce gradients in fp32 (Megatron's flag; default: on with --bf16, off with --fp16, "
             "whose gradients stay 16-bit as in the ZeRO paper)",
        aliases={"--fp32-allreduce": "DeepSpeedExamples' Megatron"})
    device: str = option("auto", help="auto (CUDA if present, else CPU), cpu, cuda, cuda:N")
    dry_run: bool = option(False, action="store_true",
                           help="print what this rank would hold and send (python -m zero.plan dry-run) and exit")
    # gpt.model.compile_blocks
    compile: bool = option(False, help="torch.compile each transformer block (the first iterations compile; every "
                                       "TP size and ZeRO stage)")
    # Megatron-LM's CUDA graph flags (arguments/cuda_graphs.py; what is captured: training/cuda_graphs.py)
    cuda_graph_impl: str = option(
        "none", choices=CUDA_GRAPH_IMPLS,
        help="local: each transformer block's forward and backward captured as CUDA graphs after the first iteration, "
             "replayed every micro-batch after (Megatron-Core's local implementation); transformer_engine: the same "
             "graphs, captured after --cuda-graph-warmup-steps iterations as Megatron-LM's Transformer Engine path "
             "does; full_iteration: accepted, the whole-iteration graph is not built (the blocks run eagerly); a CPU "
             "captures nothing")
    cuda_graph_modules: list[str] = option(
        default_factory=list, nargs="+", choices=MODULE_CHOICES,
        help="what of each layer is captured: empty, the whole layer; attn its attention half, mlp a dense layer's "
             "MLP half (Megatron-LM's CudaGraphModule); moe, moe_router, moe_preprocess and mamba are accepted and "
             "not captured here (said at the start)")
    cuda_graph_warmup_steps: int = option(
        3, help="local: warm-up passes of each graph before its capture; transformer_engine: eager iterations before "
                "the capture (Megatron-LM's meaning under each)")
    # A dead or hung rank ends the job after this.
    distributed_timeout_minutes: float = option(
        10.0, group="checkpoint",
        help="how long a collective waits for a peer before the job fails (a dead rank)")
    # llm-jp's Megatron-LM fork: parse_args (megatron/training/arguments.py) copies OpenMPI's
    # OMPI_COMM_WORLD_RANK, _LOCAL_RANK and _SIZE into RANK, LOCAL_RANK and WORLD_SIZE (parallel/launch_environment.py).
    use_mpi: bool = option(
        False, action="store_true", group="checkpoint",
        help="take this process's rank, local rank and world size from OpenMPI's mpirun (OMPI_COMM_WORLD_RANK, "
             "_LOCAL_RANK, _SIZE; MASTER_ADDR and MASTER_PORT as the launch script exports them), as llm-jp's "
             "Megatron-LM fork does")
    # The watch: rendezvous/liveness.py.
    heartbeat_timeout_seconds: float = option(
        120.0, group="checkpoint",
        help="stop, naming the rank, when a peer's heartbeat stands still this long (a stopped or hung rank), "
             "instead of waiting for --distributed-timeout-minutes; 0: no watch")
    # A hang traced to its collective (rendezvous/flight_recorder.py): Megatron-LM's --flight-recorder-* flags, which
    # export PyTorch's Flight Recorder variables (megatron/training/initialize.py, _initialize_distributed); the
    # same ring is kept here for every backend, gloo included, and dumped when the heartbeat watch or a failed
    # collective ends the run. Defaults as Megatron's.
    flight_recorder_dump_path: Optional[str] = option(
        None, group="checkpoint", metavar="PATH",
        help="keep a ring of each rank's last collectives and, when a rank hangs or dies, write every live rank's "
             "ring and thread stacks here (a directory: <dir>/_dump_<rank>.json; else a file prefix) and name in "
             "one line where each group's ranks disagree; python -m rendezvous.flight_recorder PATH re-reads them")
    flight_recorder_trace_buffer_size: int = option(
        2000, group="checkpoint", help="collectives kept in each rank's ring (TORCH_NCCL_TRACE_BUFFER_SIZE)")
    flight_recorder_dump_on_timeout: bool = option(
        True, group="checkpoint", action="store_true",
        consts=(Const(("--no-flight-recorder-dump-on-timeout", "--disable-flight-recorder-dump-on-timeout"), False),),
        help="write the dumps when a hang or a lost rank is found (TORCH_NCCL_DUMP_ON_TIMEOUT)")
    flight_recorder_include_stack_trace: bool = option(
        False, group="checkpoint", action="store_true",
        help="TORCH_INCLUDE_STACK_TRACE for NCCL's own recorder; this ring always names each collective's call "
             "site, and a dump always holds every thread's stack")
    flight_recorder_include_only_active: bool = option(
        True, group="checkpoint", action="store_true",
        consts=(Const(("--no-flight-recorder-include-only-active", "--disable-flight-recorder-include-only-active"),
                      False),),
        help="a dump lists only the collectives not completed (each group's last completed one is always named)")
    flight_recorder_extra_dump_on_exec: bool = option(
        True, group="checkpoint", action="store_true",
        consts=(Const(("--no-flight-recorder-extra-dump-on-exec", "--disable-flight-recorder-extra-dump-on-exec"),
                      False),),
        help="also dump when a rank fails on an error of its own (TORCH_NCCL_EXTRA_DUMP_ON_EXEC)")
    # Megatron-LM's fault tolerance flags (megatron/training/ft_integration.py): resilience/fault_tolerance.py.
    enable_ft_package: bool = option(
        False, action="store_true", group="checkpoint",
        help="fault tolerance sections (setup, step, checkpointing) with timeouts from the launcher (scripts/launch.py "
             "--ft-rank-section-timeouts) or learned (--calc-ft-timeouts): a rank past one is ended by its monitor and "
             "the launcher's --max-restarts restarts the job from the latest checkpoint; needs --save")
    calc_ft_timeouts: bool = option(
        False, action="store_true", group="checkpoint",
        help="with --enable-ft-package: learn the section timeouts from this run's times (5 x the longest, after "
             "each save and at the end), kept in --save's ft_state.json for the next start")
    ft_num_warmup_iters: int = option(
        5, group="checkpoint",
        help="with --enable-ft-package: training iterations of each start outside the step section and the "
             "out-of-section watch (the first ones are slow)")
    # Megatron-LM's in-process restart (megatron/training/inprocess_restart.py, _add_inprocess_restart_args in
    # arguments.py; nvidia-resiliency-ext's inprocess.Wrapper): resilience/inprocess_restart.py. The flags of what is
    # not built here (the progress timeouts, the monitor process) stay accepted with no effect
    # (arguments/megatron/flag_classes.py).
    inprocess_restart: bool = option(
        False, action="store_true", group="checkpoint",
        help="on an error or a dead rank the processes stay: each aborts its process groups, the survivors agree on "
             "a new incarnation (a spare in a dead rank's place), re-form the groups and resume from the latest "
             "checkpoint (--load = --save) in the same process")
    inprocess_max_iterations: Optional[int] = option(
        None, group="checkpoint",
        help="with --inprocess-restart: the most incarnations (the first run and its restarts); 10 when not given "
             "(Megatron-LM hands nvidia-resiliency-ext no bound, so a fault met at every restart restarts for ever)")
    inprocess_heartbeat_interval: float = option(
        30.0, group="checkpoint", help="with --inprocess-restart: seconds between a process's heartbeats")
    inprocess_heartbeat_timeout: float = option(
        60.0, group="checkpoint",
        help="with --inprocess-restart: a process whose heartbeat stood still this long is taken as dead at a restart")
    inprocess_barrier_timeout: float = option(
        120.0, group="checkpoint",
        help="with --inprocess-restart: the most seconds the survivors wait for each other at a restart")
    inprocess_completion_timeout: float = option(
        120.0, group="checkpoint",
        help="with --inprocess-restart: the most seconds the launch rank 0, which hosts the restart store, waits at "
             "the end for every process to finish")
    inprocess_active_world_size: Optional[int] = option(
        None, group="checkpoint",
        help="with --inprocess-restart: the processes that train (the first N launch ranks); the others wait as hot "
             "spares and take a dead rank's place (Megatron's default: every process, WORLD_SIZE)")
    inprocess_granularity: str = option(
        "node", group="checkpoint", choices=("node", "rank"),
        help="with --inprocess-restart: what a fault takes out (Megatron's default node: every rank of the host, "
             "which on a host without CUDA devices is each rank alone; rank: the rank alone)")
    # Megatron-Core's rerun state machine (megatron/core/rerun_state_machine.py; the flags are Megatron-LM's
    # _add_rerun_machine_args and --no-check-for-nan-in-loss-and-grad): resilience/rerun_state.py. Megatron's default
    # mode, validate_results, is a Megatron launch's (the model set by flags: arguments/megatron/defaults.py); a
    # preset's is disabled, where a NaN loss stops the run after the step (its line names validate_results).
    rerun_mode: str = option(
        "disabled", group="checkpoint", choices=("disabled", "validate_results", "report_stats"),
        help="validate_results: a NaN/Inf loss (or a spike, --check-for-spiky-loss) re-runs the iteration on the same "
             "data and RNG state; not reproduced: exit 17 (a spike: logged and on); reproduced: checkpoint (with "
             "--save) and exit 16, and the job resumed from it re-runs it again to decide (Megatron's default, a "
             "Megatron launch's; a preset's is disabled). report_stats: every iteration runs twice and how much the "
             "validated losses differ is printed every 2 iterations")
    check_for_nan_in_loss_and_grad: bool = option(
        True, group="checkpoint", action="store_true",
        consts=(Const(("--no-check-for-nan-in-loss-and-grad",), False),),
        help="with --rerun-mode validate_results: validate each micro-batch's loss against NaN and Inf")
    check_for_spiky_loss: bool = option(
        False, group="checkpoint", action="store_true",
        help="with --rerun-mode validate_results: a micro-batch loss 10x the largest of the first 100 re-runs the "
             "iteration (not fatal: training goes on)")
    error_injection_rate: int = option(
        0, group="checkpoint",
        help="with --rerun-mode validate_results: reject one validated loss in this many (per rank), to test the "
             "re-run; 0 or less injects nothing (Megatron-Core injects only where the rate is > 0)")
    error_injection_type: str = option(
        "transient_error", group="checkpoint", choices=("correct_result", "transient_error", "persistent_error"),
        help="what an injected rejection acts as: transient_error (the re-run differs: on), persistent_error and "
             "correct_result (the re-run reproduces it: checkpoint and exit 16)")
    result_rejected_tracker_filename: Optional[str] = option(
        None, group="checkpoint", metavar="FILE",
        help="append one line per rejected result and re-run verdict (Megatron's format) to FILE")
    eval_interval: int = 50
    eval_iters: int = option(10, help="batches per evaluation; 0 or less: no validation or test (as Megatron-LM)")
    # Megatron-LM's --skip-train (megatron/training/training.py pretrain @ d98e8a64: no train(), then the valid and
    # test evaluations at the loaded iteration): training/loop.py
    skip_train: bool = option(False, action="store_true",
                              help="train nothing: evaluate the model (--load's, or the initial one) on the valid "
                                   "and test splits, --eval-iters batches each")
    log_interval: int = 10
    # Megatron-Core's fault injector (megatron/core/fault_injector.py, FaultInjectorConfig: every field None by
    # default, injection on when ranks or num-ranks is given); rendezvous/fault_injector.py, resilience/fault_injection.py.
    fault_injector_ranks: Optional[str] = option(
        None, group="checkpoint", metavar="R[,R...]", help="fault injector: inject on these ranks")
    fault_injector_num_ranks: Optional[int] = option(
        None, group="checkpoint", help="fault injector: inject on this many ranks drawn from ranks 1..N-1")
    fault_injector_fault_types: Optional[str] = option(
        None, group="checkpoint", metavar="TYPE[,TYPE...]",
        help="fault injector: nvidia-resiliency-ext's fault types to draw one from (workload_exc, async_exc, "
             "signal_exc, os_abort, lock_gil, segfault, sigint, sigkill, sigterm, sigstop; gpu_error, gpu_sleep "
             "on CUDA)")
    fault_injector_fault_probabilities: Optional[str] = option(
        None, group="checkpoint", metavar="P[,P...]", help="fault injector: each fault type's weight (normalized)")
    fault_injector_fault_delay: Optional[float] = option(
        None, group="checkpoint",
        help="fault injector: seconds from the start of training (or --fault-injector-delay-start-iteration) to the "
             "fault")
    fault_injector_delay_start_iteration: Optional[int] = option(
        None, group="checkpoint",
        help="fault injector: start the delay after the step at which Megatron's 0-based iteration count is N (the "
             "step logged as iteration N+1)")
    fault_injector_mtti_seconds: Optional[float] = option(
        None, group="checkpoint", help="fault injector: mean time to inject, the delay drawn exponentially when "
                                       "--fault-injector-fault-delay is not given")
    fault_injector_offset_seconds: Optional[float] = option(
        None, group="checkpoint", help="fault injector: seconds added to the drawn delay")
    fault_injector_seed: Optional[int] = option(None, group="checkpoint", help="fault injector: its RNG's seed")

    @property
    def fault_injector(self) -> FaultInjectorSettings:
        return FaultInjectorSettings(
            self.fault_injector_ranks, self.fault_injector_num_ranks, self.fault_injector_fault_types,
            self.fault_injector_fault_probabilities, self.fault_injector_fault_delay,
            self.fault_injector_delay_start_iteration, self.fault_injector_mtti_seconds,
            self.fault_injector_offset_seconds, self.fault_injector_seed)

    @property
    def eval_batches(self) -> int:
        """Batches per evaluation. Megatron-LM parses --eval-iters with no bound and evaluates only where it is
        positive (core_v0.16.1 megatron/training/training.py build_train_valid_test_data_loaders: `do_valid` and
        `do_test` need `args.eval_iters > 0`), so -1, which launch scripts pass, is no evaluation: none here too."""
        return max(self.eval_iters, 0)

    @property
    def precision(self) -> str:
        """The training precision: "fp32", "bf16" or "fp16"."""
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"

    @property
    def gradient_precision(self) -> str:
        """What gradients are accumulated and reduced in: "fp32", or the training precision."""
        fp32 = self.accumulate_allreduce_grads_in_fp32
        if fp32 is None:
            fp32 = self.precision == "bf16"
        return "fp32" if fp32 else self.precision

    def validate(self) -> None:
        self._validate_length_and_batch()
        self._validate_watch_and_faults()
        self._validate_precision()

    def _validate_length_and_batch(self) -> None:
        """How long to train and the batches: lengths, sizes, intervals, the ramp."""
        for name in ("train_iters", "train_samples", "train_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        if self.train_iters is None and self.train_samples is None:
            raise ConfigError("give --train-iters or --train-samples (how long to train)",
                              flags=("--train-iters", "--train-samples"))
        for name in ("micro_batch_size", "global_batch_size", "eval_interval", "log_interval", "loss_scale_window",
                     "hysteresis"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {getattr(self, name)}", flags=(_flag(name),))
        if self.accumulation_steps is not None and self.accumulation_steps < 1:
            raise ConfigError(f"{_flag('accumulation_steps')} must be at least 1, got {self.accumulation_steps}",
                              flags=(_flag("accumulation_steps"),))
        if self.rampup_batch_size is not None:
            check_rampup(self.rampup_batch_size, self.global_batch_size)
            if self.accumulation_steps is not None:
                raise ConfigError("--rampup-batch-size sets the accumulation steps of each iteration; drop "
                                  "--gradient-accumulation-steps (the ramp ends at --global-batch-size)",
                                  flags=("--rampup-batch-size", "--gradient-accumulation-steps", "--global-batch-size"))

    def _validate_watch_and_faults(self) -> None:
        """The timeouts, the flight recorder, in-process restarts, the fault injector, the seed and the device."""
        if not self.distributed_timeout_minutes > 0:
            raise ConfigError(f"--distributed-timeout-minutes must be positive, got {self.distributed_timeout_minutes}",
                              flags=("--distributed-timeout-minutes",))
        if not (self.heartbeat_timeout_seconds == 0 or MIN_HEARTBEAT_TIMEOUT_S <= self.heartbeat_timeout_seconds
                and is_wait(self.heartbeat_timeout_seconds)):
            raise ConfigError(f"--heartbeat-timeout-seconds must be 0 (no watch) or a number of seconds from "
                              f"{MIN_HEARTBEAT_TIMEOUT_S:g} (a few heartbeats, one a second) up to {LONGEST_WAIT_TEXT}, "
                              f"got {self.heartbeat_timeout_seconds}", flags=("--heartbeat-timeout-seconds",))
        if self.flight_recorder_trace_buffer_size < 0:
            raise ConfigError(f"--flight-recorder-trace-buffer-size must be 0 (no ring) or more, got "
                              f"{self.flight_recorder_trace_buffer_size}", flags=("--flight-recorder-trace-buffer-size",))
        check_inprocess_settings(self)
        start = self.fault_injector_delay_start_iteration
        if self.fault_injector.enabled and start is not None and self.train_iters is not None \
                and start >= self.train_iters:
            raise ConfigError(f"--fault-injector-delay-start-iteration {start}: Megatron's 0-based iteration count "
                              f"never reaches it in --train-iters {self.train_iters} (its last is "
                              f"{self.train_iters - 1}), so the injector would never fire",
                              flags=("--fault-injector-delay-start-iteration", "--train-iters"))
        if self.ft_num_warmup_iters < 0:
            raise ConfigError(f"--ft-num-warmup-iters must be 0 or more, got {self.ft_num_warmup_iters}",
                              flags=("--ft-num-warmup-iters",))
        check_seed(self.seed)
        check_device_name(self.device)
        self.fault_injector.check(cuda=self.device.startswith("cuda") or (self.device == "auto" and
                                                                          torch.cuda.is_available()))

    def _validate_precision(self) -> None:
        """16-bit training and its loss scaler."""
        if self.fp16 and self.bf16:
            raise ConfigError("--fp16 and --bf16 are exclusive: choose one (add --no-fp16 or --no-bf16 to "
                              "override a preset or --zero-config)", flags=("--fp16", "--bf16"))
        if self.max_consecutive_skipped_iterations < 0:
            raise ConfigError(f"{_flag('max_consecutive_skipped_iterations')} must be 0 (no limit) or more, got "
                              f"{self.max_consecutive_skipped_iterations}",
                              flags=(_flag("max_consecutive_skipped_iterations"),))
        for name in ("loss_scale", "initial_loss_scale", "min_loss_scale"):
            value = getattr(self, name)
            if value is not None and not 0 < value < float("inf"):
                raise ConfigError(f"{_flag(name)} must be a positive number, got {value}", flags=(_flag(name),))
        if self.min_loss_scale > self.initial_loss_scale:
            raise ConfigError(f"--min-loss-scale {self.min_loss_scale} is larger than --initial-loss-scale "
                              f"{self.initial_loss_scale}; lower the former or raise the latter",
                              flags=("--min-loss-scale", "--initial-loss-scale"))



def check_inprocess_settings(training: "TrainingConfig") -> None:
    """The --inprocess-* values Megatron-LM would hand nvidia-resiliency-ext's Wrapper, which rejects a
    non-positive interval or timeout and a restart bound below one incarnation."""
    for name in ("inprocess_heartbeat_interval", "inprocess_heartbeat_timeout", "inprocess_barrier_timeout",
                 "inprocess_completion_timeout"):
        value = getattr(training, name)
        if not is_wait(value, zero_allowed=False):
            raise ConfigError(f"{_flag(name)} must be a number of seconds above 0 up to {LONGEST_WAIT_TEXT}, got "
                              f"{value}", flags=(_flag(name),))
    if training.inprocess_heartbeat_timeout <= training.inprocess_heartbeat_interval:
        raise ConfigError(f"--inprocess-heartbeat-timeout ({training.inprocess_heartbeat_timeout:g} s) must be longer "
                          f"than --inprocess-heartbeat-interval ({training.inprocess_heartbeat_interval:g} s): a live "
                          "process would be taken as dead between two beats",
                          flags=("--inprocess-heartbeat-timeout", "--inprocess-heartbeat-interval"))
    for name in ("inprocess_max_iterations", "inprocess_active_world_size"):
        value = getattr(training, name)
        if value is not None and value < 1:
            raise ConfigError(f"{_flag(name)} must be at least 1, got {value}", flags=(_flag(name),))


def check_rampup(ramp: list[int], global_batch_size: int) -> None:
    """Megatron's rules for --rampup-batch-size START INCREMENT SAMPLES, which need no grid to check."""
    if len(ramp) != 3:
        raise ConfigError(f"--rampup-batch-size takes three numbers, START INCREMENT SAMPLES; got {len(ramp)}",
                          flags=("--rampup-batch-size",))
    start, increment, samples = ramp
    if start < 1 or increment < 1 or samples < 0:
        raise ConfigError(f"--rampup-batch-size {start} {increment} {samples}: START and INCREMENT must be at least "
                          f"1 and SAMPLES at least 0", flags=("--rampup-batch-size",))
    if start > global_batch_size or (global_batch_size - start) % increment != 0:
        raise ConfigError(f"--rampup-batch-size {start} {increment} {samples}: the ramp must reach --global-batch-size "
                          f"{global_batch_size} from {start} in steps of {increment}",
                          flags=("--rampup-batch-size", "--global-batch-size"))


# The flags that name the tokenizer
TOKENIZER_FLAGS = ("--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file")
# The flags that name the data (data/per_split.py)
DATA_SOURCE_FLAGS = ("--data-path", "--data-args-path", *SPLIT_FLAGS, "--per-split-data-args-path", "--mock-data",
                     "--data-file-list")


def _flags_named(message: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """The flags of `flags` that `message` names (a flag followed by a space, a comma, a colon or its end)."""
    return tuple(flag for flag in flags if re.search(re.escape(flag) + r"(?![\w-])", message))


@dataclass(frozen=True)
class DataConfig:
    # Megatron's form: one prefix ("path/to/x_text_document"), or "weight prefix weight prefix ...".
    # Empty means the embedded default corpus (CPython's pydoc topics).
    data_path: list[str] = option(default_factory=list, nargs="+",
                                  help="a dataset prefix, or 'weight prefix weight prefix ...' to blend; "
                                       "omit to train on the embedded corpus",
                                  aliases={"--train-data": "DeepSpeed-Megatron"})
    split: str = option("969,30,1", help="train,valid,test ratio of documents")
    # data/per_split.py: Megatron-LM's other ways to name the data (get_blend_and_blend_per_split)
    data_args_path: Optional[str] = option(None, help="a file holding the --data-path list (prefixes, or weight/prefix "
                                                      "pairs, whitespace-separated), for lists too long to type")
    train_data_path: Optional[list[str]] = option(
        None, nargs="*", help="the training blend (a prefix, prefixes, or weight/prefix pairs, as --data-path), read "
                              "whole: no --split")
    valid_data_path: Optional[list[str]] = option(None, nargs="*", help="the validation blend, as --train-data-path "
                                                                        "(none: no validation)")
    test_data_path: Optional[list[str]] = option(None, nargs="*", help="the test blend, as --train-data-path (none: "
                                                                       "no test)")
    per_split_data_args_path: Optional[str] = option(
        None, help="a JSON file whose train, valid and test keys hold the per-split blends (a list, a string, or null)")
    # data/corpus_list.py: ALCF's Megatron-DeepSpeed fork's list of weighted prefixes by corpus
    data_file_list: Optional[str] = option(
        None, help="ALCF's fork: a file of 'weight prefix corpus' lines; each corpus's prefixes make one dataset, the "
                   "corpora blended by their samples, every prefix split by --split")
    shuffle_sample_in_corpus: bool = option(False, action="store_true",
                                            help="with --data-file-list: each corpus's samples read in a shuffled "
                                                 "order (ALCF's fork)")
    blend_sample_in_corpus: bool = option(False, action="store_true",
                                          help="with --data-file-list: each corpus's prefixes interleaved by their "
                                               "samples, not one after the other (ALCF's fork)")
    data_cache_dir: Optional[str] = option(None, help="where the embedded corpus and index caches go (default "
                                                      "~/.cache/zero-gpt)",
                                           aliases={"--data-cache-path": "Megatron-LM"})
    num_workers: int = option(0, help="data-loader worker processes")
    # data/sampler.py CyclicSampler: Megatron-LM's MegatronPretrainingRandomSampler
    dataloader_type: str = option(SINGLE, choices=DATALOADER_TYPES,
                                  help="single: each rank its slice of every global batch, in the dataset's order; "
                                       "cyclic: Megatron-LM's random sampler, a torch.randperm seeded with the epoch "
                                       "number, epoch after epoch")
    data_sharding: bool = option(True, help="with --dataloader-type cyclic, each data-parallel rank permutes its own "
                                            "contiguous bucket of the samples (Megatron-LM's default); "
                                            "--no-data-sharding: the whole dataset permuted, each rank taking every "
                                            "data-parallel-size-th index")
    # data/documents.py: Megatron-LM's get_ltor_masks_and_position_ids, from the tokenizer's end-of-document id
    reset_position_ids: bool = option(False, help="learned positions restart at 0 after each end-of-document token "
                                                  "(rotary positions do not, as in Megatron-LM)")
    reset_attention_mask: bool = option(False, help="a token attends only to its own document (block-diagonal "
                                                    "causal attention, split after each end-of-document token)")
    eod_mask_loss: bool = option(False, help="no loss where the input token is the end-of-document token (its "
                                             "prediction of the next document's first token)")
    # data/documents.py goldfish_kept: swiss-ai's Megatron-LM fork's goldfish loss (gpt_dataset.py apply_goldfish)
    goldfish_loss: bool = option(False, help="swiss-ai's goldfish loss: no loss on a token when the hash of the "
                                             "--goldfish-h labels ending at it falls below 1 / --goldfish-k")
    goldfish_k: int = option(50, help="with --goldfish-loss: about 1 in this many tokens gets no loss")
    goldfish_h: int = option(50, help="with --goldfish-loss: how many labels (the token's own and those before it) "
                                      "the hash reads")
    # data/mock.py
    mock_data: bool = option(False, help="train on Megatron's MockGPTDataset documents (token ids 1, 2, ... of "
                                         "random lengths, each ending in the end-of-document id) instead of data")
    # data/fim.py: Megatron-LM's GPTFIMDataset (megatron/training/datasets/fim_dataset.py)
    fim_data: bool = option(False, help="fill-in-the-middle samples, as Megatron-LM's GPTFIMDataset: each piece "
                                        "between end-of-document tokens is, with probability --fim-rate, cut into "
                                        "prefix, middle and suffix and put in SPM or PSM order")
    fim_rate: float = option(0.5, help="with --fim-data: probability that a piece becomes a FIM example")
    fim_spm_rate: float = option(0.5, help="with --fim-data: probability that a FIM example is SPM, not PSM")
    fim_split_sample: Optional[str] = option(None, help="with --fim-data: a token that splits pieces into "
                                                       "fragments, each permuted with --fim-fragment-rate")
    fim_fragment_rate: Optional[float] = option(None, help="with --fim-split-sample: each fragment's FIM rate")
    fim_no_prefix: Optional[str] = option(None, help="with --fim-data: a piece whose text starts with this is "
                                                    "left as it is")
    fim_prefix_token: str = option("<fim_prefix>", help="FIM prefix token (a token the vocabulary lacks is its "
                                                        "unknown token: <|endoftext|> for GPT-2's files)")
    fim_middle_token: str = option("<fim_middle>", help="FIM middle token")
    fim_suffix_token: str = option("<fim_suffix>", help="FIM suffix token")
    fim_pad_token: str = option("<fim_pad>", help="FIM pad token (fills a sample a permutation shortened)")
    fim_eod_token: str = option("<|endoftext|>", help="FIM end-of-document token: pieces are cut at it")
    # None infers it from the files given (none: the embedded corpus's).
    tokenizer_type: Optional[str] = option(
        None, type=tokenizer_type_name, choices=(*TOKENIZER_TYPES, *OTHER_TOKENIZER_TYPES),
        help="Megatron-LM's: GPT2BPETokenizer (--vocab-file, --merge-file), HuggingFaceTokenizer (--tokenizer-model; "
             "BigScience's PretrainedFromHF), NullTokenizer (--vocab-size; data tokenized elsewhere), "
             "GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer (--tokenizer-model: a SentencePiece "
             ".model); Megatron's other types are refused with what to use; default: from the files given")
    tokenizer_file: Optional[str] = option(
        None, help="a tokenizers tokenizer.json (or, as --tokenizer-model, a folder holding one, or a SentencePiece "
                   "type's .model file); without --data-path "
                   "the embedded corpus is tokenized with it",
        aliases={"--tokenizer-model": "Megatron-LM", "--tokenizer-name-or-path": "BigScience's Megatron-DeepSpeed"})
    vocab_file: Optional[str] = option(None, flags=("--vocab-file", "--tokenizer-vocab-file"),
                                       help="GPT-2 style vocab.json (with --merge-file)")
    merge_file: Optional[str] = option(None, flags=("--merge-file", "--tokenizer-merge-file"),
                                       help="GPT-2 style merges.txt (with --vocab-file)")
    # Used only without --data-path.
    tokenizer_vocab_size: int = option(4096, help="vocabulary of the BPE trained on the embedded corpus")

    def sources(self) -> DataSources:
        """What the run reads: one blend split by --split, or one blend per split (data/per_split.py), the
        --data-args-path and --per-split-data-args-path files read; DataError in one line as Megatron-LM refuses."""
        return data_sources(self.data_path, self.data_args_path,
                            (self.train_data_path, self.valid_data_path, self.test_data_path),
                            self.per_split_data_args_path, self.mock_data, self.data_file_list)

    @property
    def user_data(self) -> bool:
        """The user names data (--data-path, a per-split blend, or their files): not the embedded corpus."""
        return bool(self.data_path or self.data_args_path or self.per_split_data_args_path or self.data_file_list
                    or any(paths is not None for paths in (self.train_data_path, self.valid_data_path,
                                                           self.test_data_path)))

    def validate(self) -> None:
        # The data files are opened later; their flags' syntax (and the list files) are read now, before any work.
        try:
            parse_split(self.split)
        except DataError as error:
            raise ConfigError(str(error), flags=("--split",)) from None
        try:
            self.sources()
        except DataError as error:
            raise ConfigError(str(error), flags=_flags_named(str(error), DATA_SOURCE_FLAGS)) from None
        self._validate_tokenizer()
        if self.fim_data:
            self._validate_fim()
        if self.num_workers < 0:  # torch's DataLoader refuses it (as it does in Megatron-LM)
            raise ConfigError(f"--num-workers must be at least 0, got {self.num_workers}", flags=("--num-workers",))
        if self.tokenizer_vocab_size < 300:
            raise ConfigError(f"--tokenizer-vocab-size must be at least 300, got {self.tokenizer_vocab_size}",
                              flags=("--tokenizer-vocab-size",))

    def _validate_tokenizer(self) -> None:
        """The tokenizer's type and files, and what --data-path needs of them."""
        problem = tokenizer_type_problem(self.tokenizer_type, self.tokenizer_file, self.vocab_file)
        if problem:  # an unknown type is the flag's own fault; a known one's, its missing files' too
            flags = _flags_named(problem, TOKENIZER_FLAGS) if self.tokenizer_type in TOKENIZER_TYPES else \
                ("--tokenizer-type",)
            raise ConfigError(problem, flags=flags)
        if self.tokenizer_type == "NullTokenizer":
            if self.tokenizer_file or self.vocab_file or self.merge_file:
                raise ConfigError("--tokenizer-type NullTokenizer reads token ids as they are: drop --tokenizer-file, "
                                  "--vocab-file and --merge-file",
                                  flags=("--tokenizer-type", "--tokenizer-file", "--vocab-file", "--merge-file"))
            if not self.user_data and not self.mock_data:
                raise ConfigError("--tokenizer-type NullTokenizer needs --data-path (data tokenized elsewhere) or "
                                  "--mock-data; the "
                                  "embedded corpus is text and needs a real tokenizer",
                                  flags=("--tokenizer-type", "--data-path", "--mock-data"))
        elif self.user_data and not (self.tokenizer_file or self.vocab_file):
            raise ConfigError("--data-path needs the tokenizer it was prepared with: pass --tokenizer-file "
                              "(--tokenizer-model), --vocab-file and --merge-file, or --tokenizer-type NullTokenizer "
                              "with --vocab-size",
                              flags=("--data-path", "--tokenizer-file", "--vocab-file", "--merge-file", "--tokenizer-type",
                                     "--vocab-size"))
        if bool(self.vocab_file) != bool(self.merge_file):
            raise ConfigError("--vocab-file and --merge-file go together (GPT-2 style BPE files)",
                              flags=("--vocab-file", "--merge-file"))
        if self.tokenizer_file and self.vocab_file:
            raise ConfigError("pass either --tokenizer-file or --vocab-file/--merge-file, not both",
                              flags=("--tokenizer-file", "--vocab-file", "--merge-file"))

    def _validate_fim(self) -> None:
        """--fim-data's rates, as Megatron-LM's validate_args and GPTFIMDataset take them."""
        # Megatron-LM's validate_args: no mock data, --fim-rate and --fim-spm-rate set (a 0 is refused too)
        if self.mock_data:
            raise ConfigError("--fim-data with --mock-data: Megatron's FIM dataset does not support mock data",
                              flags=("--fim-data", "--mock-data"))
        if not self.fim_rate or not self.fim_spm_rate:
            raise ConfigError("--fim-data needs --fim-rate and --fim-spm-rate above 0 (Megatron-LM asserts both)",
                              flags=("--fim-rate", "--fim-spm-rate"))
        # each rate is a probability: Megatron-LM's GPTFIMDataset draws np_rng.binomial(1, rate), which raises
        # "p < 0, p > 1 or p is NaN" in a data-loader worker at the first sample (issue 60)
        for flag, rate in (("--fim-rate", self.fim_rate), ("--fim-spm-rate", self.fim_spm_rate),
                           ("--fim-fragment-rate", self.fim_fragment_rate)):
            if rate is not None and not 0.0 <= rate <= 1.0:
                raise ConfigError(f"{flag} must be a probability, between 0 and 1, got {rate:g}", flags=(flag,))
        if self.fim_split_sample and self.fim_fragment_rate is None:
            raise ConfigError("--fim-split-sample needs --fim-fragment-rate (each fragment's FIM rate)",
                              flags=("--fim-split-sample", "--fim-fragment-rate"))


@dataclass(frozen=True)
class LoggingConfig:
    # None: runs/RUN_ID/metrics.jsonl, known once the run's lineage is (checkpoint/run_start.py)
    metrics_file: Optional[str] = option(None, metavar="FILE", help="JSON lines, one record per log/eval (default "
                                         "runs/RUN_ID/metrics.jsonl: a file per run, which its resumes append to)")
    # GENIAC's fork (hotsuyuki/Megatron-DeepSpeed, megatron/arguments.py) spells its W&B flags with underscores
    # too; its --use-wandb, --wandb-group and --wandb-tag are in arguments/megatron/flags.py.
    wandb_project: Optional[str] = option(None, help="log to W&B (offline unless W&B is configured on this "
                                                     "machine)", aliases={"--wandb_project": GENIAC_FORK})
    # llm-jp's Megatron-LM fork (nii-geniac: megatron/training/global_vars.py, _set_wandb_writer) names the run
    # --wandb-name plus its start time; W&B tells runs apart by id, so the name is taken as given.
    wandb_run_name: Optional[str] = option(None, aliases={"--wandb-exp-name": "Megatron-LM",
                                                          "--wandb-name": "llm-jp's Megatron-LM fork"})
    wandb_entity: Optional[str] = option(None, aliases={"--wandb_entity": GENIAC_FORK})
    # Megatron-LM's --wandb-save-dir (global_vars.py _set_wandb_writer: wandb.init's dir, there --save/wandb when
    # left out); here W&B's files go beside the metrics file when it is left out
    wandb_save_dir: Optional[str] = option(None, metavar="DIR", help="W&B's local files (wandb.init's dir; default: "
                                                                     "beside the metrics file)")
    report_memory: bool = option(False, help="log per-rank model-state bytes held and the zero/memory.py "
                                             "prediction")
    # None: looked up by the CUDA device's name (omitted on CPU).
    peak_tflops: Optional[float] = option(
        None, help="the device's dense 16-bit peak for the mfu metric (default: by CUDA device name, H100 SXM 989, "
                   "A100 312, V100 125; no mfu on CPU without it)")
    tensorboard_dir: Optional[str] = option(None, metavar="DIR",
                                            help="also write TensorBoard events here, with the same keys as "
                                                 "--metrics-file")
    # Megatron-LM's --moe-per-layer-logging (MoEMetricsTracker.report's per_layer_logging)
    moe_per_layer_logging: bool = option(
        False, action="store_true",
        help="with experts: each record also holds, per layer, the balancing losses and the tokens each expert "
             "received in the iteration (summed over the data-parallel ranks), as moe_per_layer")

    # Megatron-LM's straggler detector flags (megatron/training/arguments.py, _add_straggler_detector_args; its
    # training.py logs the --straggler-minmax-count slowest and fastest ranks each log interval). Here: each rank's
    # compute time, its waits inside collectives taken out (resilience/stragglers.py).
    log_straggler: bool = option(
        False, action="store_true",
        help="each --log-interval, name the --straggler-minmax-count slowest and fastest ranks by compute time "
             "(waits in collectives taken out), relative to the median, in the line and the records")
    straggler_minmax_count: int = option(1, help="how many slowest and fastest ranks --log-straggler names")
    disable_straggler_on_startup: bool = option(
        False, action="store_true",
        help="--log-straggler starts off (Megatron switches it on later through --straggler-ctrlr-port, a control "
             "server that does not exist here: it stays off, said at start)")

    def validate(self) -> None:
        if self.metrics_file is not None and not self.metrics_file:
            raise ConfigError("--metrics-file must name a file", flags=("--metrics-file",))
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ConfigError(f"--peak-tflops must be positive, got {self.peak_tflops}", flags=("--peak-tflops",))
        if self.straggler_minmax_count < 1:
            raise ConfigError(f"--straggler-minmax-count must be at least 1, got {self.straggler_minmax_count}",
                              flags=("--straggler-minmax-count",))


# Megatron-LM's --ckpt-format choices (megatron/training/arguments.py), each with what it is
TORCH_DIST = "torch_dist"
CKPT_FORMATS = {TORCH_DIST: "distributed checkpoint", "torch": "legacy per-rank files",
                "torch_dcp": "plain torch.distributed.checkpoint files", "fsdp_dtensor": "Megatron-FSDP DTensor files",
                "zarr": "deprecated zarr files"}
# The orders a run reads its samples in (data/gpt_dataset.py's, data/megatron_order.py's), as a start line names them
SAMPLE_ORDER_NAMES = {APPENDABLE_ORDER: "this project's order", MEGATRON_ORDER: "Megatron-Core's order"}


def sample_order(ckpt_format: Optional[str]) -> str:
    """The order a run reads its samples in: Megatron-Core's where it writes Megatron-LM's checkpoint (--ckpt-format
    torch_dist, Megatron-LM's default), since Megatron-LM continues such a save from its consumed-samples count in
    its own order, and a run continuing Megatron-LM's save names the format it continues; else this project's."""
    return MEGATRON_ORDER if ckpt_format == TORCH_DIST else APPENDABLE_ORDER


def sample_order_kept_note(order: str, ckpt_format: Optional[str]) -> str:
    """The start line of a resume whose checkpoint's sample order is not the one its --ckpt-format starts a run in."""
    line = (f"> data: samples in {SAMPLE_ORDER_NAMES[order]}, the checkpoint's (a resume keeps its order); "
            f"--ckpt-format {ckpt_format or '(left out)'} starts a run in {SAMPLE_ORDER_NAMES[sample_order(ckpt_format)]}")
    if ckpt_format == TORCH_DIST:
        line += ", in which this run's torch_dist saves are continued, here and by Megatron-LM"
    return line


@dataclass(frozen=True)
class CheckpointConfig:
    save: Optional[str] = option(None, metavar="DIR", help="write checkpoints here: one iter_NNNNNNN/ per save and "
                                                           "a 'latest' pointer")
    # None: save only at the end of training and on an exit.
    save_interval: Optional[int] = option(
        None, help="save every N iterations (always also at the end of training and on an exit)",
        aliases={"--persistent-save-interval": "Megatron-LM"})
    keep_last: Optional[int] = option(None, help="keep only the newest K checkpoints")  # None keeps all
    load: Optional[str] = option(
        None, metavar="CKPT",
        help="resume from a --save directory (its latest checkpoint) or one iter_NNNNNNN directory, at any "
             "data-parallel size and ZeRO stage; when it is also the --save directory and holds no checkpoint yet, "
             "the run starts fresh, so restarts can use the same command")
    load_optim: bool = option(True, help="--no-load-optim: take the weights only, with fresh Adam moments")
    load_rng: bool = option(True, help="--no-load-rng: random streams from --seed instead of the checkpoint's")
    # Megatron-LM's flag, which exits 0 there (checkpointing.py load_checkpoint: sys.exit()); here an error, exit 2.
    exit_on_missing_checkpoint: bool = option(False, help="refuse a --load that holds no checkpoint (without it: "
                                                          "a warning, and the run starts from random weights)")
    # Also with a fresh data order.
    finetune: bool = option(False, help="load weights only and start at iteration 0")
    # Megatron-LM's MoE upcycling (checkpoint/upcycling.py; the rules: arguments/upcycling_rules.py)
    moe_use_upcycling: bool = option(
        False, help="--load a dense checkpoint into this MoE model: each MLP copied into every expert, the router "
                    "as built; training starts at iteration 0 with a fresh optimizer and schedule")
    moe_upcycling_granularity: int = option(
        1, help="with --moe-use-upcycling: split each dense MLP into this many fine-grained experts (the dense FFN "
                "is --ffn-hidden-size times this)")
    init_from_hf: Optional[str] = option(None, metavar="DIR", help="start from a transformers GPT2LMHeadModel "
                                                                   "or LlamaForCausalLM folder (config.json + "
                                                                   "model.safetensors)")
    exit_signal_handler: bool = option(False, help="on SIGTERM or SIGUSR1, finish the iteration, save and exit 0")
    exit_interval: Optional[int] = option(None, help="save and exit 0 after an iteration that is a multiple of N "
                                                   "(0: never, as Megatron-LM reads it)")
    exit_duration_in_mins: Optional[float] = option(None, help="save and exit 0 once the run has lasted this many "
                                                               "minutes")
    # BigScience's kill switch.
    kill_switch_path: Optional[str] = option(
        None, flags=("--kill-switch-path", "--kill-switch-file"), metavar="FILE",
        help="when FILE exists: do not start, or save after the current iteration and exit 0 (BigScience's "
             "Megatron-DeepSpeed)")
    # swiss-ai's Megatron-LM fork (megatron/training/training.py, checkpoint_and_decide_exit and train): its
    # job scripts requeue themselves until DIR/exit appears (training/exit_conditions.py).
    trigger_path: Optional[str] = option(
        None, metavar="DIR",
        help="every --log-interval iterations: when DIR/save exists, save and remove it; when DIR/exit exists, save "
             "and exit 0; a run that reaches --train-iters creates DIR/exit (swiss-ai's Megatron-LM fork)")
    # A run that did not resume from --save's checkpoints replaces them only with this.
    overwrite_save: bool = option(
        False, help="let this run write into a --save directory holding checkpoints it did not resume from (its "
                    "saves replace same-numbered iterations and move 'latest')")
    override_data_on_resume: bool = option(
        False, help="resume although --data-path, --split, --seq-length or --seed differ from the checkpoint's (the "
                    "samples then differ from the original run's)")
    # Megatron-DeepSpeed's --universal-checkpoint: its training.py puts {"load_universal": true} in DeepSpeed's
    # checkpoint config, so the engine loads the folder `latest_universal` names (checkpoint/deepspeed/files.py)
    universal_checkpoint: bool = option(
        False, help="--load a DeepSpeed save directory's universal checkpoint (the folder its latest_universal names, "
                    "ds_to_universal's output) instead of the ZeRO checkpoint its latest names")
    verify_checkpoint: bool = option(
        True, help="check every checkpoint file's content hash before loading (--no-verify-checkpoint keeps the "
                   "size, header and dtype checks and skips reading whole files)")
    # Megatron-LM's asynchronous save (megatron/training/config/training_config.py, CheckpointConfig); it saves
    # in the background only with its persistent worker: validate_args turns --async-save off without it, and so
    # does `saves_in_background` (checkpoint/ours/async_save.py).
    async_save: bool = option(
        False, help="write checkpoints in the background while training goes on (with --use-persistent-ckpt-worker, "
                    "as Megatron-LM requires; the commit waits until every rank's files are written)")
    use_persistent_ckpt_worker: bool = option(
        False, help="the background writer --async-save needs: one writer thread per rank, for the whole run")
    # None: Megatron-LM's 10 and 3 on CUDA, where the CPU mostly waits for the device; on a CPU the training is the
    # CPU's work, and a writer at nice 10 got a tenth of a core against it (checkpoint/ours/async_save.py)
    async_ckpt_cpu_priority: Optional[int] = option(
        None, help="the background writer's CPU nice value (0-19, higher yields more to training; raised to it, never "
                   "lowered; default Megatron-LM's 10 on CUDA, the training's own on a CPU)")
    async_ckpt_io_priority: Optional[int] = option(
        None, help="the background writer's I/O scheduling class (ionice -c: 1 real time, 2 best effort, 3 idle; "
                   "default Megatron-LM's 3 on CUDA, the training's own on a CPU)")

    @property
    def saves_in_background(self) -> bool:
        """Whether saves go to the background writer: --save with --async-save and --use-persistent-ckpt-worker
        (Megatron-LM's validate_args: "--async-save is not supported without --use-persistent-ckpt-worker.
        Disabling --async-save.")."""
        return bool(self.save and self.async_save and self.use_persistent_ckpt_worker)

    # Megatron-LM's --ckpt-format. Left out: this project's own format (checkpoint/ours/sharded.py). Megatron-LM's other
    # formats are accepted as Megatron-LM launches give them (its functional tests' --ckpt-format torch) and write
    # this project's format, said at start-up (`unwritten_format_note`): the format changes no math.
    ckpt_format: Optional[str] = option(
        None, choices=CKPT_FORMATS,
        help="torch_dist: --save writes Megatron-LM's distributed checkpoint (iter_NNNNNNN/ with .distcp files and "
             "common.pt), which Megatron-LM --load-s and continues (docs/checkpoints.md); left out or another of "
             "Megatron-LM's formats: this project's own checkpoints. A --load of either is read whatever this says")

    def unwritten_format_note(self) -> Optional[str]:
        """The start line for a --ckpt-format whose files are not written here; None where it is (or unset)."""
        if self.ckpt_format in (None, TORCH_DIST) or not self.save:
            return None
        return (f"> --ckpt-format {self.ckpt_format}: Megatron-LM's {CKPT_FORMATS[self.ckpt_format]} are not "
                f"written here; --save writes this project's checkpoints (--ckpt-format {TORCH_DIST} writes "
                f"Megatron-LM's distributed checkpoint)")

    def validate(self) -> None:
        for name in ("save_interval", "keep_last"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{_flag(name)} must be at least 1, got {value}", flags=(_flag(name),))
        # Megatron-LM exits `if args.exit_interval and iteration % args.exit_interval == 0` (training.py), so 0 is
        # no exit; a negative N divides every iteration, so the run would stop after its first
        if self.exit_interval is not None and self.exit_interval < 0:
            raise ConfigError(f"--exit-interval must be 0 (never) or more, got {self.exit_interval}",
                              flags=("--exit-interval",))
        if self.exit_duration_in_mins is not None and not self.exit_duration_in_mins > 0:
            raise ConfigError(f"--exit-duration-in-mins must be positive, got {self.exit_duration_in_mins}",
                              flags=("--exit-duration-in-mins",))
        # --save-interval alone is not here: Megatron-LM saves only `if args.save and args.save_interval`,
        # so without --save it saves nothing (said at start, arguments/parser.py)
        for name in ("keep_last", "exit_signal_handler"):
            if getattr(self, name) and not self.save:
                raise ConfigError(f"{_flag(name)} needs --save DIR (where the checkpoints go)",
                                  flags=(_flag(name), "--save"))
        if self.finetune and not self.load:
            raise ConfigError("--finetune needs --load CHECKPOINT (the weights to start from)",
                              flags=("--finetune", "--load"))
        if self.save and Path(self.save).is_file():
            raise ConfigError(f"--save {self.save} is a file; it must be a directory (created if missing)",
                              flags=("--save",))


@dataclass(frozen=True)
class PretrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    parallel: ParallelismConfig = field(default_factory=ParallelismConfig)
    data: DataConfig = field(default_factory=DataConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    activations: ActivationCheckpointConfig = field(default_factory=ActivationCheckpointConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    # Where each setting's value came from (arguments/config_sources.py): filled in by arguments.parser, empty
    # for a config built in code. Not a setting: to_dict and comparisons leave it out.
    sources: dict = field(default_factory=dict, compare=False, repr=False)
    # The DeepSpeed JSON's own batch keys as written ({"source": file, "train_batch_size": n, ...}):
    # DeepSpeed checks them against the data-parallel size at initialize, and so does
    # arguments/batch_schedule.py, whichever values the command line made the run use. Not a setting.
    deepspeed_batch: dict = field(default_factory=dict, compare=False, repr=False)
    # One line per DeepSpeed JSON optimizer or scheduler value the run does not use (arguments/deepspeed/
    # differences.py), said last before the first iteration. Not a setting.
    json_differences: tuple = field(default=(), compare=False, repr=False)

    SECTIONS = ("model", "optimizer", "training", "parallel", "data", "logging", "zero", "activations", "checkpoint")

    def _check_pipeline(self) -> None:
        """What pipeline stages (training/pipeline_step.py) cannot run yet, refused in one line each."""
        if self.parallel.pipeline_model_parallel_size == 1:
            self._check_one_stage()
        else:
            self._check_stages()

    def _check_one_stage(self) -> None:
        """The split flags of several stages, given to one."""
        from gpt.pipeline_layout import pipeline_layout_counts

        parallel = self.parallel
        for flag, value in (("--num-layers-per-virtual-pipeline-stage", parallel.num_layers_per_virtual_pipeline_stage),
                            ("--num-virtual-stages-per-pipeline-rank", parallel.num_virtual_stages_per_pipeline_rank)):
            if value is not None:
                raise ConfigError(f"{flag} needs --pipeline-model-parallel-size > 1 (Megatron refuses it without "
                                  f"stages too): drop it, or add stages",
                                  flags=(flag, "--pipeline-model-parallel-size"))
        if (parallel.decoder_first_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers) != (None, None):
            raise ConfigError("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1 (the "
                              "sizes of the first and last of several stages): drop them, or add stages",
                              flags=("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                                     "--pipeline-model-parallel-size"))
        if parallel.pipeline_model_parallel_layout is not None:
            counts = pipeline_layout_counts(self.model, parallel)  # its own checks hold for one stage too
            if len(counts[0]) > 1:
                raise ConfigError(f"--pipeline-model-parallel-layout {parallel.pipeline_model_parallel_layout!r} has "
                                  f"{len(counts[0])} virtual stages on one pipeline stage: interleaving needs "
                                  f"--pipeline-model-parallel-size > 1; use one virtual stage, or add stages",
                                  flags=("--pipeline-model-parallel-layout", "--pipeline-model-parallel-size"))

    def _check_stages(self) -> None:
        """Several stages: the layout or the split flags (each stage with a layer), and ZeRO's stage."""
        from gpt.pipeline_layout import pipeline_layout_counts
        from gpt.stage_layers import stage_layers  # the split's own checks name the flags

        pp, parallel = self.parallel.pipeline_model_parallel_size, self.parallel
        if parallel.pipeline_model_parallel_layout is not None:
            # Megatron-LM's validate_args: the layout replaces the split flags
            given = [flag for flag, value in (
                ("--num-layers-per-virtual-pipeline-stage", parallel.num_layers_per_virtual_pipeline_stage),
                ("--num-virtual-stages-per-pipeline-rank", parallel.num_virtual_stages_per_pipeline_rank),
                ("--decoder-first-pipeline-num-layers", parallel.decoder_first_pipeline_num_layers),
                ("--decoder-last-pipeline-num-layers", parallel.decoder_last_pipeline_num_layers),
                ("--account-for-embedding-in-pipeline-split", parallel.account_for_embedding_in_pipeline_split),
                ("--account-for-loss-in-pipeline-split", parallel.account_for_loss_in_pipeline_split))
                if value not in (None, False)]
            if given:
                raise ConfigError(f"--pipeline-model-parallel-layout with {', '.join(given)}: the layout gives the "
                                  f"split itself; drop {'them' if len(given) > 1 else 'it'}",
                                  flags=("--pipeline-model-parallel-layout", *given))
            pipeline_layout_counts(self.model, parallel)  # refuses what it cannot map, in one line
        uneven = (parallel.decoder_first_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers)
        split = dict(virtual_stages=parallel.num_virtual_stages_per_pipeline_rank,
                     account_for_embedding=parallel.account_for_embedding_in_pipeline_split,
                     account_for_loss=parallel.account_for_loss_in_pipeline_split)
        for rank in range(pp):  # a stage left without a layer is refused by its own rank's split
            stage_layers(self.model.num_layers, pp, rank, parallel.num_layers_per_virtual_pipeline_stage, *uneven,
                         **split, layout_counts=pipeline_layout_counts(self.model, parallel))
        if self.zero.stage == 3:
            # DeepSpeed's pipeline engine asserts zero_optimization_stage() < ZeroStageEnum.gradients
            # (deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism").
            # Here stage 2 runs too (its reducer reduces every micro-batch on the stage's DP group, as Megatron-Core's
            # distributed optimizer with PP reduce-scatters); stage 3's per-block gathers are not wired to stages.
            raise ConfigError(f"--zero-stage 3 with --pipeline-model-parallel-size {pp}: ZeRO-3 is incompatible "
                              f"with pipeline parallelism (as in DeepSpeed); use --zero-stage 1 or 2",
                              flags=("--zero-stage", "--pipeline-model-parallel-size"))

    def megatron_format_unwritten(self) -> Optional[str]:
        """Why --save cannot write Megatron-LM's torch_dist layout for this run (checkpoint/torch_dist/writer.py), in
        one start line; None where it can or is not asked. Such a run is accepted, as Megatron-LM launches give the
        flag beside these settings, and saves this project's format: the format changes no math."""
        if self.checkpoint.ckpt_format != TORCH_DIST or not self.checkpoint.save:
            return None
        model, experts = self.model, self._unwritten_experts()
        beyond = settings_beyond_megatron(model, harvested()["flags"], DEFAULT_SOURCES)
        unwritten = [what for what, on in (
            *((f"{flag} (Megatron-LM has no such flag)", True) for flag in beyond),
            (experts, experts is not None),
            # gpt/mla.py norms the hidden state before linear_q_proj there; Megatron-Core 0.16.1 builds no such norm
            ("multi-latent attention's query norm without --q-lora-rank (Megatron-Core builds none)",
             model.mla.multi_latent_attention and model.attention.qk_layernorm and model.mla.q_lora_rank is None),
            # a pattern's save is HybridModel's layout (checkpoint/torch_dist/names.py hybrid_megatron_placement),
            # whose `+` layers (hybrid_layer_specs.py mla_layer: q_layernorm and kv_layernorm IdentityOp) hold no
            # latent norms
            ("multi-latent attention's latent norms (--qk-layernorm) under --hybrid-layer-pattern (HybridModel's "
             "MLA layers build none)", model.mla.multi_latent_attention and bool(model.hybrid_layer_pattern)
             and model.attention.qk_layernorm),
            # MoE MTP layers are written in GPTModel's layout (an MTP transformer layer's experts, router and expert
            # bias); HybridModel's MTP depths holding experts were never continued by Megatron-LM
            ("an MoE multi-token prediction depth under --hybrid-layer-pattern",
             bool(model.hybrid_layer_pattern) and bool(model.mtp.num_layers) and model.moe is not None),
            # names.py places the GPT path's Gated DeltaNet decoder layers, not its MTP layers' (nor their spec)
            ("multi-token prediction beside --experimental-attention-variant gated_delta_net",
             model.hybrid_layer_pattern is None and bool(model.mtp.num_layers) and model.gdn.gated_delta_net),
            (f"--optimizer {self.optimizer.optimizer}'s states", self.optimizer.optimizer != "adam"),
            ("--keep-last's pruning", bool(self.checkpoint.keep_last))) if on]
        if not unwritten:
            return None
        return (f"> --ckpt-format {TORCH_DIST}: {', '.join(unwritten)}: not written in Megatron-LM's layout "
                f"here; --save writes this project's checkpoints")

    def _unwritten_experts(self) -> Optional[str]:
        """What of the MoE layers checkpoint/torch_dist/writer.py does not write in Megatron-Core's layout: it
        writes SequentialMLP's (layer, expert) tensors, the shared expert's (and its gate), the router's weight, bias
        and expert bias, and dense layers between (--moe-layer-freq): MoE layers of one expert count under
        Megatron-Core's router, without the state its writer does not hold."""
        model = self.model
        if model.moe is None:
            return None
        experts = model.experts
        if experts.deepspeed.gating == "deepspeed":
            return "DeepSpeed-MoE's layers"
        if len(set(count for count in model.experts_per_layer() if count > 1)) > 1:
            return "MoE layers of different expert counts"
        if experts.shared_expert_intermediate_size and model.add_bias_linear:
            # Megatron-Core's SharedExpertMLP asserts "bias is not supported in the shared experts"
            return "the shared experts' biases (Megatron-Core builds none)"
        return None

    def _check_multi_token_prediction(self) -> None:
        """What --mtp-num-layers (gpt/mtp.py) does not run yet, one line each."""
        mtp = self.model.mtp.num_layers
        if not mtp:
            return
        pp = self.parallel.pipeline_model_parallel_size
        if pp > 1 and self.model.positions.position_embedding_type == "learned_absolute":
            raise ConfigError(f"--mtp-num-layers {mtp} with --pipeline-model-parallel-size {pp} and learned absolute "
                              f"positions is not implemented here: the last stage's MTP layers hold no position "
                              f"embedding; use --position-embedding-type rope or none, or one stage",
                              flags=("--mtp-num-layers", "--pipeline-model-parallel-size", "--position-embedding-type"))
        if self.logging.moe_per_layer_logging and self.model.moe is not None:
            raise ConfigError("--moe-per-layer-logging with --mtp-num-layers is not implemented here: drop "
                              "--moe-per-layer-logging", flags=("--moe-per-layer-logging", "--mtp-num-layers"))

    def _check_context_parallel(self) -> None:
        """What context parallelism (parallel/context_parallel.py) needs and what it does not run, one line each."""
        cp, model = self.parallel.context_parallel_size, self.model
        if cp == 1:
            return
        self._check_context_parallel_exchange(cp)
        tp = self.parallel.tensor_model_parallel_size
        local = model.seq_length // cp
        if model.seq_length % (2 * cp):
            raise ConfigError(f"--seq-length {model.seq_length} must be divisible by 2 x --context-parallel-size "
                              f"({2 * cp}): each rank holds two equal chunks of the sequence",
                              flags=("--seq-length", "--context-parallel-size"))
        if self.parallel.sequence_parallel and tp > 1 and local % tp:
            raise ConfigError(f"--sequence-parallel splits each context-parallel rank's {local} tokens over "
                              f"--tensor-model-parallel-size {tp}: choose --seq-length divisible by CP x TP",
                              flags=("--sequence-parallel", "--seq-length", "--context-parallel-size"))
        # document masking (--reset-position-ids, --reset-attention-mask, --eod-mask-loss, --goldfish-loss) runs
        # under context parallelism: the whole sample's masks split with the tokens (data/documents_cp.py), as
        # Megatron-LM's get_batch_on_this_cp_rank splits them, which asserts nothing about them
        if self.zero.distributed_optimizer_instances > 1:
            raise ConfigError("--num-distributed-optimizer-instances > 1 with --context-parallel-size is not "
                              "implemented here: use one optimizer instance",
                              flags=("--context-parallel-size", "--num-distributed-optimizer-instances"))

    def _check_context_parallel_exchange(self, cp: int) -> None:
        """What --cp-comm-type's exchange does not compute, or needs of the heads."""
        model = self.model
        comm = model.attention.cp_comm_type
        # the ring takes the scores' scale (--softmax-scale, multi-latent attention's) but not their soft-capping
        if comm in ("p2p", "a2a+p2p") and model.attention.attn_logit_softcapping:
            raise ConfigError(f"--attn-logit-softcapping with --cp-comm-type {comm} (the ring) is not implemented: the "
                              f"ring does not soft-cap its scores; use --cp-comm-type all_gather or a2a with "
                              f"--context-parallel-size {cp}", flags=("--attn-logit-softcapping", "--cp-comm-type"))
        if comm in ("p2p", "a2a+p2p") and model.has_windows():
            # the ring's blocks other than a rank's own are half visible and unmasked (gpt/cp_attention.py); Transformer
            # Engine too runs sliding windows under context parallelism only with all_gather or a2a
            raise ConfigError(f"--window-size with --cp-comm-type {comm} (the ring) is not implemented: the ring "
                              f"computes plain causal attention; use --cp-comm-type all_gather or a2a with "
                              f"--context-parallel-size {cp}", flags=("--window-size", "--cp-comm-type"))
        tp = self.parallel.tensor_model_parallel_size
        heads = model.num_attention_heads // tp
        if comm == "a2a+p2p":  # each layer's key heads: multi-latent attention's are its query heads (gpt/mla.py)
            key_heads = {MLA: model.num_attention_heads,
                         ATTENTION: model.attention.num_query_groups or model.num_attention_heads}
            for groups in sorted({key_heads[mixer] for mixer in mixer_symbols(model)}):
                # (fewer groups than TP ranks: each rank reads one, gpt/qkv_projection.py QKVLayout)
                self._check_hierarchical_context_parallel(heads, max(groups // tp, 1))
        if model.attention.cp_comm_type == "a2a" and heads % cp:
            # DeepSpeed's single_all_to_all asserts it: "Number of heads must be divisible by the sequence parallel
            # size"; Megatron-DeepSpeed's ParallelAttention too (num_attention_heads % sequence parallel size).
            raise ConfigError(f"--cp-comm-type a2a (DeepSpeed-Ulysses) splits each tensor-parallel rank's {heads} "
                              f"attention heads over {cp} ranks: choose --num-attention-heads divisible by TP x "
                              f"{cp}", flags=("--num-attention-heads", "--context-parallel-size",
                                              "--ds-sequence-parallel-size"))

    def _check_hierarchical_context_parallel(self, heads: int, groups: int) -> None:
        """--cp-comm-type a2a+p2p: Megatron-LM's validate_args asserts --hierarchical-context-parallel-sizes is given,
        TransformerEngine (attn_forward_func_with_cp) takes two levels, and its flash_attn_a2a_communicate splits a
        TP rank's query and key/value heads over the all-to-all level."""
        levels = self.parallel.hierarchical_context_parallel_sizes
        if not levels or len(levels) != 2:
            raise ConfigError("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A B (two sizes: the "
                              "all-to-all over A adjacent CP ranks, the ring over B), as Megatron-LM asserts",
                              flags=("--cp-comm-type", "--hierarchical-context-parallel-sizes"))
        if heads % levels[0] or groups % levels[0]:
            raise ConfigError(f"--cp-comm-type a2a+p2p splits each tensor-parallel rank's {heads} attention heads and "
                              f"{groups} key/value groups over the all-to-all level's {levels[0]} ranks: choose "
                              f"--num-attention-heads and --num-query-groups divisible by TP x {levels[0]}",
                              flags=("--num-attention-heads", "--num-query-groups",
                                     "--hierarchical-context-parallel-sizes"))

    def _check_expert_parallel(self) -> None:
        """--expert-model-parallel-size splits each MoE layer's experts evenly over its ranks (Megatron-LM's
        validate_args: `args.num_experts % args.expert_model_parallel_size == 0`); the data-parallel size it
        must divide is known at launch (parallel/mesh.py expert_mesh_sizes)."""
        ep = self.parallel.expert_model_parallel_size
        if ep == 1:
            return
        flag = "--expert-model-parallel-size"
        if self.model.moe is None:
            raise ConfigError(f"{flag} {ep} needs experts to split: add --num-experts (a multiple of {ep})",
                              flags=(flag, "--num-experts"))
        # each MoE layer's count (a Megatron-DeepSpeed list gives each its own) over the same group: DeepSpeed-MoE's
        # MoE asserts `num_experts % ep_size == 0` per layer (deepspeed/moe/layer.py)
        counts = sorted(set(self.model.experts.distinct_counts(self.model.num_layers)) | {self.model.moe.num_experts})
        indivisible = [count for count in counts if count % ep != 0]
        if indivisible:
            raise ConfigError(f"--num-experts {' '.join(map(str, indivisible))} is not divisible by {flag} {ep}; each "
                              f"expert-parallel rank holds an equal share of every MoE layer's experts",
                              flags=(flag, "--num-experts"))
        # --num-distributed-optimizer-instances also cuts the experts' optimizer over the expert data-parallel group
        # (parallel/state.py); that it divides the expert DP size is checked at launch, where the size is known

    def split_unread_note(self) -> Optional[str]:
        """--split typed beside per-split blends: not read, each split's blend is read whole (data/per_split.py). A
        default --split, ours or a Megatron generation's, is not read there either and needs no line."""
        source = self.sources.get("split")
        if source is None or source.kind != FLAG or self.data.sources().per_split is None:
            return None
        return (f"> --split {self.data.split} beside per-split blends: not read, each split's blend is read whole "
                f"(Megatron-Core since 2024-01 asserts 'split and blend_per_split are incompatible'; LLM360's K2-V2 "
                f"launches give both)")

    def _check_flex_dispatcher(self) -> None:
        """Megatron-Core's flex dispatcher beside the experts (token_dispatcher.py MoEFlexTokenDispatcher and
        transformer_config.py at d98e8a64): DeepEP and NCCL-EP assert an expert TP x EP group of more than one
        rank, and DeepEP refuses --moe-pad-expert-input-to-capacity."""
        parallel, moe = self.parallel, self.model.moe
        if parallel.moe_token_dispatcher_type != "flex" or moe is None:
            return
        backend = parallel.flex_backend
        etp = parallel.expert_tensor_parallel_size or parallel.tensor_model_parallel_size
        group = etp * parallel.expert_model_parallel_size
        if backend in ("deepep", "ncclep") and group == 1:
            name = "DeepEP" if backend == "deepep" else "NCCL EP"
            raise ConfigError(f"--moe-token-dispatcher-type flex with the {backend} backend needs more than one rank "
                              f"in the expert tensor-parallel x expert-parallel group ({name} dispatcher requires "
                              f"TPxEP > 1, as Megatron-Core asserts): raise --expert-model-parallel-size, or use "
                              f"--moe-token-dispatcher-type alltoall",
                              flags=("--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend",
                                     "--expert-model-parallel-size"))
        if backend == "deepep" and moe.pad_expert_input_to_capacity:
            raise ConfigError("--moe-pad-expert-input-to-capacity with the flex dispatcher's deepep backend: "
                              "Megatron-Core refuses it (DeepEP does not pad to capacity); use "
                              "--moe-flex-dispatcher-backend hybridep or --moe-token-dispatcher-type alltoall",
                              flags=("--moe-pad-expert-input-to-capacity", "--moe-flex-dispatcher-backend"))

    def _check_moe_tensor_parallel(self) -> None:
        """MoE under tensor parallelism (gpt/moe/layer.py): Megatron-Core's MoELayer.forward raises in training
        with TP > 1 and no sequence parallelism; each expert's ffn splits evenly over the expert TP ranks
        (--expert-tensor-parallel-size, default TP as Megatron-LM's validate_args; any size whose grid divides the
        ranks, parallel/mesh.py, TP 1 included)."""
        tp = self.parallel.tensor_model_parallel_size
        moe = self.model.moe
        if moe is None:
            return
        etp = self.parallel.expert_tensor_parallel_size
        etp = tp if etp is None else etp
        flags = ("--num-experts", "--tensor-model-parallel-size")
        if tp > 1 and not self.parallel.sequence_parallel:
            raise ConfigError(f"--num-experts with --tensor-model-parallel-size {tp} needs --sequence-parallel "
                              f"(Megatron-Core's MoE layer refuses tensor parallelism without it in training): add "
                              f"--sequence-parallel", flags=(*flags, "--sequence-parallel"))
        if tp > 1 and moe.deepspeed.gating == "deepspeed":
            raise ConfigError(f"DeepSpeed-MoE's gating (Megatron-DeepSpeed's MoE flags) with "
                              f"--tensor-model-parallel-size {tp} is not implemented here: use Megatron-Core's "
                              f"--moe-* flags, or --tensor-model-parallel-size 1", flags=flags)
        if self.model.mlp.activation == "xielu" and max(tp, etp) > 1:
            # each expert's two xIELU scalars would need their gradient summed over the expert-TP peers (and the
            # tensor-parallel shared experts' over TP), which the experts here do not do
            raise ConfigError(f"--xielu with --num-experts and --tensor-model-parallel-size {tp} / "
                              f"--expert-tensor-parallel-size {etp} is not implemented: the experts' xIELU scalars "
                              f"are not tensor-parallel here; run it at --tensor-model-parallel-size 1 and "
                              f"--expert-tensor-parallel-size 1",
                              flags=("--xielu", *flags, "--expert-tensor-parallel-size"))
        shared = moe.shared_expert_intermediate_size
        if tp > 1 and shared is not None and shared % tp:
            raise ConfigError(f"--moe-shared-expert-intermediate-size {shared} is not divisible by "
                              f"--tensor-model-parallel-size {tp}: the shared experts split over the TP ranks",
                              flags=("--moe-shared-expert-intermediate-size", "--tensor-model-parallel-size"))
        if moe.ffn_hidden_size % etp:
            raise ConfigError(f"--moe-ffn-hidden-size {moe.ffn_hidden_size} is not divisible by "
                              f"--expert-tensor-parallel-size {etp} (the default: --tensor-model-parallel-size); "
                              f"each expert's ffn splits evenly over the expert tensor-parallel ranks",
                              flags=("--moe-ffn-hidden-size", "--expert-tensor-parallel-size"))

    def validate(self) -> None:
        check_finite_numbers(self)
        for section in self.SECTIONS:
            getattr(self, section).validate()
        tp = self.parallel.tensor_model_parallel_size
        self.model.validate_tensor_parallel(tp)
        if self.parallel.sequence_parallel and self.model.seq_length % tp != 0:
            raise ConfigError(f"--sequence-parallel splits the sequence over the tensor-parallel ranks: --seq-length "
                              f"{self.model.seq_length} is not divisible by --tensor-model-parallel-size {tp}; "
                              f"choose a multiple of it",
                              flags=("--sequence-parallel", "--seq-length", "--tensor-model-parallel-size"))
        self._check_goldfish()
        check_upcycling(self)
        self._check_muon()
        self._check_expert_parallel()
        self._check_flex_dispatcher()
        self._check_moe_tensor_parallel()
        self._check_pipeline()
        self._check_context_parallel()
        self._check_multi_token_prediction()
        self._check_hf_model_type()
        check_cuda_graphs(self)
        self.activations.validate_for_layers(self.model.num_layers)
        if self.training.step_batch_size_schedule is not None:
            self._check_step_schedule()
        if self.data.tokenizer_type == "NullTokenizer" and self.model.vocab_size < 1:
            # Megatron-LM asserts the flag (tokenizer.py: `assert args.vocab_size is not None`); given as 0 its
            # NullTokenizer has the end-of-document id alone (N + 1 ids) and the data's ids land in padding rows
            typed = f", got {self.model.vocab_size}: 0 leaves only the end-of-document id, every other token id " \
                    f"would fall in the padding rows" if self.sources["vocab_size"].kind == FLAG else ""
            raise ConfigError(f"--tokenizer-type NullTokenizer needs --vocab-size N (token ids 0..N-1; the "
                              f"end-of-document id is N){typed}", flags=("--tokenizer-type", "--vocab-size"))
        check_bounds(self)  # last: the estimates read values the rules above have made sane

    def _check_hf_model_type(self) -> None:
        """--hf-model-type names a family the Hugging Face folders are read and written as (arguments/hf_config.py)."""
        from arguments.hf_config import families

        wanted, known = self.model.hf_model_type, families()
        if wanted is not None and wanted not in known:
            raise ConfigError(f"--hf-model-type {wanted} is not a family read or written here: one of "
                              f"{', '.join(known)}", flags=("--hf-model-type",))

    def _check_muon(self) -> None:
        """Muon's Newton-Schulz needs each whole matrix: zero/muon.py gathers it over the ZeRO partition and, per
        --muon-tp-mode, over TP (an expert's over expert TP); the host step of --offload-optimizer (PyTorch's fused
        AdamW) is not built for it."""
        if self.optimizer.optimizer != "muon":
            return
        if self.zero.offload_optimizer:
            raise ConfigError("--optimizer muon steps on the training device: --offload-optimizer's host step is "
                              "AdamW's only", flags=("--optimizer", "--offload-optimizer"))
        if self.optimizer.exp_avg_dtype != "fp32" or self.optimizer.exp_avg_sq_dtype != "fp32":
            raise ConfigError("--optimizer muon keeps fp32 states: bf16 moments are Adam's only",
                              flags=("--optimizer", "--exp-avg-dtype"))
        model, tp = self.model, self.parallel.tensor_model_parallel_size
        groups = model.attention.query_groups(model.num_attention_heads)
        if self.optimizer.muon_split_qkv and ATTENTION in mixer_symbols(model) and groups < tp:
            # a TP rank's QKV rows are then part of one group's, which Megatron-Core's muon.py also cannot split
            raise ConfigError(f"--optimizer muon splits the QKV weight by query group, which --num-query-groups "
                              f"{groups} below --tensor-model-parallel-size {tp} cuts over the TP ranks: not "
                              f"implemented; add --muon-no-split-qkv",
                              flags=("--optimizer", "--num-query-groups", "--tensor-model-parallel-size"))

    def _check_goldfish(self) -> None:
        """swiss-ai's fork asserts K and H positive (arguments.py: "goldfish_k (frequency) must be a positive
        integer", "goldfish_h (context width) must be a positive integer"), and its apply_goldfish hashes windows of
        H labels of a sample (`labels.unfold(0, goldfish_context_width, 1)`, which fails on a shorter sample)."""
        data = self.data
        if not data.goldfish_loss:
            return
        for flag, value in (("--goldfish-k", data.goldfish_k), ("--goldfish-h", data.goldfish_h)):
            if value < 1:
                raise ConfigError(f"{flag} must be a positive integer, got {value}", flags=(flag, "--goldfish-loss"))
        if data.goldfish_h > self.model.seq_length:
            raise ConfigError(f"--goldfish-h {data.goldfish_h} is longer than a sample's {self.model.seq_length} "
                              f"labels (--seq-length): the goldfish loss hashes windows of --goldfish-h labels "
                              f"within a sample; choose at most --seq-length",
                              flags=("--goldfish-h", "--seq-length"))

    def _check_step_schedule(self) -> None:
        """What needs no grid: the schedule parses, and no other setting also sets the batch per iteration
        (--global-batch-size beside it is refused in batch_schedule, which knows where values came from)."""
        training = self.training
        parse_step_schedule(training.step_batch_size_schedule, self.model.seq_length)
        if training.rampup_batch_size is not None:
            raise ConfigError("--step-batch-size-schedule and --rampup-batch-size both set the global batch of each "
                              "iteration; keep one (Megatron-LM's main branch ignores --rampup-batch-size)",
                              flags=("--step-batch-size-schedule", "--rampup-batch-size"))
        if training.accumulation_steps is not None:
            raise ConfigError("--step-batch-size-schedule sets the accumulation steps of each iteration; drop "
                              "--gradient-accumulation-steps",
                              flags=("--step-batch-size-schedule", "--gradient-accumulation-steps"))

    def to_dict(self) -> dict:
        """{section: {setting: value}} as checkpoint metadata and the run's logs record it: the `parallel`
        section's settings under the sections that held them before it (parallel/config.py
        `RECORDED_SECTION`), so a checkpoint's recorded config reads the same either side of the move."""
        record: dict = {section: {} for section in self.SECTIONS if section != "parallel"}
        for section in self.SECTIONS:
            for name, value in setting_values(getattr(self, section)).items():
                shown = recorded_section(name) if section == "parallel" else section
                record[shown][name] = value
        return record

    @classmethod
    def from_flat(cls, values: dict, sources: Optional[dict] = None, deepspeed_batch: Optional[dict] = None,
                  json_differences: tuple = ()) -> "PretrainConfig":
        """Build from a flat {field_name: value} mapping (what argparse and YAML presets give): each section
        constructed once from its values, the defaults for the rest."""
        sections = field_sections()
        by_section: dict[str, dict] = {section: {} for section in cls.SECTIONS}
        for name, value in values.items():
            if name not in sections:
                raise ConfigError(f"unknown setting {name!r}")
            by_section[sections[name]][name] = value
        kinds = {f.name: f.default_factory for f in fields(cls) if f.name in cls.SECTIONS}
        return cls(sources=dict(sources or {}), deepspeed_batch=dict(deepspeed_batch or {}),
                   json_differences=tuple(json_differences),
                   **{section: with_settings(kinds[section], given) for section, given in by_section.items()})


def field_sections() -> dict[str, str]:
    """Every setting name -> the section it lives in."""
    config = PretrainConfig()
    return {name: section for section in PretrainConfig.SECTIONS for name in setting_names(type(getattr(config, section)))}


def check_finite_numbers(config: PretrainConfig) -> None:
    """Every float setting must be a finite number. NaN compares false with everything, so the range
    checks alone would let `--lr nan` or `--clip-grad nan` through (and a NaN clip disables clipping);
    inf would train to NaN weights. Run first, so the range checks compare real numbers."""
    for section in config.SECTIONS:
        for name, value in setting_values(getattr(config, section)).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{_flag(name)} must be a finite number, got {value}", flags=(_flag(name),))


def check_seed(seed: int) -> None:
    """--seed seeds every random stream, NumPy's too, which takes a 32-bit seed."""
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"--seed must be in [0, 2**32), got {seed}; every stream (NumPy's included) "
                          "takes a 32-bit seed", flags=("--seed",))


def check_device_name(name: str) -> None:
    """--device is 'auto', 'cpu', 'cuda' or 'cuda:N'; whether that CUDA device exists is checked when
    the process grid is built."""
    if name == "auto":
        return
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name!r} is not a device this program trains on; use auto, cpu, cuda or cuda:N",
                          flags=("--device",))


def _flag(name: str) -> str:
    """The flag of a setting, in any section (`--zero-stage` for `stage`)."""
    return FLAG_NAMES[name]


def _flag_names() -> dict[str, str]:
    config = PretrainConfig()
    return {f.name: flag_of(f) for section in config.SECTIONS for f, _ in option_fields(type(getattr(config, section)))}


# Every setting -> its flag (`option(flags=...)` on the field, else `--field-name`).
FLAG_NAMES = _flag_names()
