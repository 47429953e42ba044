"""The planner's own inputs bounded before any planning: every command answers within seconds or refuses in one line.

- A GPU count (`search --gpus`, `dry-run`/`max-size --world-size`, `--gpus-per-node`) at most 2**20: above the
  largest cluster built (a few hundred thousand GPUs), and where the layout search's enumeration of divisors and
  splits stays seconds (measured on the 2-core CI machine: 6 s at 2**16, 14 s at 2**20 for the tiny preset, past a
  minute at 2**24); before, `--world-size 2**63` was planned and a huge `--gpus` searched for days.
- `search --top` at least 1 and `--max-dry-runs` from 1 to MAX_DRY_RUN_CHECKS: each check is a meta-device dry run
  of seconds; before, a negative value was taken (`--top -3` printed all but the last three).
- A model whose parameters cannot fit the GPUs searched even in 16 bits and fully sharded is refused at once
  (arguments/bounds.py parameter_lower_bound), not after the search has planned every layout of it.
"""

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
