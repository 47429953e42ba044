"""The fault injector driven from the training loop, as Megatron-LM's train() drives Megatron-Core's. Unlike
Megatron-LM, a fixed-delay fault is armed only in the job's first start and the delay-start clock begins after that
iteration's save, so a restart does not meet the same fault for ever."""

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
        self.armed_at: Optional[float] = None

    def start(self) -> None:
        if self.settings.delay_start_iteration is None:
            self._arm()

    def after_step(self, iteration: int) -> None:
        """After the step logged as `iteration` (1-based; Megatron's counter is iteration - 1 there): poll the workload
        fault before the step is logged or saved."""
        if iteration - 1 != self.start_iteration:
            self.injector.poll(f"after iteration {iteration}")

    def after_iteration(self, iteration: int) -> None:
        """Once `iteration` is done, its save included, the delay-start clock starts."""
        if self.settings.delay_start_iteration == iteration - 1:
            self._arm()

    def end(self, log: Optional[Callable[[str], None]] = None) -> None:
        """A fault not yet due is not injected; `log`: say so in one line where the delay had not run out."""
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
    """The run's schedule, or None when off or (at `restart` > 0) the one fault was planned already. Without
    --fault-injector-seed, rank 0 draws a seed every rank takes."""
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
        return {}

    def gpu_error() -> None:
        index = torch.ones(1, dtype=torch.int64, device=device)
        torch.ones(1, dtype=torch.int64, device=device)[index] = 0  # out of bounds: a device-side assert
        torch.cuda.synchronize(device)

    def gpu_sleep() -> None:
        torch.cuda.set_device(device)
        torch.cuda._sleep(1 << 62)

    return {"gpu_error": gpu_error, "gpu_sleep": gpu_sleep}
