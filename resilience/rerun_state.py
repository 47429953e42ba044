"""Megatron-Core's rerun state machine: a NaN, Inf or spiky loss re-runs the iteration on the same data and RNG state to
tell a transient fault (exit 17) from a reproducible one (checkpoint and exit 16, to re-run elsewhere), state for state
as Megatron-Core decides. The train step drives it before the optimizer step."""

from __future__ import annotations

import datetime
import math
import os
import random
import re
from enum import Enum
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from resilience.rerun_stats import REPORTING_INTERVAL_ITERATIONS, GatherToFirst, QuickStats, report_stats

EXIT_CODE_RESUME_TO_DISAMBIGUATE = 16
EXIT_CODE_FAILED_ON_RESULT_VALIDATION = 17
SPIKY_LOSS_FACTOR = 10  # Megatron-LM's pretrain_gpt.py: 10x the largest of the first 100 is a spike
SPIKY_LOSS_SAMPLES = 100
COMPARISON_MATCH, COMPARISON_MISMATCH = 0.0, math.inf


class RerunMode(str, Enum):
    DISABLED = "disabled"
    VALIDATE_RESULTS = "validate_results"
    # Megatron-LM's flag value; Megatron-Core's member is "report_determinism_stats".
    REPORT_DETERMINISM_STATS = "report_stats"


class RerunState(Enum):
    NOT_RUNNING_YET = 0
    INITIAL_RUN = 1
    RERUNNING_IN_PLACE = 2
    WILL_RERUN_FROM_CHECKPOINT = 3  # after the exit-16 checkpoint, and in the job resumed from it
    RERUNNING_FROM_CHECKPOINT = 4
    RERUNNING_AGAIN_FROM_CHECKPOINT = 5  # on the node and device that reproduced the result: exit 16 again


class RerunDiagnostic(str, Enum):  # --error-injection-type
    CORRECT_RESULT = "correct_result"
    TRANSIENT_ERROR = "transient_error"
    PERSISTENT_ERROR = "persistent_error"


_ERROR_NAMES = {RerunDiagnostic.CORRECT_RESULT: "Expected result", RerunDiagnostic.TRANSIENT_ERROR: "Transient error",
                RerunDiagnostic.PERSISTENT_ERROR: "Persistent error"}


class RerunExit(Exception):
    """End the job before the optimizer step with `code` (16 or 17), after a save when `checkpoint`."""

    def __init__(self, code: int, checkpoint: bool) -> None:
        super().__init__(f"exit {code}")
        self.code, self.checkpoint = code, checkpoint


class ErrorInjector:
    """Megatron-Core's RerunErrorInjector: on average one validation in `rate` per rank is rejected, and the re-runs'
    comparisons forced to what `kind` gives."""

    def __init__(self, rate: int, kind: RerunDiagnostic, rank: int, log: Callable[[str], None]) -> None:
        self.rate, self.kind, self.rank, self.log = rate, kind, rank, log
        self.injected: Optional[RerunDiagnostic] = None

    def maybe_inject(self) -> bool:
        if self.rate <= 0 or self.injected is not None:
            return False
        if (random.randint(0, self.rate - 1) + self.rank) % self.rate != 0:
            return False
        self.injected = self.kind
        self.log(f"Injecting error type {_ERROR_NAMES[self.kind]}")
        return True

    def maybe_miscompare(self, compare: Callable[[Any, Any], float], initial: Any, result: Any,
                         state: RerunState) -> float:
        """A transient error mismatches in place; on the resumed job's re-run a persistent error mismatches and a
        correct result matches."""
        if self.injected is None:
            return compare(initial, result)
        if state == RerunState.RERUNNING_IN_PLACE:
            if self.injected == RerunDiagnostic.TRANSIENT_ERROR:
                self.injected = None
                return COMPARISON_MISMATCH
            return COMPARISON_MATCH
        if state == RerunState.RERUNNING_FROM_CHECKPOINT and self.injected != RerunDiagnostic.TRANSIENT_ERROR:
            persistent, self.injected = self.injected == RerunDiagnostic.PERSISTENT_ERROR, None
            return COMPARISON_MISMATCH if persistent else COMPARISON_MATCH
        raise RuntimeError(f"an injected {self.injected.value} cannot be compared in state {state.name}")


def compare_floats(a: float, b: float) -> float:
    """0 when equal (NaN equals NaN), inf when one is finite and the other not, else the relative difference."""
    if a == b or (math.isnan(a) and math.isnan(b)):
        return COMPARISON_MATCH
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
        return COMPARISON_MISMATCH
    return math.fabs((a - b) / (a + b) * 2)


class ReplayingBatches:
    """Megatron-Core's RerunDataIterator: an iteration's micro-batches, replayed by a re-run (`rewind`) and dropped at
    the next iteration (`advance`)."""

    def __init__(self, batches: Iterator[dict]) -> None:
        self.batches, self.saved, self.replaying, self.position = batches, [], False, 0

    def __iter__(self) -> "ReplayingBatches":
        return self

    def __next__(self) -> dict:
        if self.replaying:
            batch = self.saved[self.position]
            self.position += 1
            return batch
        batch = next(self.batches)
        self.saved.append(batch)
        return batch

    def rewind(self) -> None:
        self.replaying, self.position = True, 0

    def advance(self) -> None:
        self.replaying, self.saved = False, []


class RerunStateMachine:
    """One per process. `reduce_any` ORs flags over every rank; `save_rng`/`restore_rng` hold the states a re-run starts
    from; `where` names this rank's node and device."""

    def __init__(self, mode: RerunMode, *, rank: int, reduce_any: Callable[[list[bool]], list[bool]],
                 save_rng: Callable[[], Any], restore_rng: Callable[[Any], None], where: tuple[str, str],
                 injector: Optional[ErrorInjector] = None, tracker_file: Optional[str] = None,
                 log: Callable[[str], None] = print, log_once: Optional[Callable[[str], None]] = None,
                 gather_to_first: Optional[GatherToFirst] = None) -> None:
        self.mode, self.rank, self.reduce_any = mode, rank, reduce_any
        self.save_rng, self.restore_rng, self.where = save_rng, restore_rng, where
        self.injector = injector or ErrorInjector(0, RerunDiagnostic.TRANSIENT_ERROR, rank, log)
        self.tracker_file, self.log = tracker_file, log
        self.log_once = log_once or (log if rank == 0 else (lambda _: None))
        self.gather_to_first = gather_to_first or (lambda records: [records])
        if tracker_file is not None:
            with open(tracker_file, "a"):  # Megatron refuses a file it cannot append to, before training
                pass
        self.state = RerunState.NOT_RUNNING_YET
        self.current_iteration = 0
        self.first_iteration_complete = False
        self.rerun_requested = self.checkpoint_requested = self.continue_requested = False
        self.restart_again_requested = False
        self.validation_counts: dict[str, int] = {}
        self.failed_call: Optional[tuple[str, int]] = None
        self.initial_result: Optional[float] = None
        self.suspicious_where: Optional[tuple[str, str]] = None  # the node and device that reproduced it
        self.saved_rng: Any = None
        self.max_values: dict[str, float] = {}
        self.value_counts: dict[str, int] = {}
        self.saved_results: dict[tuple[str, int], float] = {}
        self.stats: dict[str, QuickStats] = {}
        self.logged_enabled = False

    @property
    def enabled(self) -> bool:
        return self.mode != RerunMode.DISABLED

    @property
    def reporting_stats(self) -> bool:
        return self.mode == RerunMode.REPORT_DETERMINISM_STATS

    def should_run_forward_backward(self, iteration: int, batches: Optional[ReplayingBatches]) -> bool:
        self.validation_counts = {}
        if self.state == RerunState.NOT_RUNNING_YET:
            self.current_iteration = iteration
            self.state = RerunState.INITIAL_RUN
            if self.enabled:
                self.saved_rng = self.save_rng()
                if batches is not None:
                    batches.advance()
                self.rerun_requested = self.checkpoint_requested = self.continue_requested = False
                self.restart_again_requested = False
            return True
        if self.state == RerunState.INITIAL_RUN:
            if not self.enabled or not self.reduce_any([self.rerun_requested])[0]:
                self.state = RerunState.NOT_RUNNING_YET
                return False
            if not self.reporting_stats:
                self.log_once("Need to rerun step to check reproducibility of initial result")
            self.state = RerunState.RERUNNING_IN_PLACE
            self._rewind(batches)
            return True
        if self.state == RerunState.RERUNNING_IN_PLACE:
            if self.reporting_stats:
                self.state = RerunState.NOT_RUNNING_YET
                if self.current_iteration % REPORTING_INTERVAL_ITERATIONS == 0:
                    report_stats(self.stats, self.gather_to_first, self.log_once)
                self.saved_results = {}
                return False
            will_continue, will_checkpoint = self.reduce_any([self.continue_requested, self.checkpoint_requested])
            if will_continue:
                self.log_once("Continuing normal execution because failed validation was not fatal")
                self.state = RerunState.NOT_RUNNING_YET
                return False
            if will_checkpoint:
                self.state = RerunState.WILL_RERUN_FROM_CHECKPOINT
            self._rewind(batches)
            return False
        if self.state == RerunState.WILL_RERUN_FROM_CHECKPOINT:
            self.current_iteration = iteration
            self.state = RerunState.RERUNNING_FROM_CHECKPOINT
            return True
        if self.state == RerunState.RERUNNING_FROM_CHECKPOINT:
            will_restart_again, will_continue = self.reduce_any([self.restart_again_requested,
                                                                 self.continue_requested])
            if will_restart_again:
                self.log_once("Need to restart job from the same checkpoint because it was scheduled on the same "
                              "node/GPU")
                self.state = RerunState.RERUNNING_AGAIN_FROM_CHECKPOINT
            elif will_continue:
                self.log_once("Continuing normal execution because failed validation was not fatal")
                self.state = RerunState.NOT_RUNNING_YET
            return False
        raise RuntimeError(f"the rerun state machine cannot run an iteration in state {self.state.name}")

    def discard_run(self) -> None:
        """Throw away the run under way (--fp8-guard's replay): the run that stands is the one judged."""
        self.validation_counts = {}
        if self.state == RerunState.INITIAL_RUN:
            self.rerun_requested = False
            self.failed_call = self.initial_result = None
            self.saved_results = {}
        else:
            self.continue_requested = self.checkpoint_requested = self.restart_again_requested = False

    def should_checkpoint_and_exit(self) -> tuple[bool, bool, int]:
        self.first_iteration_complete = True
        if not self.enabled or self.reporting_stats:
            return False, False, 0
        if self.state == RerunState.RERUNNING_IN_PLACE:
            self.log_once("Exiting now. The job can be resumed from a previous checkpoint")
            return False, True, EXIT_CODE_FAILED_ON_RESULT_VALIDATION
        if self.state == RerunState.WILL_RERUN_FROM_CHECKPOINT:
            self.log_once("Saving a checkpoint and exiting now. Please resume the job from the checkpoint to rerun "
                          "the last iteration and establish a diagnostic")
            return True, True, EXIT_CODE_RESUME_TO_DISAMBIGUATE
        if self.state == RerunState.RERUNNING_FROM_CHECKPOINT:
            self.log_once("Exiting now. A checkpoint at the last iteration already exists if further examination "
                          "is needed")
            return False, True, EXIT_CODE_FAILED_ON_RESULT_VALIDATION
        if self.state == RerunState.RERUNNING_AGAIN_FROM_CHECKPOINT:
            self.log_once("Exiting now. Please resume the job from the same checkpoint to rerun the last iteration "
                          "and establish a diagnostic")
            return False, True, EXIT_CODE_RESUME_TO_DISAMBIGUATE
        return False, False, 0

    def validate_result(self, result: float, rejected: Callable[[float], bool], message: str, *,
                        tolerance: float = 0.0, fatal: bool = True) -> None:
        """Megatron's validate_result for one float: `rejected(result)` flags it; the re-runs compare."""
        if not self.enabled:
            return
        count = self.validation_counts.get(message, 0) + 1
        self.validation_counts[message] = count
        call = (message, count)
        if self.reporting_stats:
            if self.state == RerunState.INITIAL_RUN:
                self.rerun_requested = True
                self.saved_results[call] = result
            elif self.state == RerunState.RERUNNING_IN_PLACE:
                self.stats.setdefault(message, QuickStats()).record(compare_floats(self.saved_results[call], result))
            return
        if not self.logged_enabled:
            self.logged_enabled = True
            self.log_once("Result validation enabled")
        if self.state == RerunState.INITIAL_RUN and not self.rerun_requested:
            if not self.first_iteration_complete:
                return
            if self.injector.maybe_inject() or rejected(result):
                self.failed_call, self.initial_result, self.rerun_requested = call, result, True
                self._track("initial_run", result, message)
                self.log(f"Unexpected result {result} on rank {self.rank} at iteration #{self.current_iteration} "
                         f"invocation #{count} (message='{message}')")
        elif self.state in (RerunState.RERUNNING_IN_PLACE, RerunState.RERUNNING_FROM_CHECKPOINT) \
                and call == self.failed_call:
            comparison = self.injector.maybe_miscompare(compare_floats, self.initial_result, result, self.state)
            if self.state == RerunState.RERUNNING_IN_PLACE:
                self._judge_first_rerun(result, message, comparison > tolerance, fatal)
            else:
                self._judge_second_rerun(result, message, comparison > tolerance, fatal)

    def _judge_first_rerun(self, result: float, message: str, differs: bool, fatal: bool) -> None:
        if differs:
            if not fatal:
                self.continue_requested = True
            self._fail("First rerun: unexpected result is not reproducible within the tolerance "
                       f"({result} != {self.initial_result})")
            self._track("first_rerun_not_reproducible", result, message)
            self._fail("Possible transient error!")
            return
        if fatal:
            self.checkpoint_requested = True
        else:
            self.continue_requested = True
        self.suspicious_where = self.where  # the resumed job checks it is not on them again
        self._track("first_rerun_reproducible", result, message)
        self._fail("First rerun: unexpected result is reproducible within the tolerance "
                   f"({result} = {self.initial_result}). Need to rerun on a different GPU to verify correctness.")

    def _judge_second_rerun(self, result: float, message: str, differs: bool, fatal: bool) -> None:
        """The resumed job's re-run: on another machine, a different result means the first computed wrongly."""
        if self.where == self.suspicious_where:
            self.log(f"Got rescheduled on the same GPU. Need to resume again from the same checkpoint "
                     f"(node: {self.where[0]}, gpu: {self.where[1]})")
            self.restart_again_requested = True
            return
        if differs:
            self._track("second_rerun_not_reproducible", result, message)
            self.log("Second rerun: unexpected result is not reproducible on a different GPU, therefore was likely "
                     f"incorrect ({result} != {self.initial_result})")
            self._fail("Possible persistent error!")
        else:
            self._track("second_rerun_reproducible", result, message)
            self.log("Second rerun: unexpected result is reproducible on a different GPU, therefore it was likely "
                     f"correct ({result} = {self.initial_result})")
            self._fail(f"Correct result (but possible Application error) ({message})")
        if not fatal:
            self.continue_requested = True

    def is_unexpectedly_large(self, value: float, threshold: float, context: str,
                              num_samples: int = SPIKY_LOSS_SAMPLES) -> bool:
        """The first `num_samples` values set the maximum; a later value `threshold` times it is a spike. NaN and Inf
        are left to their own checks."""
        value = math.fabs(value)
        if math.isnan(value) or math.isinf(value):
            return False
        seen = self.value_counts.get(context, 0)
        if seen < num_samples:
            self.value_counts[context] = seen + 1
            self.max_values[context] = max(self.max_values.get(context, 0.0), value)
            return False
        return value >= self.max_values[context] * threshold

    def _rewind(self, batches: Optional[ReplayingBatches]) -> None:
        self.restore_rng(self.saved_rng)
        if batches is not None:
            batches.rewind()

    def _fail(self, message: str) -> None:
        self.log(f"Rank {self.rank}, node {self.where[0]}, device {self.where[1]}, iteration "
                 f"#{self.current_iteration}: {message}!")

    def _track(self, status: str, result: float, message: str) -> None:
        """One line per event in --result-rejected-tracker-filename, in Megatron's format."""
        if self.tracker_file is None:
            return
        with open(self.tracker_file, "a") as tracker:
            tracker.write(f"ts={datetime.datetime.now()} node={self.where[0]} device={self.where[1]} "
                          f"jobID={os.getenv('SLURM_JOBID', 'N/A')} rank={self.rank} "
                          f"iteration={self.current_iteration} status={status} result={result} "
                          f"message='{message}'\n")


TRACKER_LINE = re.compile(r"ts=.+ node=.+ device=.+ jobID=(.+) rank=(.+) iteration=(.+) status=(.+) result=.+ message=.+")
SKIPPING_STATUSES = ("RERUN_DISABLED", "FIRST_RERUN_REPRODUCIBLE", "SECOND_RERUN_REPRODUCIBLE")


def iterations_megatron_skips(tracker_file: str) -> list[int]:
    """Megatron-Core's get_skipped_iterations_from_tracker_file: iterations recorded reproducible twice on one rank,
    less those several ranks of one job met."""
    potentially, ignored, seen, by_job = set(), set(), set(), {}
    if not os.path.exists(tracker_file):
        return []
    with open(tracker_file) as tracker:
        for line in tracker:
            match = TRACKER_LINE.search(line)
            if match is None or match[4].split(".")[-1].upper() not in SKIPPING_STATUSES:
                continue
            job, rank, iteration = match[1], int(match[2]), int(match[3])
            if (rank, iteration) in seen:
                potentially.add(iteration)
            seen.add((rank, iteration))
            ranks = by_job.setdefault(job, {}).setdefault(iteration, set())
            ranks.add(rank)
            if len(ranks) > 1:
                ignored.add(iteration)
    return sorted(potentially - ignored)


def python_rng_state() -> dict:
    return {"random": random.getstate(), "numpy": np.random.get_state()}


def restore_python_rng_state(saved: dict) -> None:
    random.setstate(saved["random"])
    np.random.set_state(saved["numpy"])


def torch_rng_saver(rng, device: torch.device) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """Save and restore every generator a micro-batch draws from: Python's, NumPy's, torch's (CPU and device) and the
    model's dropout streams."""
    on_cuda = device.type == "cuda"

    def save() -> dict:
        saved = python_rng_state()
        if rng is not None:
            saved["model"] = rng.get_states()
        else:
            saved["cpu"] = torch.get_rng_state()
            saved["cuda"] = torch.cuda.get_rng_state(device) if on_cuda else None
        return saved

    def restore(saved: dict) -> None:
        restore_python_rng_state(saved)
        if rng is not None:
            rng.set_states(saved["model"])
        else:
            torch.set_rng_state(saved["cpu"])
            if on_cuda:
                torch.cuda.set_rng_state(saved["cuda"], device)
    return save, restore
