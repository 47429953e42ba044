"""The rerun state machine's state in a checkpoint (metadata.json's `rerun_state_machine`), so a job that exited 16
re-runs that iteration once more when resumed, and decides. As Megatron-LM, a resume takes it only with the same
parallel sizes and no --finetune."""

from __future__ import annotations

from typing import Callable, Optional

from resilience.rerun_state import RerunDiagnostic, RerunMode, RerunState, RerunStateMachine


def common_state(machine: RerunStateMachine) -> dict:
    return {"mode": machine.mode.value, "state": machine.state.name, "current_iteration": machine.current_iteration}


def rank_state(machine: RerunStateMachine) -> dict:
    """This rank's part, JSON-ready: NaN and Inf kept as "nan" and "inf"."""
    injector = machine.injector
    return {
        "rerun_requested": machine.rerun_requested,
        "checkpoint_requested": machine.checkpoint_requested,
        "restart_again_requested": machine.restart_again_requested,
        "continue_requested": machine.continue_requested,
        "error_injector": {"error_injection_rate": injector.rate, "error_injection_type": injector.kind.value,
                           "injected_error_type": injector.injected.value if injector.injected else None},
        "failed_validation_call": list(machine.failed_call) if machine.failed_call else None,
        "initial_result": repr(machine.initial_result) if machine.initial_result is not None else None,
        "suspicious_node": machine.suspicious_where[0] if machine.suspicious_where else None,
        "suspicious_device": machine.suspicious_where[1] if machine.suspicious_where else None,
        "large_value_counts": dict(machine.value_counts),
        "max_values": dict(machine.max_values),
    }


def machine_checkpoint_state(machine: Optional[RerunStateMachine]) -> Optional[dict]:
    """What a save writes: {"common": ..., "rank": ...} while a re-run is pending, else None."""
    if machine is None or machine.state == RerunState.NOT_RUNNING_YET:
        return None
    return {"common": common_state(machine), "rank": rank_state(machine)}


def load_machine_state(machine: RerunStateMachine, saved: dict, rank: int) -> None:
    """Megatron's load_state_dict: the checkpoint's mode (it overrides this run's), state, iteration and rank `rank`'s
    part."""
    mine = saved["ranks"][rank]
    machine.mode, machine.state = RerunMode(saved["mode"]), RerunState[saved["state"]]
    machine.current_iteration = saved["current_iteration"]
    machine.rerun_requested = mine["rerun_requested"]
    machine.checkpoint_requested = mine["checkpoint_requested"]
    machine.restart_again_requested = mine["restart_again_requested"]
    machine.continue_requested = mine["continue_requested"]
    injector, saved_injector = machine.injector, mine["error_injector"]
    injector.rate = saved_injector["error_injection_rate"]
    injector.kind = RerunDiagnostic(saved_injector["error_injection_type"])
    injected = saved_injector["injected_error_type"]
    injector.injected = RerunDiagnostic(injected) if injected is not None else None
    call = mine["failed_validation_call"]
    machine.failed_call = (call[0], call[1]) if call is not None else None
    result = mine["initial_result"]
    machine.initial_result = float(result) if result is not None else None
    node, device = mine["suspicious_node"], mine["suspicious_device"]
    machine.suspicious_where = (node, device) if node is not None else None
    machine.value_counts = dict(mine["large_value_counts"])
    machine.max_values = dict(mine["max_values"])


def resume_machine(machine: Optional[RerunStateMachine], saved: Optional[dict], layout_changed: Optional[str],
                   rank: int, log: Callable[[str], None]) -> None:
    """The checkpoint's pending re-run into `machine`, or one line saying why it is ignored (`layout_changed`: how the
    grid differs)."""
    if saved is None or saved["state"] == RerunState.NOT_RUNNING_YET.name:
        return
    pending = f"a pending re-run of iteration {saved['current_iteration']} ({saved['state']})"
    if layout_changed is not None:  # Megatron-LM's load_checkpoint: "Job sharding has changed"
        log(f"> the checkpoint holds the rerun state machine's state, {pending}, saved at another layout "
            f"({layout_changed}): ignored, as Megatron-LM ignores it then; that iteration trains afresh")
    elif machine is None:
        log(f"> RerunStateMachine disabled via CLI, ignoring machine state saved in checkpoint ({pending}; "
            f"--rerun-mode validate_results would run it): that iteration trains afresh")
    else:
        load_machine_state(machine, saved, rank)
        log(f"> Getting RerunStateMachine state from checkpoint. Will rerun step ({pending}).")
