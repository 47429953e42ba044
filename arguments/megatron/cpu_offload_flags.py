"""Megatron-LM's --optimizer-cpu-offload: --offload-optimizer with --optimizer-offload-fraction here, with Megatron-LM's
assertions in its words. Its hybrid optimizer is built with no state dtypes, so the precision-aware dtypes have no
effect under it (fp32 masters and moments), said once."""

from __future__ import annotations

from typing import Any, Callable, Optional

from arguments.config_sources import FLAG, JSON, Source

CPU_OFFLOAD = "--optimizer-cpu-offload"
# The precision-aware state dtypes the hybrid optimizer does not read.
STATE_DTYPES_IGNORED = ("main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
STORED_MOMENTS = ("exp_avg_dtype", "exp_avg_sq_dtype")


def ignored_state_dtypes(given: dict[str, Any], settings: dict[str, Any]) -> dict[str, str]:
    """{dest: value} of the non-fp32 state dtypes --optimizer-cpu-offload makes no effect of (empty without it)."""
    if not given.get("optimizer_cpu_offload"):
        return {}
    values = {dest: settings.get(dest, "fp32") if dest in STORED_MOMENTS else given.get(dest, "fp32")
              for dest in STATE_DTYPES_IGNORED}
    return {dest: value for dest, value in values.items() if value != "fp32"}


def resolve_cpu_offload_flags(given: dict[str, Any], settings: dict[str, Any], sources: dict[str, Source],
                              option_used: Callable[[str], Optional[str]], change: Callable, resolved) -> None:
    """--optimizer-cpu-offload as --offload-optimizer, with Megatron-LM's assertions, its notes, and the ignored state
    dtypes set back to fp32."""
    fraction = settings["optimizer_offload_fraction"]
    fraction_typed = sources["optimizer_offload_fraction"].kind in (FLAG, JSON)
    if not given.get("optimizer_cpu_offload"):
        if fraction_typed and not settings["offload_optimizer"]:
            resolved.notes.append(f"--optimizer-offload-fraction {fraction} without {CPU_OFFLOAD} (or "
                                  f"--offload-optimizer): accepted, no effect, as in Megatron-LM, which reads it only "
                                  f"in its hybrid optimizer")
        return
    if not given.get("use_precision_aware_optimizer"):
        resolved.refused.append(f"{CPU_OFFLOAD} without --use-precision-aware-optimizer: Megatron-LM asserts 'The "
                                f"optimizer cpu offload must be used in conjunction with "
                                f"`--use-precision-aware-optimizer`, as the hybrid device optimizer reuses the code "
                                f"path of this flag.'; add --use-precision-aware-optimizer --use-distributed-optimizer")
    if settings["fp8_param_gather"] and settings["fp8_recipe"] != "delayed":
        resolved.refused.append(f"{CPU_OFFLOAD} with --fp8-param-gather --fp8-recipe {settings['fp8_recipe']}: "
                                f"Megatron-LM asserts 'When `--fp8-param-gather` is enabled, the optimizer cpu offload "
                                f"must be used in conjunction with `--fp8-recipe delayed`.'")
    if settings["optimizer"] != "adam":
        resolved.refused.append(f"{CPU_OFFLOAD} with --optimizer {settings['optimizer']}: Megatron-LM asserts "
                                f"'--use-precision-aware-optimizer only supported with adam', which "
                                f"{CPU_OFFLOAD} requires (its hybrid optimizer steps torch's AdamW on the host); use "
                                f"--optimizer adam")
    change("offload_optimizer", True, "optimizer_cpu_offload",
           "Megatron-LM's hybrid CPU optimizer: the optimizer states and step of --optimizer-offload-fraction of each "
           "rank's partition on the host")
    ignored = ignored_state_dtypes(given, settings)
    for dest in STORED_MOMENTS:
        if dest in ignored:
            change(dest, "fp32", "optimizer_cpu_offload", "Megatron-LM's hybrid optimizer keeps fp32 Adam moments "
                                                          "(torch's AdamW, built with no state dtype)")
    where = ("the whole optimizer partition of each rank (its fp32 master, Adam moments and AdamW step) in host "
             "memory, as --offload-optimizer" if fraction == 1.0 else
             f"the first {fraction:g} of each rank's optimizer partition, whole parameters in order as Megatron-LM "
             f"takes them (their fp32 master, Adam moments and AdamW step) in host memory, the rest on the device"
             if fraction > 0 else "none of the optimizer partition in host memory (--optimizer-offload-fraction 0): "
                                  "the plain step on the device")
    note = f"{CPU_OFFLOAD}: Megatron-LM's hybrid CPU optimizer, {where}"
    if ignored:
        note += (f"; {', '.join(f'{option_used(dest) or _flag(dest)} {value}' for dest, value in ignored.items())} "
                 f"no effect under it, as in Megatron-LM (its hybrid optimizer keeps fp32 master weights and moments)")
    resolved.notes.append(note)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")
