"""The global batch of every iteration, as a pure function of the samples consumed before it.

Without a ramp it is one number: micro batch x accumulation steps x data-parallel size. Which two of
the three batch settings determine the third follows DeepSpeed's rule ("specify two of the three"):
the settings given explicitly (on the command line or in the DeepSpeed JSON) win over a preset's or
the defaults, and three explicit ones must agree.

With Megatron's `--rampup-batch-size START INCREMENT SAMPLES`, the global batch starts at START and
grows by INCREMENT each time another SAMPLES / ((GLOBAL - START) / INCREMENT) samples have been
consumed, reaching --global-batch-size once SAMPLES have (Megatron's
RampupBatchsizeNumMicroBatchesCalculator, the same arithmetic). Because the batch depends only on
consumed samples, a run resumed from a checkpoint (which records them) continues the ramp exactly;
the sampler needs no state beyond consumed samples either, since every batch of the ramp is a whole
number of micro batch x data-parallel chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gpt.config import PretrainConfig
from gpt.config_sources import DEFAULT, FLAG, JSON, Source
from gpt.errors import ConfigError


@dataclass(frozen=True)
class BatchSchedule:
    micro_batch_size: int
    data_parallel_size: int
    global_batch_size: int                  # after the ramp (the whole run without one)
    rampup: Optional[tuple[int, int, int]]  # START, INCREMENT, SAMPLES

    @property
    def samples_per_micro_step(self) -> int:
        """Samples all data-parallel ranks read together, one micro-batch each."""
        return self.micro_batch_size * self.data_parallel_size

    def global_batch_at(self, consumed_samples: int) -> int:
        """The global batch of the iteration that starts after `consumed_samples`."""
        if self.rampup is None:
            return self.global_batch_size
        start, increment, samples = self.rampup
        increments = (self.global_batch_size - start) // increment
        if increments == 0 or consumed_samples > samples:
            return self.global_batch_size
        samples_per_increment = samples / increments
        return start + int(consumed_samples / samples_per_increment) * increment

    def accumulation_steps_at(self, consumed_samples: int) -> int:
        """Micro-batches each rank runs in the iteration that starts after `consumed_samples`."""
        return self.global_batch_at(consumed_samples) // self.samples_per_micro_step

    @property
    def final_accumulation_steps(self) -> int:
        return self.global_batch_size // self.samples_per_micro_step

    def consumed_after(self, iterations: int, consumed_samples: int = 0) -> int:
        """Samples consumed after `iterations` more iterations, starting from `consumed_samples`."""
        for done in range(iterations):
            if self.rampup is None or consumed_samples > self.rampup[2]:  # the rest is constant
                return consumed_samples + (iterations - done) * self.global_batch_size
            consumed_samples += self.global_batch_at(consumed_samples)
        return consumed_samples

    def describe(self) -> str:
        if self.rampup is None:
            return str(self.global_batch_size)
        start, increment, samples = self.rampup
        return (f"{start} growing by {increment} over the first {samples:,} samples to {self.global_batch_size} "
                f"(--rampup-batch-size)")


def batch_schedule(config: PretrainConfig, data_parallel_size: int) -> BatchSchedule:
    """The schedule for a data-parallel size; a ConfigError naming the flags (and where their values
    came from) when the sizes do not divide. Reads the config, never writes it."""
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
    return BatchSchedule(micro, data_parallel_size, global_batch, rampup)


FLAGS = {"micro_batch_size": "--micro-batch-size", "global_batch_size": "--global-batch-size",
         "accumulation_steps": "--gradient-accumulation-steps"}


def _named(name: str, value: int, sources: dict[str, Source]) -> str:
    """`--global-batch-size 16 (ds.json: train_batch_size)`: the flag, its value and where it came from."""
    source = sources.get(name)
    where = f" ({source.describe()})" if source is not None and source.kind != DEFAULT else ""
    return f"{FLAGS[name]} {value}{where}"
