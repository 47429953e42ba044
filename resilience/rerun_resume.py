"""The rerun state machine's state in a checkpoint, so that a job that exited 16 (a result reproduced on this
node and device: re-run it elsewhere) re-runs that iteration once more when it is resumed, and decides.

Megatron-Core's RerunStateMachine.state_dict / load_state_dict (megatron/core/rerun_state_machine.py) and
Megatron-LM's checkpointing.py around them: the state common to every rank (mode, state, iteration) and each
rank's own (its verdict flags, its error injector's pending injection, the validation call that failed and its
result, the node and device that reproduced it, the spiky-loss maxima). Here they go into metadata.json's
`rerun_state_machine` (checkpoint/ours/sharded.py: {mode, state, current_iteration, ranks: [one per rank]}), written
when a re-run is pending. A resume takes them, as Megatron-LM's load_checkpoint does, only when the state is not
NOT_RUNNING_YET, the world, tensor-, pipeline- and data-parallel sizes are the checkpoint's and the load is no
--finetune; the machine then runs the iteration from the checkpoint (RERUNNING_FROM_CHECKPOINT).

Not saved, as in Megatron: the RNG states the re-run starts from (the checkpoint's own random states are those,
restored before the exit-16 save), the validation counts and report_stats' records. Megatron also saves the data
iterator's kept micro-batches; its resumed job drops them (loaded at the next NOT_RUNNING_YET, then cleared by
advance() before any is read), and here, as there, the resumed data loader starts at the checkpoint's consumed
samples: the same micro-batches.
"""

from __future__ import annotations

from typing import Callable, Optional

from resilience.rerun_state import RerunDiagnostic, RerunMode, RerunState, RerunStateMachine


def common_state(machine: RerunStateMachine) -> dict:
    return {"mode": machine.mode.value, "state": machine.state.name, "current_iteration": machine.current_iteration}


def rank_state(machine: RerunStateMachine) -> dict:
    """This rank's part, JSON-ready: a NaN or Inf result is kept as its repr ("nan", "inf"), which JSON numbers
    cannot carry; float() reads it back."""
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
    """What a save writes for `machine`: {"common": ..., "rank": ...} while a re-run is pending (every rank's
    machine is in the same state: its verdicts are all-reduced), else None."""
    if machine is None or machine.state == RerunState.NOT_RUNNING_YET:
        return None
    return {"common": common_state(machine), "rank": rank_state(machine)}


def load_machine_state(machine: RerunStateMachine, saved: dict, rank: int) -> None:
    """Megatron's load_state_dict: the checkpoint's mode (it overrides this run's, as there), state and iteration,
    and rank `rank`'s own part."""
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
    """After the load: the checkpoint's pending re-run (`saved`, metadata.json's entry; None without one) into
    `machine` (None: --rerun-mode disabled), or one line saying why it is ignored. `layout_changed`: how this job's
    grid differs from the checkpoint's, None when it is the same."""
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
