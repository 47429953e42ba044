"""The global batch of every iteration as a pure function of the samples consumed before it, so a resumed run continues
a --rampup-batch-size ramp or a --step-batch-size-schedule exactly. Which two of micro batch, accumulation steps and
global batch determine the third follows DeepSpeed's "specify two of the three"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from arguments.config import PretrainConfig
from arguments.config_sources import DEFAULT, FLAG, JSON, Source
from arguments.deepspeed.keys import PRECEDENCE
from arguments.step_batch_schedule import parse_step_schedule
from arguments.training_config import TrainingConfig
from base.errors import ConfigError


@dataclass(frozen=True)
class BatchSchedule:
    micro_batch_size: int
    data_parallel_size: int
    global_batch_size: int                  # after the ramp (the whole run without one)
    rampup: Optional[tuple[int, int, int]]  # START, INCREMENT, SAMPLES
    # --step-batch-size-schedule: ((from samples consumed, global batch), ...)
    steps: Optional[tuple[tuple[int, int], ...]] = None
    # JSON batch values the run does not use, said once
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def samples_per_micro_step(self) -> int:
        """Samples all data-parallel ranks read together, one micro-batch each."""
        return self.micro_batch_size * self.data_parallel_size

    def global_batch_at(self, consumed_samples: int) -> int:
        if self.steps is not None:
            return [batch for threshold, batch in self.steps if threshold <= consumed_samples][-1]
        if self.rampup is None:
            return self.global_batch_size
        start, increment, samples = self.rampup
        increments = (self.global_batch_size - start) // increment
        # a ramp over 0 samples is no ramp (Megatron would divide by zero)
        if increments == 0 or samples == 0 or consumed_samples > samples:
            return self.global_batch_size
        samples_per_increment = samples / increments
        return start + int(consumed_samples / samples_per_increment) * increment

    def accumulation_steps_at(self, consumed_samples: int) -> int:
        return self.global_batch_at(consumed_samples) // self.samples_per_micro_step

    def constant_after(self, consumed_samples: int) -> bool:
        if self.steps is not None:
            return consumed_samples >= self.steps[-1][0]
        return self.rampup is None or consumed_samples > self.rampup[2]

    @property
    def lr_schedule_batch(self) -> int:
        """The batch Megatron multiplies iterations by for the learning-rate schedule: micro batch x DP under a step
        schedule (no --global-batch-size there), else the final batch."""
        return self.samples_per_micro_step if self.steps is not None else self.global_batch_size

    @property
    def final_accumulation_steps(self) -> int:
        return self.global_batch_size // self.samples_per_micro_step

    def consumed_after(self, iterations: int, consumed_samples: int = 0) -> int:
        for done in range(iterations):
            if self.constant_after(consumed_samples):
                return consumed_samples + (iterations - done) * self.global_batch_size
            consumed_samples += self.global_batch_at(consumed_samples)
        return consumed_samples

    def describe(self) -> str:
        if self.steps is not None:
            steps = ", ".join(f"{batch} from {threshold:,} samples" for threshold, batch in self.steps)
            return f"{self.global_batch_size} in steps ({steps}; --step-batch-size-schedule)"
        if self.rampup is None:
            return str(self.global_batch_size)
        start, increment, samples = self.rampup
        return (f"{start} growing by {increment} over the first {samples:,} samples to {self.global_batch_size} "
                f"(--rampup-batch-size)")


def batch_schedule(config: PretrainConfig, data_parallel_size: int, deepspeed_check: bool = True) -> BatchSchedule:
    """The schedule at a data-parallel size; a ConfigError naming the flags and their sources where the sizes do not
    divide or the JSON's own batch keys do not fit (`deepspeed_check=False` skips that, for a stand-in size)."""
    if deepspeed_check:
        check_deepspeed_batch(config.deepspeed_batch, data_parallel_size)
    training, sources = config.training, config.sources
    per_step = training.micro_batch_size * data_parallel_size
    explicit = {name for name in ("micro_batch_size", "global_batch_size", "accumulation_steps")
                if name in sources and sources[name].kind in (JSON, FLAG)}
    micro, global_batch = training.micro_batch_size, training.global_batch_size
    if training.accumulation_steps is not None and "global_batch_size" in explicit:
        steps = training.accumulation_steps
        if "micro_batch_size" not in explicit:  # DeepSpeed infers it from the other two
            if global_batch % (steps * data_parallel_size) != 0:
                raise ConfigError(f"{_named('global_batch_size', global_batch, sources)} is not divisible by "
                                  f"{_named('accumulation_steps', steps, sources)} x data-parallel size "
                                  f"{data_parallel_size}, so no micro batch size fits")
            micro = global_batch // (steps * data_parallel_size)
        elif micro * steps * data_parallel_size != global_batch:
            raise ConfigError(f"{_named('global_batch_size', global_batch, sources)} is not "
                              f"{_named('micro_batch_size', micro, sources)} x "
                              f"{_named('accumulation_steps', steps, sources)} x data-parallel size "
                              f"{data_parallel_size} = {micro * steps * data_parallel_size}; give two of the three")
    elif training.accumulation_steps is not None:
        global_batch = per_step * training.accumulation_steps
    elif global_batch % per_step != 0:
        raise ConfigError(f"{_named('global_batch_size', global_batch, sources)} is not divisible by "
                          f"{_named('micro_batch_size', micro, sources)} x data-parallel size "
                          f"{data_parallel_size} = {per_step}")
    rampup = tuple(training.rampup_batch_size) if training.rampup_batch_size is not None else None
    if rampup is not None:
        start, increment, _ = rampup
        step = micro * data_parallel_size
        if start % step or increment % step:
            raise ConfigError(f"--rampup-batch-size {' '.join(map(str, rampup))}: START and INCREMENT must be "
                              f"multiples of --micro-batch-size {micro} x data-parallel size {data_parallel_size} "
                              f"= {step}, so every batch of the ramp splits into whole micro-batches")
    steps = None
    if training.step_batch_size_schedule is not None:
        steps = _step_schedule(config.training, config.model.seq_length, config.sources, micro, data_parallel_size,
                               explicit)
        global_batch = steps[-1][1]
    schedule = BatchSchedule(micro, data_parallel_size, global_batch, rampup, steps)
    return BatchSchedule(micro, data_parallel_size, global_batch, rampup, steps,
                         notes=_json_values_not_used(config.deepspeed_batch, config.sources, schedule))


def _step_schedule(training: TrainingConfig, seq_length: int, sources: dict, micro: int, data_parallel_size: int,
                   explicit: set[str]) -> tuple[tuple[int, int], ...]:
    schedule = training.step_batch_size_schedule
    if "global_batch_size" in explicit:
        raise ConfigError(f"--step-batch-size-schedule {schedule!r} and "
                          f"{_named('global_batch_size', training.global_batch_size, sources)} "
                          f"cannot both be given (Megatron-LM refuses it too): the schedule's last batch is the "
                          f"run's global batch, so drop --global-batch-size")
    steps = parse_step_schedule(schedule, seq_length)
    step = micro * data_parallel_size
    uneven = [batch for _, batch in steps if batch % step]
    if uneven:
        raise ConfigError(f"--step-batch-size-schedule {schedule!r}: batch {uneven[0]} is not a multiple of "
                          f"--micro-batch-size {micro} x data-parallel size {data_parallel_size} = {step}; every "
                          f"batch must split into whole micro-batches")
    return steps


FLAGS = {"micro_batch_size": "--micro-batch-size", "global_batch_size": "--global-batch-size",
         "accumulation_steps": "--gradient-accumulation-steps"}


def _named(name: str, value: int, sources: dict[str, Source]) -> str:
    """`--global-batch-size 16 (ds.json: train_batch_size)`."""
    source = sources.get(name)
    where = f" ({source.describe()})" if source is not None and source.kind != DEFAULT else ""
    return f"{FLAGS[name]} {value}{where}"


# ---- the DeepSpeed JSON's batch keys ---------------------------------------------------------------

JSON_KEYS = {"micro_batch_size": "train_micro_batch_size_per_gpu", "global_batch_size": "train_batch_size",
             "accumulation_steps": "gradient_accumulation_steps"}
# set_train_batch_size keeps the micro batch, takes the global batch and derives the accumulation steps.
DETERMINING_ORDER = ("micro_batch_size", "global_batch_size", "accumulation_steps")


def json_batch_settings_not_used(given_by_flags: set[str], given_by_json: set[str], rampup: bool) -> set[str]:
    """The JSON's batch settings that do not count as explicit. With no batch flag and no ramp all count (three must
    agree). Otherwise two settings determine the third, the flags' first, then the JSON's in DETERMINING_ORDER; the
    JSON's accumulation steps never count under a ramp, which replaces them every iteration."""
    if not given_by_flags and not rampup:
        return set()
    candidates = [name for name in DETERMINING_ORDER if name in given_by_flags]
    # A command-line micro batch is Megatron's per-rank batch and the global batch follows from it, so the JSON's
    # train_batch_size is only DeepSpeed's view of it.
    json_order = (("accumulation_steps", "global_batch_size") if "micro_batch_size" in given_by_flags
                  else DETERMINING_ORDER)
    candidates += [name for name in json_order if name in given_by_json and name not in given_by_flags]
    determining = set(candidates[:2])
    dropped = {name for name in given_by_json if name not in given_by_flags and name not in determining}
    if rampup and "accumulation_steps" in given_by_json and "accumulation_steps" not in given_by_flags:
        dropped.add("accumulation_steps")
    return dropped


def deepspeed_batch_triple(batch: dict, data_parallel_size: int) -> Optional[tuple[int, int, int, str]]:
    """(train, micro, accumulation, the key DeepSpeed derived) as DeepSpeed's _set_batch_related_parameters fills a
    missing one in; None when the JSON gives neither train nor micro batch."""
    train, micro = batch.get("train_batch_size"), batch.get("train_micro_batch_size_per_gpu")
    steps, world = batch.get("gradient_accumulation_steps"), data_parallel_size
    if train is None and micro is None:
        return None
    if train is not None and micro is not None and steps is not None:
        return train, micro, steps, ""
    if train is not None and micro is not None:
        return train, micro, train // micro // world, "gradient_accumulation_steps"
    if train is not None and steps is not None:
        return train, train // world // steps, steps, "train_micro_batch_size_per_gpu"
    if micro is not None and steps is not None:
        return micro * steps * world, micro, steps, "train_batch_size"
    if train is not None:
        return train, train // world, 1, "train_micro_batch_size_per_gpu"
    return micro * world, micro, 1, "train_batch_size"


def check_deepspeed_batch(batch: dict, data_parallel_size: int) -> None:
    """DeepSpeed's check of the JSON's batch keys at initialize (_batch_assertion), the data-parallel size standing for
    its world size."""
    triple = deepspeed_batch_triple(batch, data_parallel_size)
    if triple is None:
        return
    train, micro, steps, derived = triple
    shown = {"train_batch_size": train, "train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": steps}
    said = {key: f"{key} {value}" + (" (derived as DeepSpeed derives it)" if key == derived else "")
            for key, value in shown.items()}
    source = batch.get("source", "the DeepSpeed JSON")
    for key, value in shown.items():
        if value < 1:
            raise ConfigError(f"{source}: {said[key]} must be at least 1 at data-parallel size {data_parallel_size}; "
                              f"DeepSpeed refuses it at initialize (runtime/config.py _batch_assertion)")
    if train != micro * steps * data_parallel_size:
        raise ConfigError(f"{source}: {said['train_batch_size']} is not {said['train_micro_batch_size_per_gpu']} x "
                          f"{said['gradient_accumulation_steps']} x data-parallel size {data_parallel_size} = "
                          f"{micro * steps * data_parallel_size}; DeepSpeed refuses this at initialize (runtime/"
                          f"config.py _batch_assertion), whatever the command line says: make the JSON's batch keys "
                          f"agree, or keep two of them")


def deepspeed_batch_fits_no_size(batch: dict) -> Optional[str]:
    """The problem when the JSON's three batch keys fit no data-parallel size at all; None otherwise."""
    train, micro = batch.get("train_batch_size"), batch.get("train_micro_batch_size_per_gpu")
    steps = batch.get("gradient_accumulation_steps")
    if None in (train, micro, steps) or min(train, micro, steps) < 1 or train % (micro * steps) == 0:
        return None
    return (f"{batch.get('source', 'the DeepSpeed JSON')}: train_batch_size {train} is not "
            f"train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {steps} x any data-parallel "
            f"size; DeepSpeed refuses this at initialize (runtime/config.py _batch_assertion), whatever the "
            f"command line says: make the JSON's batch keys agree, or keep two of them")


def _json_values_not_used(batch: dict, sources: dict, schedule: BatchSchedule) -> tuple[str, ...]:
    """A line for each JSON batch key the run does not use that start-up has not named (the derived third setting, named
    here once the data-parallel size is known)."""
    used = {"micro_batch_size": schedule.micro_batch_size, "global_batch_size": schedule.global_batch_size,
            "accumulation_steps": schedule.final_accumulation_steps}
    notes = []
    for name, key in JSON_KEYS.items():
        source = sources.get(name)
        if key not in batch or (source is not None and source.kind == FLAG) or batch[key] == used[name]:
            continue
        notes.append(f"{key} {batch[key]} in {batch.get('source', 'the DeepSpeed JSON')}: {FLAGS[name]} "
                     f"{used[name]} follows from the other two batch settings, as in Megatron-DeepSpeed, "
                     f"{PRECEDENCE[key].why}")
    return tuple(notes)
