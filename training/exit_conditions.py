"""When a run should save and stop early: a signal (with --exit-signal-handler), an iteration interval, a time budget,
BigScience's kill switch, or swiss-ai's trigger folder (--trigger-path). The verdict is agreed across ranks once per
iteration, so every rank saves after the same iteration and exits 0."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Optional

from parallel.state import ParallelState

# with the handler, Ctrl-C saves and exits 0; a second one interrupts at once
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class ExitConditions:
    """Checked after every iteration; `check` returns why to stop, or None."""

    def __init__(self, checkpoint_config, state: ParallelState, start_time: Optional[float] = None,
                 log_interval: int = 1) -> None:
        self.state = state
        self.trigger_path = checkpoint_config.trigger_path
        self.log_interval = log_interval
        self.exit_interval = checkpoint_config.exit_interval
        self.duration_s = (checkpoint_config.exit_duration_in_mins * 60.0
                           if checkpoint_config.exit_duration_in_mins is not None else None)
        self.start_time = time.monotonic() if start_time is None else start_time
        self.kill_switch_path = checkpoint_config.kill_switch_path
        self.received: Optional[int] = None
        self._previous_handlers = {}
        if checkpoint_config.exit_signal_handler:
            for signum in EXIT_SIGNALS:
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.received = signum
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    def check(self, iteration: int) -> Optional[str]:
        signalled = self.received is not None
        out_of_time = self.duration_s is not None and time.monotonic() - self.start_time >= self.duration_s
        killed = self.kill_switch_path is not None and os.path.exists(self.kill_switch_path)
        triggered = self._trigger_due(iteration) and os.path.exists(self._trigger("exit"))
        if self._previous_handlers or self.duration_s is not None or self.kill_switch_path is not None \
                or self._trigger_due(iteration):
            signalled, out_of_time, killed, triggered = self.state.comm.any_rank(
                [signalled, out_of_time, killed, triggered], self.state.device)
        if signalled:
            name = signal.Signals(self.received).name if self.received is not None else "a signal"
            return f"received {name} (on this or another rank)"
        if killed:
            return f"found the kill switch {self.kill_switch_path} (--kill-switch-path)"
        if triggered:
            return f"found the exit trigger {self._trigger('exit')} (--trigger-path)"
        if out_of_time:
            return f"--exit-duration-in-mins {self.duration_s / 60:g} reached"
        if self.exit_interval and iteration % self.exit_interval == 0:  # 0: never, as in Megatron-LM
            return f"--exit-interval {self.exit_interval} reached"
        return None

    def _trigger_due(self, iteration: int) -> bool:
        return self.trigger_path is not None and iteration % self.log_interval == 0

    def _trigger(self, name: str) -> str:
        return os.path.join(self.trigger_path, name)

    def save_requested(self, iteration: int) -> bool:
        """Whether DIR/save exists on any rank at this iteration."""
        if not self._trigger_due(iteration):
            return False
        return self.state.comm.any_rank([os.path.exists(self._trigger("save"))], self.state.device)[0]

    def save_done(self) -> None:
        """After the requested save: remove DIR/save."""
        if self.state.is_first_rank:
            try:
                Path(self._trigger("save")).unlink(missing_ok=True)
            except OSError as error:  # the save is made; a trigger left behind saves again
                print(f" warning: could not remove the save trigger {self._trigger('save')}: {error}", flush=True)

    def training_finished(self) -> None:
        """--train-iters reached: create DIR/exit for the job script."""
        if self.trigger_path is not None and self.state.is_first_rank:
            try:
                Path(self.trigger_path).mkdir(parents=True, exist_ok=True)
                Path(self._trigger("exit")).touch()
            except OSError as error:  # the run is trained and saved: say it, do not fail it
                print(f" warning: could not create the exit trigger {self._trigger('exit')}: {error}", flush=True)

    def close(self) -> None:
        """Put back the handlers that were there before."""
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers = {}
