"""--enable-ft-package: Megatron-LM's fault tolerance sections (setup, step, checkpointing) with nvidia-resiliency-ext's
semantics, watched by resilience/ft_monitor.py. Timeouts come from the launcher, or with --calc-ft-timeouts are learned
from the run's own times (x5) and kept in `<save>/ft_state.json` for a restart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

import torch
import torch.distributed as dist

from arguments.checkpoint_config import CheckpointConfig
from arguments.config import ConfigError
from arguments.fault_handling import FaultHandlingSettings
from base.waits import LONGEST_WAIT_TEXT, is_wait

FT_TIMEOUTS_VARIABLE = "ZERO_GPT_FT_TIMEOUTS"  # JSON: {"setup": s, "step": s, "checkpointing": s, "out_of_section": s}
SECTIONS = ("setup", "step", "checkpointing")
SAFETY_FACTOR = 5.0  # nvidia-resiliency-ext's FaultToleranceConfig.safety_factor
MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE = 16  # ft_integration.py's _MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE
STATE_FILE = "ft_state.json"


def parse_section_timeouts(text: str) -> dict[str, Optional[float]]:
    """ft_launcher's `name:value,...`; null, none or nothing is no timeout."""
    timeouts: dict[str, Optional[float]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition(":")
        if not sep or name.strip() not in SECTIONS:
            raise ValueError(f"{item!r} is not section:seconds with a section of {', '.join(SECTIONS)}")
        timeouts[name.strip()] = parse_timeout(value)
    return timeouts


def parse_timeout(value: str) -> Optional[float]:
    if value.strip().lower() in ("", "null", "none"):
        return None
    seconds = float(value)
    if not is_wait(seconds, zero_allowed=False):  # inf and 1e300 too: the monitor's wait would overflow
        raise ValueError(f"a timeout must be a number of seconds above 0 up to {LONGEST_WAIT_TEXT}, got {value!r}")
    return seconds


def launch_timeouts(environ: Mapping[str, str]) -> dict[str, Optional[float]]:
    given = json.loads(environ.get(FT_TIMEOUTS_VARIABLE, "{}"))
    return {name: given.get(name) for name in (*SECTIONS, "out_of_section")}


@dataclass
class LearnedTimes:
    """The longest time this rank spent in each section and outside all (timeouts_calc.py's TimeoutsCalc)."""
    longest: dict[str, float] = field(default_factory=lambda: {name: -1.0 for name in (*SECTIONS, "out_of_section")})
    open: dict[str, float] = field(default_factory=dict)
    last_close: float = field(default_factory=time.monotonic)

    def opened(self, section: str, now: float) -> None:
        if not self.open:
            self.longest["out_of_section"] = max(self.longest["out_of_section"], now - self.last_close)
        self.open[section] = now

    def closed(self, section: str, now: float) -> None:
        self.longest[section] = max(self.longest[section], now - self.open.pop(section))
        if not self.open:
            self.last_close = now


def merged(current: Optional[float], new: float, current_learned: bool) -> float:
    """An even average with a learned value, else the new one (timeouts_calc.py)."""
    return 0.5 * new + 0.5 * current if current_learned and current is not None else new


class FaultTolerance:
    def __init__(self, rank: int, save_dir: str, calc_timeouts: bool, warmup_iterations: int,
                 timeouts: dict[str, Optional[float]], log=print) -> None:
        self.rank, self.calc_timeouts, self.warmup_iterations = rank, calc_timeouts, warmup_iterations
        self.state_path = Path(save_dir) / STATE_FILE
        self.log = log
        self.timeouts = dict(timeouts)
        self.learned: set[str] = set()
        if self.state_path.exists():  # what an earlier start learned
            state = json.loads(self.state_path.read_text())
            self.timeouts.update(state["timeouts"])
            self.learned = set(state["learned"])
            log(f"> FT: loaded timeouts from {self.state_path}")
        self.times = LearnedTimes()
        self.iterations = 0
        self.saves = 0
        self.loaded_checkpoint = False
        self._closed = False
        self._monitor = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("ft_monitor.py")), str(os.getpid()), str(rank),
             str(warmup_iterations), json.dumps(self.timeouts)], stdin=subprocess.PIPE, text=True, bufsize=1,
            start_new_session=False)
        self._open("setup")

    def describe(self) -> str:
        shown = ", ".join(f"{name} {'none' if value is None else f'{value:g} s'}"
                          f"{' (learned)' if name in self.learned else ''}" for name, value in self.timeouts.items())
        how = ("learned from this run's times after each save and at the end (--calc-ft-timeouts)"
               if self.calc_timeouts else "as the launcher gave them (scripts/launch.py --ft-rank-section-timeouts)")
        return (f"> FT (--enable-ft-package): section timeouts {shown}, {how}; a rank past one is ended by its "
                f"monitor, a dead or silent one named by the heartbeat watch, and the launcher's --max-restarts "
                f"restarts the job from the latest checkpoint; the step section starts after "
                f"{self.warmup_iterations} warm-up iterations; evaluation and an --async-save's commit count as "
                f"out-of-section time here (Megatron-LM times evaluation steps as step and the commit as checkpointing)")


    def step_start(self) -> None:
        if "setup" in self.times.open:
            self._close("setup")
        if self.iterations >= self.warmup_iterations:
            self._open("step")

    def step_end(self) -> None:
        if "step" in self.times.open:
            self._close("step")
        self.iterations += 1
        self._send(f"iterations {self.iterations}")

    def checkpoint_loaded(self) -> None:
        self.loaded_checkpoint = True

    def checkpointing_start(self) -> None:
        self._open("checkpointing")

    def checkpointing_end(self, group: Optional[dist.ProcessGroup] = None) -> None:
        self._close("checkpointing")
        self.saves += 1
        self._maybe_learn(closing=False, group=group)

    def close(self, group: Optional[dist.ProcessGroup] = None, finished: bool = True) -> None:
        """The last learning, then the monitor goes; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        try:
            if finished:
                for section in list(self.times.open):  # a run that ended before training: setup still open
                    self._close(section)
                self._maybe_learn(closing=True, group=group)
        finally:
            if self._monitor.stdin is not None:
                self._monitor.stdin.close()
            self._monitor.wait()


    def _open(self, section: str) -> None:
        self.times.opened(section, time.monotonic())
        self._send(f"open {section}")

    def _close(self, section: str) -> None:
        self.times.closed(section, time.monotonic())
        self._send(f"close {section}")

    def _send(self, line: str) -> None:
        try:
            self._monitor.stdin.write(line + "\n")
        except (BrokenPipeError, ValueError):
            pass

    def _maybe_learn(self, closing: bool, group: Optional[dist.ProcessGroup]) -> None:
        """Learn the sections seen enough (ft_integration.py's _maybe_update_timeouts)."""
        if not self.calc_timeouts:
            return
        sections = [name for name, ready in (("setup", self.loaded_checkpoint),
                                             ("step", self.iterations >= MIN_ITERS_FOR_STEP_TIMEOUT_UPDATE),
                                             ("checkpointing", self.saves > 0)) if ready]
        if closing and {"setup", "step"} <= set(sections) and self.saves > 0:
            sections.append("out_of_section")
        longest = torch.tensor([self.times.longest[name] for name in (*SECTIONS, "out_of_section")], dtype=torch.float64)
        if dist.is_initialized():  # every rank's longest
            dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
        longest_of = dict(zip((*SECTIONS, "out_of_section"), longest.tolist()))
        updated = [name for name in sections if longest_of[name] > 0]
        if not updated:
            return
        for name in updated:
            self.timeouts[name] = merged(self.timeouts[name], SAFETY_FACTOR * longest_of[name], name in self.learned)
            self.learned.add(name)
        self._send("timeouts " + json.dumps({name: self.timeouts[name] for name in updated}))
        if self.rank == 0:
            temporary = self.state_path.with_suffix(".tmp")
            temporary.write_text(json.dumps({"timeouts": self.timeouts, "learned": sorted(self.learned)}))
            os.replace(temporary, self.state_path)
            self.log(f"> FT: timeouts learned for {', '.join(updated)}: "
                     + ", ".join(f"{name} {self.timeouts[name]:.2f} s" for name in updated)
                     + f"; saved to {self.state_path}")


def start_fault_tolerance(faults: FaultHandlingSettings, checkpoint: CheckpointConfig,
                          rank: int) -> Optional[FaultTolerance]:
    """This rank's sections and monitor (None without --enable-ft-package), setup open; refused without --save, as in
    Megatron-LM."""
    if not faults.enable_ft_package:
        return None
    save_dir = checkpoint.save
    if not save_dir:
        raise ConfigError("--enable-ft-package needs --save (and --load, the same directory, to resume after a "
                          "restart): Megatron-LM's ft_integration.setup refuses it without a save directory",
                          flags=("--enable-ft-package", "--save"))
    try:
        timeouts = launch_timeouts(os.environ)
    except ValueError as error:
        raise ConfigError(f"{FT_TIMEOUTS_VARIABLE}: {error}") from None
    Path(save_dir).mkdir(parents=True, exist_ok=True)
    log = (lambda line: print(line, flush=True)) if rank == 0 else (lambda line: None)
    fault_tolerance = FaultTolerance(rank, save_dir, faults.calc_ft_timeouts, faults.ft_num_warmup_iters,
                                     timeouts, log)
    log(fault_tolerance.describe())
    return fault_tolerance
