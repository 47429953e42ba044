"""How long a run trains and its learning rate, computed as Megatron computes them. The rate is a pure function of the
samples (and tokens) consumed before each update, as Megatron-LM's OptimizerParamScheduler counts, so a resumed run
continues the schedule exactly from its consumed samples."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from arguments.batch_schedule import BatchSchedule
from arguments.training_config import TrainingConfig
from base.errors import ConfigError
from base.options import replace_settings, setting_names
from zero.optimizer_config import OptimizerConfig


@dataclass(frozen=True)
class LearningRateSchedule:
    max_lr: float
    min_lr: float
    style: str
    warmup_samples: float
    decay_samples: float
    init_lr: float = 0.0                   # where a warmup starts (--lr-warmup-init)
    warmup_tokens: Optional[float] = None  # Megatron-DeepSpeed's
    decay_tokens: Optional[float] = None   # and decay
    warmup_end_tokens: float = 0.0  # the tokens seen when a warmup in samples ended
    wsd_decay_samples: Optional[float] = None  # WSD: the anneal's length at the end of the decay
    wsd_style: str = "exponential"             # WSD: the anneal's shape

    def rate(self, samples: float, tokens: float = 0.0) -> float:
        """The rate for the update after `samples` consumed samples, the schedule seeing `tokens`."""
        if self.warmup_tokens is None:
            if self.warmup_samples > 0 and samples <= self.warmup_samples:
                return self.init_lr + (self.max_lr - self.init_lr) * samples / self.warmup_samples
        elif self.warmup_tokens > 0 and tokens <= self.warmup_tokens:
            return self.init_lr + (self.max_lr - self.init_lr) * tokens / self.warmup_tokens
        if self.style == "constant":
            return self.max_lr
        if self.decay_tokens is None:
            done, start, end = samples, self.warmup_samples, self.decay_samples
        else:
            done, end = tokens, self.decay_tokens
            start = self.warmup_tokens if self.warmup_tokens is not None else self.warmup_end_tokens
        if done > end:
            return self.min_lr
        if self.style == "inverse-square-root":
            return max(self.min_lr, self.max_lr * max(self.warmup_samples, 1) ** 0.5 / max(samples, 1) ** 0.5)
        if self.style == "WSD":
            anneal_start = end - self.wsd_decay_samples
            if done <= anneal_start:
                return self.max_lr
            return self.min_lr + wsd_coefficient(self.wsd_style, (done - anneal_start) / self.wsd_decay_samples) * (
                self.max_lr - self.min_lr)
        ratio = (done - start) / (end - start) if end > start else 1.0
        coefficient = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coefficient * (self.max_lr - self.min_lr)

    def describe(self) -> str:
        text = f"warmup {self.warmup_samples:g} samples, decay ({self.style}) to {self.decay_samples:g} samples"
        if self.warmup_tokens is not None or self.decay_tokens is not None:
            text += (f"; by tokens: warmup {self.warmup_tokens if self.warmup_tokens is not None else '-'}, "
                     f"decay to {self.decay_tokens if self.decay_tokens is not None else '-'}")
        return text


def wsd_coefficient(style: str, ratio: float) -> float:
    """Megatron's WSD anneal: the share of max_lr - min_lr left at `ratio` (0 at the anneal's start, 1 at its end)."""
    if style == "linear":
        return 1.0 - ratio
    if style == "cosine":
        return 0.5 * (math.cos(math.pi * ratio) + 1.0)
    if style == "exponential":
        return 2.0 * math.pow(0.5, ratio) - 1.0
    return 1.0 - math.sqrt(ratio)  # minus_sqrt, and swiss-ai's fork's 1-sqrt


def train_iterations(training: TrainingConfig, batch: BatchSchedule) -> int:
    """--train-iters, or the iterations --train-samples makes (Megatron-LM's update_train_iters). A --train-samples
    below one global batch, 0 iterations there, is refused."""
    if training.train_samples is None:
        return training.train_iters
    if batch.steps is not None:
        # a last partial batch still counts under a step schedule
        iterations, consumed = 0, 0
        while consumed < training.train_samples and not batch.constant_after(consumed):
            consumed += batch.global_batch_at(consumed)
            iterations += 1
        left = max(0, training.train_samples - consumed)
        return iterations + -(-left // batch.global_batch_size)
    if batch.rampup is None:
        if training.train_samples < batch.global_batch_size:
            raise ConfigError(f"--train-samples {training.train_samples} is below one global batch "
                              f"({batch.global_batch_size} samples, --global-batch-size): the run would train 0 "
                              f"iterations; pass --train-samples {batch.global_batch_size} or more")
        return training.train_samples // batch.global_batch_size
    iterations, consumed = 0, 0
    while consumed <= batch.rampup[2] and consumed <= training.train_samples:  # the ramp
        consumed += batch.global_batch_at(consumed)
        iterations += 1
    if training.train_samples > consumed:  # then whole batches; a last partial one is dropped
        iterations += (training.train_samples - consumed) // batch.global_batch_size
    return iterations


def build_lr_schedule(optimizer: OptimizerConfig, training: TrainingConfig, seq_length: int,
                      batch: BatchSchedule) -> LearningRateSchedule:
    """Megatron's get_optimizer_param_scheduler, in samples (and tokens), for this run's batches."""
    if training.train_samples is None:
        decay = (optimizer.lr_decay_iters or training.train_iters) * batch.lr_schedule_batch
        warmup = optimizer.lr_warmup_iters * batch.lr_schedule_batch
        wsd, wsd_flag = optimizer.lr_wsd_decay_iters, "--lr-wsd-decay-iters"
        wsd = None if wsd is None else wsd * batch.lr_schedule_batch
    else:
        decay = optimizer.lr_decay_samples or training.train_samples
        warmup = optimizer.lr_warmup_samples
        wsd, wsd_flag = optimizer.lr_wsd_decay_samples, "--lr-wsd-decay-samples"
    if optimizer.lr_decay_style == "WSD":
        if wsd is None:
            raise ConfigError(f"--lr-decay-style WSD needs {wsd_flag}: the length of the anneal at the end of the "
                              f"decay", flags=("--lr-decay-style", wsd_flag))
        if optimizer.lr_decay_tokens is not None:
            raise ConfigError("--lr-decay-style WSD counts samples (Megatron-LM); --lr-decay-tokens (Megatron-"
                              "DeepSpeed's) is not read with it: drop one", flags=("--lr-decay-style", "--lr-decay-tokens"))
    if optimizer.lr_warmup_fraction is not None:
        warmup = optimizer.lr_warmup_fraction * decay
    warmup_end_tokens = 0.0
    if optimizer.lr_decay_tokens is not None and optimizer.lr_warmup_tokens is None and warmup > 0:
        ended = 0
        while ended < warmup:
            ended += batch.global_batch_at(ended)
        warmup_end_tokens = tokens_seen_by_schedule(batch, ended, seq_length)
    return LearningRateSchedule(
        max_lr=optimizer.lr, min_lr=optimizer.min_lr, style=optimizer.lr_decay_style, warmup_samples=warmup,
        decay_samples=decay, init_lr=optimizer.lr_warmup_init, warmup_tokens=optimizer.lr_warmup_tokens,
        decay_tokens=optimizer.lr_decay_tokens, warmup_end_tokens=warmup_end_tokens,
        wsd_decay_samples=wsd if optimizer.lr_decay_style == "WSD" else None, wsd_style=optimizer.lr_wsd_decay_style)


def tokens_seen_by_schedule(batch: BatchSchedule, consumed_samples: int, seq_length: int) -> int:
    """The tokens Megatron-DeepSpeed's scheduler sees after `consumed_samples`: its counter lags by the last
    iteration."""
    if consumed_samples == 0:
        return 0
    previous = 0
    while True:
        if batch.constant_after(previous):
            return (consumed_samples - batch.global_batch_size) * seq_length
        following = previous + batch.global_batch_at(previous)
        if following >= consumed_samples:
            return previous * seq_length
        previous = following


# What Megatron's scheduler compares with its checkpoint on resume.
COMPARED_ON_RESUME = (("max_lr", "learning rate"), ("min_lr", "minimum learning rate"),
                      ("warmup_samples", "warmup (samples)"), ("warmup_tokens", "warmup tokens"),
                      ("decay_samples", "decay (samples)"), ("decay_tokens", "decay tokens"),
                      ("style", "decay style"))


def schedule_on_resume(optimizer: OptimizerConfig, training: TrainingConfig, seq_length: int, batch: BatchSchedule,
                       saved: dict, iteration_dir) -> tuple[Optional[LearningRateSchedule], Optional[str]]:
    """Megatron's resume rule against the checkpoint's recorded config `saved`: (None, None) when equal; else an error
    naming each difference, unless --override-opt_param-scheduler (None, note) or --use-checkpoint-opt_param-scheduler
    (the checkpoint's schedule, note)."""
    then_optimizer = replace_settings(optimizer, **{name: value for name, value in saved.get("optimizer", {}).items()
                                                   if name in setting_names(OptimizerConfig)})
    saved_training = saved.get("training", {})
    then_training = dataclasses.replace(training, **{name: saved_training[name] for name in
                                                     ("train_iters", "train_samples", "global_batch_size")
                                                     if name in saved_training})
    ramp = saved_training.get("rampup_batch_size")
    then_batch = dataclasses.replace(batch, global_batch_size=then_training.global_batch_size,
                                     rampup=tuple(ramp) if ramp else None)
    return resumed_schedule(optimizer, training, build_lr_schedule(optimizer, training, seq_length, batch),
                            build_lr_schedule(then_optimizer, then_training, seq_length, then_batch), iteration_dir)


def resumed_schedule(optimizer: OptimizerConfig, training: TrainingConfig, ours: LearningRateSchedule,
                     theirs: LearningRateSchedule, iteration_dir) -> tuple[Optional[LearningRateSchedule], Optional[str]]:
    """`schedule_on_resume`'s rule between this run's schedule and the checkpoint's, whatever format recorded it."""
    differences = [f"{label} {getattr(ours, name)} (the checkpoint's: {getattr(theirs, name)})"
                   for name, label in COMPARED_ON_RESUME if getattr(ours, name) != getattr(theirs, name)]
    if not differences:
        return None, None
    listed = "; ".join(differences)
    if optimizer.override_opt_param_scheduler:
        return None, f"> resuming {iteration_dir} with this run's learning-rate schedule ({listed}), as " \
                     f"--override-opt_param-scheduler asks"
    if optimizer.use_checkpoint_opt_param_scheduler:
        return theirs, f"> resuming {iteration_dir} with the checkpoint's learning-rate schedule instead of this " \
                       f"run's ({listed}), as --use-checkpoint-opt_param-scheduler asks"
    length = "--train-samples" if training.train_samples is not None else "--train-iters"
    raise ConfigError(f"resuming {iteration_dir}: the learning-rate schedule differs from the checkpoint's ({listed}); "
                      f"to stop and resume one run, give every part the final length and stop early: {length} FINAL "
                      f"--exit-interval K (docs/checkpoints.md); for this checkpoint, as in Megatron, pass "
                      f"--override-opt_param-scheduler to use this run's schedule, or "
                      f"--use-checkpoint-opt_param-scheduler to keep the checkpoint's")
