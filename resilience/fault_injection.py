"""The fault injector driven from the training loop (training/loop.py), as Megatron-LM's train() drives
Megatron-Core's (megatron/training/training.py): the plan drawn once on every rank from
--fault-injector-seed (rendezvous/fault_injector.py), a start-up line saying what will be injected where and
when, the fault armed on its ranks at the start of training or once the iteration of
--fault-injector-delay-start-iteration is done, its save included, and the workload exception polled after every
step but the run's first. The gpu_* faults act as nvidia-resiliency-ext's do (an out-of-bounds index on the device; a
kernel that sleeps forever).

An injected fault is one fault. After a recovery (an in-process restart's next incarnation, a torchrun restart)
Megatron-LM sets the injector up again: with --fault-injector-fault-delay the same fault at the same point, which
fires again and again (a run reached in-process restart 547 that way), and with the delay-start iteration inside the
checkpoint interval every restart resumes from the save before it and meets it again. Here:
- a plan with a fixed delay is armed in the job's first start only; a restart says in one line that it is not armed
  again;
- an MTTI plan draws the next fault from the recovery on: the restart's plan is the next one of the seed's stream,
  as Megatron-Core's module-level rng draws on at each set-up in one process;
- the clock of --fault-injector-delay-start-iteration starts once that iteration's save (if it saves) has
  completed, not before it as in Megatron-LM, where a fault of delay 0 lands inside the save and a restart resumes
  from the save before (with --async-save, once the save is staged: its background write may be lost with the
  fault, and the restart resumes from the save before it, which the rule above keeps from looping)."""

from __future__ import annotations

import secrets
import time
from typing import Callable, Optional

import torch

from parallel.state import ParallelState
from rendezvous.fault_injector import FaultInjector, FaultInjectorSettings, FaultPlan, draw_plan


class FaultSchedule:
    """One run's plan on this rank, and the loop's two calls into it."""

    def __init__(self, settings: FaultInjectorSettings, plan: FaultPlan, state: ParallelState,
                 start_iteration: int) -> None:
        self.settings, self.plan, self.start_iteration = settings, plan, start_iteration
        self.targeted = state.rank in plan.ranks
        self.injector = FaultInjector("fault injector", gpu_faults=_gpu_faults(state.device))
        self.armed_at: Optional[float] = None  # time.monotonic() when the clock started

    def start(self) -> None:
        """At the start of training: the clock starts now unless --fault-injector-delay-start-iteration is given."""
        if self.settings.delay_start_iteration is None:
            self._arm()

    def after_step(self, iteration: int) -> None:
        """After the step logged as `iteration` (1-based; Megatron's counter is iteration - 1 there): the workload
        exception's poll, before the step is logged or saved."""
        if iteration - 1 != self.start_iteration:
            self.injector.poll(f"after iteration {iteration}")

    def after_iteration(self, iteration: int) -> None:
        """Once iteration `iteration` is done, its save included: the clock of --fault-injector-delay-start-iteration
        starts (module docstring)."""
        if self.settings.delay_start_iteration == iteration - 1:
            self._arm()

    def end(self, log: Optional[Callable[[str], None]] = None) -> None:
        """Training is over (returned, or raised): a fault not yet due is not injected. `log` (when it returned): one
        line where the plan's delay had not run out, on every rank, since every rank holds the plan."""
        self.injector.cancel()
        if log is not None and self.armed_at is not None and time.monotonic() - self.armed_at < self.plan.delay_s:
            log(f"> fault injector: training ended {time.monotonic() - self.armed_at:.3f} s after the injector was "
                f"armed, before its {self.plan.fault} was due ({self.plan.delay_s:.3f} s): nothing injected")

    def _arm(self) -> None:
        self.armed_at = time.monotonic()
        if self.targeted:
            self.injector.arm(self.plan.fault, self.plan.delay_s)


def plan_faults(settings: FaultInjectorSettings, state: ParallelState, start_iteration: int,
                log: Callable[[str], None], restart: int = 0) -> Optional[FaultSchedule]:
    """The run's schedule, or None when the injector is off or, at `restart` > 0, its one fault was planned already
    (module docstring). Without --fault-injector-seed rank 0 draws a seed every rank takes (Megatron-Core draws on
    rank 0 and broadcasts the plan)."""
    if not settings.enabled:
        return None
    settings.check_world(state.world_size)
    if restart and settings.fault_delay is not None:
        log(f"> fault injector: not armed again at restart {restart}: --fault-injector-fault-delay plans one fault, "
            f"injected before the recovery (an MTTI plan, --fault-injector-mtti-seconds, draws the next one)")
        return None
    seed = settings.seed
    if seed is None:
        seed = state.comm.all_gather_object(secrets.randbits(63))[0] if state.world_size > 1 else secrets.randbits(63)
    plan = draw_plan(settings, state.world_size, seed, index=restart)
    log(f"> {plan.describe(settings)} (seed {seed}{f', plan {restart + 1} of its stream' if restart else ''})")
    return FaultSchedule(settings, plan, state, start_iteration)


def _gpu_faults(device: torch.device) -> dict[str, Callable[[], None]]:
    if device.type != "cuda":
        return {}  # refused before any work (rendezvous/fault_injector.py, check)

    def gpu_error() -> None:
        index = torch.ones(1, dtype=torch.int64, device=device)
        torch.ones(1, dtype=torch.int64, device=device)[index] = 0  # out of bounds: a device-side assert
        torch.cuda.synchronize(device)

    def gpu_sleep() -> None:
        torch.cuda.set_device(device)
        torch.cuda._sleep(1 << 62)

    return {"gpu_error": gpu_error, "gpu_sleep": gpu_sleep}
