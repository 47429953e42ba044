"""The global batch of every iteration, as a pure function of the samples consumed before it.

Without a ramp it is one number: micro batch x accumulation steps x data-parallel size. Which two of the three
settings determine the third follows DeepSpeed's "specify two of the three": explicit settings (command line or
DeepSpeed JSON) win over a preset's or the defaults, and three explicit ones must agree. Where the command line and
the JSON both speak, the real Megatron-DeepSpeed + DeepSpeed pair decides (arguments/deepspeed/precedence.py):
Megatron's flags win and the JSON fills in what they leave open in the order of DeepSpeed's set_train_batch_size
(the micro batch, then the global batch) except beside a command-line micro batch, where the JSON's accumulation
steps come first (DeepSpeedExamples' forks had no global batch) (`json_batch_settings_not_used`). The JSON's own
three keys are also checked against the DP size as DeepSpeed's initialize checks them (`check_deepspeed_batch`).

With Megatron's `--rampup-batch-size START INCREMENT SAMPLES` the global batch starts at START and grows by INCREMENT
each time another SAMPLES / ((GLOBAL - START) / INCREMENT) samples are consumed, reaching --global-batch-size once
SAMPLES have (RampupBatchsizeNumMicroBatchesCalculator's arithmetic). The batch depending only on consumed samples,
a resumed run continues the ramp exactly, and the sampler needs no other state. With Megatron-LM main's `--step-batch-size-schedule "THRESHOLD:BATCH ..."` (arguments/step_batch_schedule.py) the
global batch is the BATCH of the last THRESHOLD at or below the consumed samples, the run's the last entry's; as in
Megatron-LM's validate_args it excludes --global-batch-size, and every entry must split into whole micro batch x DP
chunks."""

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
    # --step-batch-size-schedule: ((from samples consumed, global batch), ...), the first from 0
    steps: Optional[tuple[tuple[int, int], ...]] = None
    # DeepSpeed JSON batch values the run does not use, each said once at start (a warning line)
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def samples_per_micro_step(self) -> int:
        """Samples all data-parallel ranks read together, one micro-batch each."""
        return self.micro_batch_size * self.data_parallel_size

    def global_batch_at(self, consumed_samples: int) -> int:
        """The global batch of the iteration that starts after `consumed_samples`."""
        if self.steps is not None:
            return [batch for threshold, batch in self.steps if threshold <= consumed_samples][-1]
        if self.rampup is None:
            return self.global_batch_size
        start, increment, samples = self.rampup
        increments = (self.global_batch_size - start) // increment
        # A ramp over 0 samples is no ramp (Megatron would divide by zero here).
        if increments == 0 or samples == 0 or consumed_samples > samples:
            return self.global_batch_size
        samples_per_increment = samples / increments
        return start + int(consumed_samples / samples_per_increment) * increment

    def accumulation_steps_at(self, consumed_samples: int) -> int:
        """Micro-batches each rank runs in the iteration that starts after `consumed_samples`."""
        return self.global_batch_at(consumed_samples) // self.samples_per_micro_step

    def constant_after(self, consumed_samples: int) -> bool:
        """Whether every iteration from `consumed_samples` on has the final global batch."""
        if self.steps is not None:
            return consumed_samples >= self.steps[-1][0]
        return self.rampup is None or consumed_samples > self.rampup[2]

    @property
    def lr_schedule_batch(self) -> int:
        """The batch Megatron multiplies iterations by for the learning-rate schedule (lr_decay_iters x
        args.global_batch_size, megatron/training/training.py get_optimizer_param_scheduler). Under a step
        schedule args.global_batch_size was never given (validate_args refuses it) and is set to micro
        batch x data-parallel size; under a ramp it is the final batch."""
        return self.samples_per_micro_step if self.steps is not None else self.global_batch_size

    @property
    def final_accumulation_steps(self) -> int:
        return self.global_batch_size // self.samples_per_micro_step

    def consumed_after(self, iterations: int, consumed_samples: int = 0) -> int:
        """Samples consumed after `iterations` more iterations, starting from `consumed_samples`."""
        for done in range(iterations):
            if self.constant_after(consumed_samples):  # the rest is constant
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
    """The schedule for a data-parallel size; a ConfigError naming the flags (and where their values
    came from) when the sizes do not divide, or when the DeepSpeed JSON's own batch keys do not fit
    this data-parallel size (DeepSpeed's check; `deepspeed_check=False` skips it, for a data-parallel
    size that is only a stand-in). Reads the config, never writes it."""
    if deepspeed_check:
        check_deepspeed_batch(config.deepspeed_batch, data_parallel_size)
    training, sources = config.training, config.sources
    per_step = training.micro_batch_size * data_parallel_size
    explicit = {name for name in ("micro_batch_size", "global_batch_size", "accumulation_steps")
                if name in sources and sources[name].kind in (JSON, FLAG)}
    micro, global_batch = training.micro_batch_size, training.global_batch_size
    if training.accumulation_steps is not None and "global_batch_size" in explicit:
        steps = training.accumulation_steps
        if "micro_batch_size" not in explicit:  # DeepSpeed infers the micro batch from the other two
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
        # Megatron-LM raises this in validate_args (its own GPT-3 example passes both, and stops there).
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
    """`--global-batch-size 16 (ds.json: train_batch_size)`: the flag, its value and where it came from."""
    source = sources.get(name)
    where = f" ({source.describe()})" if source is not None and source.kind != DEFAULT else ""
    return f"{FLAGS[name]} {value}{where}"


# ---- the DeepSpeed JSON's batch keys ---------------------------------------------------------------

JSON_KEYS = {"micro_batch_size": "train_micro_batch_size_per_gpu", "global_batch_size": "train_batch_size",
             "accumulation_steps": "gradient_accumulation_steps"}
# set_train_batch_size keeps the micro batch, takes the global batch and derives the accumulation steps.
DETERMINING_ORDER = ("micro_batch_size", "global_batch_size", "accumulation_steps")


def json_batch_settings_not_used(given_by_flags: set[str], given_by_json: set[str], rampup: bool) -> set[str]:
    """The batch settings the JSON gives that must not count as explicit, beyond those a flag sets
    itself. With no batch flag (and no ramp) the JSON alone is DeepSpeed's config and all its keys
    count (three must agree, as DeepSpeed checks). Otherwise the flags determine the batch and the JSON
    fills in what they leave open: two settings determine the third, taken flags first, then the
    JSON's in DETERMINING_ORDER; a JSON value for the third is not used, as set_train_batch_size
    replaces DeepSpeed's accumulation steps every iteration. Under a ramp it replaces them every
    iteration too, so the JSON's gradient_accumulation_steps never counts."""
    if not given_by_flags and not rampup:
        return set()
    candidates = [name for name in DETERMINING_ORDER if name in given_by_flags]
    # A micro batch from the command line is Megatron's per-rank batch, and the global batch follows from
    # it: Megatron-DeepSpeed's default --global-batch-size is micro x DP, and DeepSpeedExamples' Megatron
    # forks (which have no global batch) step DeepSpeed's engine every gradient_accumulation_steps
    # micro-batches. Either way the JSON's train_batch_size is only DeepSpeed's own view of the batch.
    json_order = (("accumulation_steps", "global_batch_size") if "micro_batch_size" in given_by_flags
                  else DETERMINING_ORDER)
    candidates += [name for name in json_order if name in given_by_json and name not in given_by_flags]
    determining = set(candidates[:2])
    dropped = {name for name in given_by_json if name not in given_by_flags and name not in determining}
    if rampup and "accumulation_steps" in given_by_json and "accumulation_steps" not in given_by_flags:
        dropped.add("accumulation_steps")
    return dropped


def deepspeed_batch_triple(batch: dict, data_parallel_size: int) -> Optional[tuple[int, int, int, str]]:
    """(train, micro, accumulation, which one DeepSpeed derived) as DeepSpeed's
    _set_batch_related_parameters fills a missing one in (with floor division); None when the JSON gives
    neither train_batch_size nor the micro batch (DeepSpeed asserts there; here the command line or the
    preset gives the batch)."""
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
    """DeepSpeed's own check of the JSON's batch keys at initialize (runtime/config.py
    _configure_train_batch_size: _set_batch_related_parameters, then _batch_assertion), with the
    data-parallel size as the world size it uses under Megatron's mpu."""
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
    """The problem, when the JSON's three batch keys fit no data-parallel size at all (known before
    the launch); None otherwise."""
    train, micro = batch.get("train_batch_size"), batch.get("train_micro_batch_size_per_gpu")
    steps = batch.get("gradient_accumulation_steps")
    if None in (train, micro, steps) or min(train, micro, steps) < 1 or train % (micro * steps) == 0:
        return None
    return (f"{batch.get('source', 'the DeepSpeed JSON')}: train_batch_size {train} is not "
            f"train_micro_batch_size_per_gpu {micro} x gradient_accumulation_steps {steps} x any data-parallel "
            f"size; DeepSpeed refuses this at initialize (runtime/config.py _batch_assertion), whatever the "
            f"command line says: make the JSON's batch keys agree, or keep two of them")


def _json_values_not_used(batch: dict, sources: dict, schedule: BatchSchedule) -> tuple[str, ...]:
    """A line for each JSON batch key whose value the run does not use and that the start of the run has
    not named already (a flag for the same setting is named there; the third setting, derived from the
    other two, only here, where the data-parallel size is known)."""
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
