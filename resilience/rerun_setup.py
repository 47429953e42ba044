"""The run's rerun state machine (resilience/rerun_state.py), made before the checkpoint is loaded as Megatron-LM's
initialize makes its own (initialize_rerun_state_machine, after _set_random_seed and before load_checkpoint), and
the start-up line that says what it does."""

from __future__ import annotations

import random
import socket
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from arguments.config_sources import MEGATRON_DEFAULTS, Source
from resilience.rerun_state import ErrorInjector, RerunDiagnostic, RerunMode, RerunStateMachine, torch_rng_saver
from resilience.rerun_stats import REPORTING_INTERVAL_ITERATIONS


def rerun_mode_line(training, source: Optional[Source]) -> str:
    """What --rerun-mode does in this run, in one start-up line ("" when disabled); `source` says where its value came
    from."""
    mode = training.faults.rerun_mode
    if mode == "disabled":
        return ""
    megatron_default = source is not None and source.origin == MEGATRON_DEFAULTS
    origin = "Megatron-LM's default for a flags launch" if megatron_default else "as given"
    nan, spiky = training.faults.check_for_nan_in_loss_and_grad, training.faults.check_for_spiky_loss
    if not nan and not spiky:
        return (f"> rerun state machine: --rerun-mode {mode} ({origin}) with nothing validated "
                f"(--no-check-for-nan-in-loss-and-grad, no --check-for-spiky-loss): no iteration re-runs")
    if mode == "report_stats":
        checked = " and ".join(name for name, on in (("NaN/Inf", nan), ("spiky-loss", spiky)) if on)
        return (f"> rerun state machine: --rerun-mode report_stats ({origin}): every iteration runs twice on the "
                f"same data and RNG states; how much the losses its {checked} checks see differ between the runs is "
                f"printed every {REPORTING_INTERVAL_ITERATIONS} iterations, nothing is rejected; --rerun-mode "
                f"disabled turns it off")
    what = []
    if nan:
        what.append("a NaN or Inf loss re-runs the iteration on the same data: exit 17 when the re-run differs, a "
                    "checkpoint and exit 16 when it reproduces")
    if spiky:
        what.append("a spiky loss (10x the largest of the first 100) re-runs it and goes on")
    return f"> rerun state machine: --rerun-mode validate_results ({origin}; {'; '.join(what)}; --rerun-mode " \
           f"disabled turns it off)"


def rerun_state_machine_for(training, state, rng, log: Callable[[str], None]) -> Optional[RerunStateMachine]:
    """The machine --rerun-mode asks for (None when disabled): verdicts OR-ed over every rank, report_stats' records
    gathered to the first."""
    if training.faults.rerun_mode == "disabled":
        return None
    world = dist.group.WORLD if dist.is_available() and dist.is_initialized() and state.world_size > 1 else None

    def reduce_any(flags: list[bool]) -> list[bool]:
        votes = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=state.device)
        if world is not None:  # a vote over every rank: no group of the mesh's
            dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=world)
        return [vote > 0 for vote in votes.tolist()]

    def gather_to_first(records: dict) -> Optional[list]:
        if world is None:
            return [records]
        gathered = [None] * state.world_size if state.rank == 0 else None
        dist.gather_object(records, gathered, dst=0, group=world)
        return gathered

    def say(line: str) -> None:
        print(f" {line}", flush=True)

    # As Megatron-LM's _set_random_seed, Python's generator is seeded with --seed + 100 x the pipeline rank before the
    # load, so injections follow from --seed.
    seed = training.seed + 100 * state.pipeline_parallel_rank
    random.seed(seed)
    np.random.seed(seed)
    save, restore = torch_rng_saver(rng, state.device)
    injector = ErrorInjector(training.faults.error_injection_rate, RerunDiagnostic(training.faults.error_injection_type),
                             state.rank, say)
    return RerunStateMachine(RerunMode(training.faults.rerun_mode), rank=state.rank, reduce_any=reduce_any, save_rng=save,
                             restore_rng=restore, where=(socket.gethostname(), str(state.device)), injector=injector,
                             tracker_file=training.faults.result_rejected_tracker_filename, log=say, log_once=log,
                             gather_to_first=gather_to_first)
