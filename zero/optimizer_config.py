"""The optimizer's section of the run's settings: the learning rate's schedule, decay, clipping, Adam's betas and
the choice of optimizer, with its refusal checks; each algorithm's own knobs are a section of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from base.options import count, flag_of_setting, option, section, with_settings
from zero.optimizer_algorithms import AlgorithmSettings

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
    algorithms: AlgorithmSettings = section(AlgorithmSettings)

    @classmethod
    def of(cls, **settings) -> "OptimizerConfig":
        """An optimizer section from its settings by name, an algorithm's among them (`muon_momentum=0.9`)."""
        return with_settings(cls, settings)

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
        self.algorithms.validate(self.optimizer)


def _flag(name: str) -> str:
    return flag_of_setting(OptimizerConfig, name)
