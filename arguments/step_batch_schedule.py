"""Megatron-LM's `--step-batch-size-schedule "THRESHOLD:BATCH ..."` parsed as its StepBatchsizeNumMicroBatchesCalculator
parses it: thresholds in tokens (K/M/B/T suffixes) floor-divided into samples, sorted, the first 0, strictly increasing,
batches positive."""

from __future__ import annotations

from base.errors import ConfigError

FLAG = "--step-batch-size-schedule"
SUFFIXES = {"T": 10**12, "B": 10**9, "M": 10**6, "K": 10**3}


def _number(text: str, entry: str, schedule: str) -> int:
    text = text.strip().upper()
    multiplier = SUFFIXES.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in SUFFIXES else text
    try:
        return int(float(digits) * multiplier)
    except ValueError:
        raise ConfigError(f"{FLAG} {schedule!r}: {entry!r} is not THRESHOLD:BATCH with numbers (suffixes K, M, B, "
                          f"T allowed), e.g. \"0:16 2.4B:320\"", flags=(FLAG,)) from None


def parse_step_schedule(schedule: str, seq_length: int) -> tuple[tuple[int, int], ...]:
    """((threshold in samples, global batch), ...) sorted; a ConfigError naming the flag for what Megatron would assert
    on."""
    steps = []
    for entry in schedule.strip().replace(",", " ").split():
        if ":" not in entry:
            raise ConfigError(f"{FLAG} {schedule!r}: entry {entry!r} has no ':'; each entry is THRESHOLD:BATCH "
                              f"(THRESHOLD in tokens), e.g. \"0:16 2.4B:320\"", flags=(FLAG,))
        threshold, batch = entry.split(":", 1)
        steps.append((_number(threshold, entry, schedule) // seq_length, _number(batch, entry, schedule)))
    steps.sort(key=lambda step: step[0])
    if not steps or steps[0][0] != 0:
        raise ConfigError(f"{FLAG} {schedule!r}: the first threshold must be 0 (the batch the run starts with), "
                          f"as Megatron-LM asserts", flags=(FLAG,))
    for (before, _), (after, _) in zip(steps, steps[1:]):
        if after <= before:
            raise ConfigError(f"{FLAG} {schedule!r}: thresholds must strictly increase in samples (tokens // "
                              f"--seq-length {seq_length}); {before:,} is followed by {after:,}",
                              flags=(FLAG, "--seq-length"))
    if any(batch < 1 for _, batch in steps):
        raise ConfigError(f"{FLAG} {schedule!r}: every batch must be at least 1", flags=(FLAG,))
    return tuple(steps)
