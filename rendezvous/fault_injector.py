"""Megatron-Core's fault injector with nvidia-resiliency-ext's faults, for testing what a run does when a rank fails:
the same seeded draws of ranks, fault type and delay, each fault acting from a daemon thread after its delay. It imports
no torch; resilience/fault_injection.py arms it."""

from __future__ import annotations

import ctypes
import math
import os
import random
import re
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

from base.errors import ConfigError, InjectedFault
from base.options import option
from base.waits import LONGEST_WAIT_TEXT, is_wait

# nvidia-resiliency-ext's Fault enum, in order (lower case, as the flag is written).
FAULT_TYPES = ("gpu_error", "gpu_sleep", "workload_exc", "async_exc", "signal_exc", "os_abort", "lock_gil",
               "segfault", "sigint", "sigkill", "sigterm", "sigstop")
GPU_FAULTS = ("gpu_error", "gpu_sleep")
SIGNAL_FAULTS = {"sigint": signal.SIGINT, "sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM,
                 "sigstop": signal.SIGSTOP}


@dataclass(frozen=True)
class FaultInjectorSettings:
    """The --fault-injector-* flags as Megatron-Core's FaultInjectorConfig holds them."""
    SETTING_PREFIX: ClassVar[str] = "fault_injector_"

    ranks: Optional[str] = option(
        None, group="checkpoint", metavar="R[,R...]", help="fault injector: inject on these ranks")
    num_ranks: Optional[int] = option(
        None, group="checkpoint", help="fault injector: inject on this many ranks drawn from ranks 1..N-1")
    fault_types: Optional[str] = option(
        None, group="checkpoint", metavar="TYPE[,TYPE...]",
        help="fault injector: nvidia-resiliency-ext's fault types to draw one from (workload_exc, async_exc, "
             "signal_exc, os_abort, lock_gil, segfault, sigint, sigkill, sigterm, sigstop; gpu_error, gpu_sleep "
             "on CUDA)")
    fault_probabilities: Optional[str] = option(
        None, group="checkpoint", metavar="P[,P...]", help="fault injector: each fault type's weight (normalized)")
    fault_delay: Optional[float] = option(
        None, group="checkpoint",
        help="fault injector: seconds from the start of training (or --fault-injector-delay-start-iteration) to the "
             "fault")
    delay_start_iteration: Optional[int] = option(
        None, group="checkpoint",
        help="fault injector: start the delay after the step at which Megatron's 0-based iteration count is N (the "
             "step logged as iteration N+1)")
    mtti_seconds: Optional[float] = option(
        None, group="checkpoint", help="fault injector: mean time to inject, the delay drawn exponentially when "
                                       "--fault-injector-fault-delay is not given")
    offset_seconds: Optional[float] = option(
        None, group="checkpoint", help="fault injector: seconds added to the drawn delay")
    seed: Optional[int] = option(None, group="checkpoint", help="fault injector: its RNG's seed")

    @property
    def enabled(self) -> bool:
        """On when ranks or num-ranks is given, as in Megatron-LM."""
        return self.ranks is not None or self.num_ranks is not None

    def fault_types_list(self) -> list[str]:
        return [name.strip().lower() for name in (self.fault_types or "").split(",")]

    def probabilities(self) -> list[float]:
        types = self.fault_types_list()
        if self.fault_probabilities is None:
            return [1 / len(types) for _ in types]
        weights = [float(p) for p in self.fault_probabilities.split(",")]
        return [w / sum(weights) for w in weights]

    def check(self, cuda: bool) -> None:
        """Megatron-Core's set-up asserts, as one-line errors before any work, in its order."""
        if not self.enabled:
            return
        self._check_ranks()
        if self.delay_start_iteration is not None and self.delay_start_iteration < 0:
            raise ConfigError(f"--fault-injector-delay-start-iteration {self.delay_start_iteration}: Megatron's 0-based "
                              f"iteration count never equals it, so the injector would never fire; give 0 or more",
                              flags=("--fault-injector-delay-start-iteration",))
        self._check_fault_types(cuda)
        self._check_probabilities()
        self._check_delays()

    def _check_ranks(self) -> None:
        if self.ranks is not None and self.num_ranks is not None:
            raise ConfigError("--fault-injector-ranks and --fault-injector-num-ranks are exclusive (Megatron-Core: "
                              "'Cannot specify both force_ranks and num_ranks'): give one",
                              flags=("--fault-injector-ranks", "--fault-injector-num-ranks"))
        if self.ranks is not None:
            try:
                [int(r) for r in self.ranks.split(",")]
            except ValueError:
                raise ConfigError(f"--fault-injector-ranks {self.ranks}: a comma-separated list of ranks",
                                  flags=("--fault-injector-ranks",)) from None
        if self.num_ranks is not None and self.num_ranks < 1:
            why = ("no rank is drawn, so the injector would never fire" if self.num_ranks == 0
                   else "Megatron-Core: 'Sample larger than population or is negative'")
            raise ConfigError(f"--fault-injector-num-ranks must be at least 1, got {self.num_ranks} ({why})",
                              flags=("--fault-injector-num-ranks",))

    def _check_fault_types(self, cuda: bool) -> None:
        if self.fault_types is None:
            raise ConfigError("--fault-injector-ranks/--fault-injector-num-ranks need --fault-injector-fault-types "
                              f"(Megatron-Core asserts it), one or more of {', '.join(FAULT_TYPES)}",
                              flags=("--fault-injector-fault-types",))
        unknown = [name for name in self.fault_types_list() if name not in FAULT_TYPES]
        if unknown:
            raise ConfigError(f"--fault-injector-fault-types {self.fault_types}: {', '.join(unknown)} is no "
                              f"nvidia-resiliency-ext fault; choose from {', '.join(FAULT_TYPES)}",
                              flags=("--fault-injector-fault-types",))
        gpu = [name for name in self.fault_types_list() if name in GPU_FAULTS]
        if gpu and not cuda:
            raise ConfigError(f"--fault-injector-fault-types {self.fault_types}: {', '.join(gpu)} acts on a CUDA "
                              "device and this run has none", flags=("--fault-injector-fault-types",))

    def _check_probabilities(self) -> None:
        if self.fault_probabilities is None:
            return
        try:
            weights = [float(p) for p in self.fault_probabilities.split(",")]
        except ValueError:
            weights = []
        if len(weights) != len(self.fault_types_list()):
            raise ConfigError(f"--fault-injector-fault-probabilities {self.fault_probabilities}: one weight per "
                              f"fault type ({len(self.fault_types_list())}; Megatron-Core: 'Number of fault types "
                              f"and fault probabilities must match')",
                              flags=("--fault-injector-fault-probabilities", "--fault-injector-fault-types"))
        # NaN compares false with everything, so `min(weights) < 0` would let it through
        if not all(math.isfinite(w) and w >= 0 for w in weights) or not 0 < sum(weights) < math.inf:
            raise ConfigError(f"--fault-injector-fault-probabilities {self.fault_probabilities}: finite, "
                              f"non-negative weights, not all zero (they are normalized by their sum)",
                              flags=("--fault-injector-fault-probabilities",))

    def _check_delays(self) -> None:
        if self.fault_delay is None and self.mtti_seconds is None:
            raise ConfigError("give --fault-injector-fault-delay or --fault-injector-mtti-seconds (Megatron-Core "
                              "asserts one): when the fault comes", flags=("--fault-injector-fault-delay",
                                                                            "--fault-injector-mtti-seconds"))
        for flag, value, zero in (("--fault-injector-fault-delay", self.fault_delay, True),
                                  ("--fault-injector-offset-seconds", self.offset_seconds, True),
                                  ("--fault-injector-mtti-seconds", self.mtti_seconds, False)):
            if value is not None and not is_wait(value, zero_allowed=zero):
                raise ConfigError(f"{flag} must be a number of seconds {'from 0' if zero else 'above 0'} up to "
                                  f"{LONGEST_WAIT_TEXT}, got {value:g}", flags=(flag,))

    def check_world(self, world_size: int) -> None:
        """The checks that need the world size, in Megatron-Core's words; run before any work and again by every
        rank."""
        if not self.enabled:
            return
        if self.ranks is not None:
            ranks = [int(r) for r in self.ranks.split(",")]
            if not all(0 <= r < world_size for r in ranks):
                raise ConfigError(f"--fault-injector-ranks {self.ranks}: Fault ranks must be between 0 and "
                                  f"{world_size - 1} (Megatron-Core's words; {world_size} ranks train)",
                                  flags=("--fault-injector-ranks",))
        elif self.num_ranks is not None and self.num_ranks > world_size - 1:
            raise ConfigError(f"--fault-injector-num-ranks {self.num_ranks}: at most {world_size - 1}, the ranks "
                              f"other than rank 0 of {world_size} (Megatron-Core: 'Sample larger than population "
                              f"or is negative')", flags=("--fault-injector-num-ranks",))


@dataclass(frozen=True)
class FaultPlan:
    ranks: tuple[int, ...]
    fault: str
    delay_s: float

    def describe(self, settings: FaultInjectorSettings) -> str:
        anchor = ("from the start of training" if settings.delay_start_iteration is None else
                  f"after iteration {settings.delay_start_iteration + 1} and its save, if it saves "
                  f"(--fault-injector-delay-start-iteration {settings.delay_start_iteration}, Megatron's 0-based count)")
        who = f"rank {self.ranks[0]}" if len(self.ranks) == 1 else f"ranks {', '.join(map(str, self.ranks))}"
        return f"fault injector: {self.fault} on {who}, {self.delay_s:.3f} s {anchor}"


def draw_plan(settings: FaultInjectorSettings, world_size: int, seed: Optional[int], index: int = 0) -> FaultPlan:
    """Megatron-Core's draws in its order from one random.Random(seed): the same plan on every rank. `index`: the plan
    of the index-th set-up (a restart's), drawn on from the same stream."""
    rng = random.Random(seed)
    for _ in range(index):
        _draw(settings, world_size, rng)
    return _draw(settings, world_size, rng)


def _draw(settings: FaultInjectorSettings, world_size: int, rng: random.Random) -> FaultPlan:
    if settings.ranks is not None:
        ranks = tuple(int(r) for r in settings.ranks.split(","))
    else:
        ranks = tuple(rng.sample(range(1, world_size), k=settings.num_ranks))
    fault = rng.choices(settings.fault_types_list(), settings.probabilities(), k=1)[0]
    delay = settings.fault_delay
    if delay is None:
        delay = (settings.offset_seconds or 0.0) + (-math.log(1.0 - rng.random()) * settings.mtti_seconds)
    return FaultPlan(ranks, fault, float(delay))


class FaultInjector:
    """Arms one fault on this rank and raises a workload fault where the loop polls it; `cancel` at the end of training,
    so a fault not yet due never lands in the exit or the next incarnation."""

    def __init__(self, describe: str, gpu_faults: Optional[dict[str, Callable[[], None]]] = None) -> None:
        self.describe = describe
        self.gpu_faults = gpu_faults or {}
        self._workload_raise = threading.Event()
        self._cancelled = threading.Event()

    def poll(self, where: str) -> None:
        """Megatron's maybe_raise_workload_exception."""
        if self._workload_raise.is_set():
            self._workload_raise.clear()
            raise InjectedFault(f"{self.describe}: workload_exc raised {where} (--fault-injector-fault-types)")

    def arm(self, fault: str, delay_s: float) -> threading.Thread:
        act = self._action(fault)
        if fault == "signal_exc":
            signal.signal(signal.SIGUSR1, self._raise_on_signal)

        def fire() -> None:
            if not self._cancelled.wait(delay_s):
                act()

        thread = threading.Thread(target=fire, name=f"fault-injector-{fault}", daemon=True)
        thread.start()
        return thread

    def cancel(self) -> None:
        self._cancelled.set()

    def _action(self, fault: str) -> Callable[[], None]:
        main_thread = threading.main_thread().ident
        me = os.getpid()
        if fault in SIGNAL_FAULTS:
            return lambda: os.kill(me, SIGNAL_FAULTS[fault])
        actions: dict[str, Callable[[], None]] = {
            "workload_exc": self._workload_raise.set,
            "async_exc": lambda: _raise_in_thread(main_thread, self._async_fault()),
            "signal_exc": lambda: os.kill(me, signal.SIGUSR1),
            "os_abort": os.abort,
            "segfault": lambda: ctypes.string_at(1),
            # a regular expression that backtracks for hours in C, holding the GIL
            "lock_gil": lambda: re.match(r"(a?){40}a{40}", "a" * 40),
            **self.gpu_faults,
        }
        return actions[fault]

    def _async_fault(self) -> type[InjectedFault]:
        """An exception raised in another thread is a class built there without arguments: this one carries the
        message."""
        message = f"{self.describe}: async_exc raised in the main thread (--fault-injector-fault-types)"

        class AsyncInjectedFault(InjectedFault):
            def __init__(self, *args) -> None:
                super().__init__(*(args or (message,)))

        return AsyncInjectedFault

    def _raise_on_signal(self, signum, frame) -> None:
        if not sys.is_finalizing():
            raise InjectedFault(f"{self.describe}: signal_exc raised (SIGUSR1, --fault-injector-fault-types)")


def _raise_in_thread(thread_id: int, exception: type[BaseException]) -> None:
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
    set_async_exc.restype = ctypes.c_int
    if not sys.is_finalizing() and set_async_exc(thread_id, exception) > 1:
        set_async_exc(thread_id, None)
