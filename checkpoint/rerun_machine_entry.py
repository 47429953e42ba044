"""metadata.json's `rerun_state_machine`: the rerun state machine's pending re-run, one part per rank, restored (as
Megatron-LM's load_checkpoint does) only when the job's grid is the checkpoint's.
"""

from __future__ import annotations

from typing import Any, Optional

from parallel.state import ParallelState

ENTRY = "rerun_state_machine"
STATES = ("NOT_RUNNING_YET", "INITIAL_RUN", "RERUNNING_IN_PLACE", "WILL_RERUN_FROM_CHECKPOINT",
          "RERUNNING_FROM_CHECKPOINT", "RERUNNING_AGAIN_FROM_CHECKPOINT")
MODES = ("disabled", "validate_results", "report_stats")
RANK_FLAGS = ("rerun_requested", "checkpoint_requested", "restart_again_requested", "continue_requested")


def _text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _rank_part(part: Any) -> bool:
    if not isinstance(part, dict) or any(not isinstance(part.get(flag), bool) for flag in RANK_FLAGS):
        return False
    injector, call = part.get("error_injector"), part.get("failed_validation_call")
    return (isinstance(injector, dict) and isinstance(injector.get("error_injection_rate"), int)
            and isinstance(injector.get("error_injection_type"), str) and _text_or_none(injector.get("injected_error_type"))
            and (call is None or (isinstance(call, list) and len(call) == 2 and isinstance(call[0], str)
                                  and isinstance(call[1], int)))
            and all(_text_or_none(part.get(key)) for key in ("initial_result", "suspicious_node", "suspicious_device"))
            and isinstance(part.get("large_value_counts"), dict) and isinstance(part.get("max_values"), dict))


def is_entry(value: Any) -> bool:
    """The shape checkpoint/schema.py checks before anything reads it."""
    return (isinstance(value, dict) and value.get("mode") in MODES and value.get("state") in STATES
            and isinstance(value.get("current_iteration"), int) and isinstance(value.get("ranks"), list)
            and len(value["ranks"]) >= 1 and all(_rank_part(part) for part in value["ranks"]))


def layout_change(metadata: dict, state: ParallelState) -> Optional[str]:
    """How this job's grid differs from the one that saved the entry, in words; None when it is the same."""
    sizes = (("world size", len(metadata[ENTRY]["ranks"]), state.world_size),
             ("TP", metadata["tensor_parallel_size"], state.tensor_parallel_size),
             ("PP", metadata.get("pipeline_parallel_size", 1), state.pipeline_parallel_size),
             ("DP", metadata["data_parallel_size"], state.data_parallel_size))
    changed = [f"{name} {saved} -> {now}" for name, saved, now in sizes if saved != now]
    return ", ".join(changed) if changed else None


def saved_rerun_state(metadata: dict, state: ParallelState) -> tuple[Optional[dict], Optional[str]]:
    """(the entry or None, how the layout changed or None)."""
    entry = metadata.get(ENTRY)
    return (entry, layout_change(metadata, state)) if entry is not None else (None, None)
