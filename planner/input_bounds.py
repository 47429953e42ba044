"""The planner's own inputs bounded before any planning, so every command answers within seconds or refuses in one line:
GPU counts at most 2**20 (where the layout search's enumeration stays seconds), --top and --max-dry-runs in range, and a
model that cannot fit the GPUs even fully sharded in 16 bits refused at once."""

from __future__ import annotations

from arguments.bounds import MIN_PARAMETER_BYTES, parameter_lower_bound
from base.errors import ConfigError

MAX_PLANNED_GPUS = 2**20
MAX_DRY_RUN_CHECKS = 50


def check_gpu_count(flag: str, value: int) -> None:
    if not 1 <= value <= MAX_PLANNED_GPUS:
        raise ConfigError(f"{flag} {value}: give from 1 to {MAX_PLANNED_GPUS} (2**20, beyond the largest cluster "
                          f"built; the search's enumeration stays within seconds there)")


def check_search_counts(top: int, max_dry_runs: int) -> None:
    if top < 1:
        raise ConfigError(f"--top {top}: give at least 1 (the number of layouts to show)")
    if not 1 <= max_dry_runs <= MAX_DRY_RUN_CHECKS:
        raise ConfigError(f"--max-dry-runs {max_dry_runs}: give from 1 to {MAX_DRY_RUN_CHECKS} (each is a "
                          f"meta-device dry run of seconds; --no-dry-run-check plans none)")


def check_model_fits_gpus(model, gpus: int, gpu_memory_bytes: int) -> None:
    """Refuse a model that `gpus` GPUs of `gpu_memory_bytes` cannot hold even fully sharded in 16 bits."""
    parameters, flags = parameter_lower_bound(model)
    if parameters * MIN_PARAMETER_BYTES > gpus * gpu_memory_bytes:
        raise ConfigError(f"{', '.join(flags)} make at least {parameters:.3g} parameters "
                          f"({parameters * MIN_PARAMETER_BYTES / 1e9:,.0f} GB in 16 bits), more than --gpus {gpus} of "
                          f"{gpu_memory_bytes / 1e9:,.0f} GB hold even fully sharded: more GPUs or a smaller model",
                          flags=flags)
