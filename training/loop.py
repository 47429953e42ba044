"""The training loop's cadence: when to step, log, evaluate, save and stop. What an iteration does, logs and reports is
handed in (a TrainStep, the interval metrics, the evaluator, the memory report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from checkpoint.run_saves import SaveCheckpoint
from parallel.state import ParallelState
from resilience.fault_injection import FaultSchedule
from resilience.rerun_state import RerunExit
from training.divergence import DivergenceHistory
from training.evaluation import Evaluator
from training.exit_conditions import ExitConditions
from training.interval_metrics import IntervalMetrics
from training.leading_skips import LeadingSkips
from training.memory_report import FirstIterationMemory
from training.run_settings import RunSettings
from training.train_step import StepOutcome, TrainingDiverged, TrainStep


@dataclass
class TrainingSummary:
    iterations: int = 0
    consumed_samples: int = 0
    train_losses: list[float] = field(default_factory=list)  # one per iteration
    final_valid_loss: Optional[float] = None
    final_test_loss: Optional[float] = None
    skipped_iterations: int = 0  # fp16 steps skipped for overflow in this process's run
    trained_iterations: int = 0  # a resume's start not counted
    loss_scale: Optional[float] = None
    # The samples of updates taken: Megatron-LM and DeepSpeed step their LR schedulers only after an update.
    schedule_samples: int = 0
    exit_reason: Optional[str] = None  # why the run stopped before --train-iters
    exit_code: int = 0  # 16 or 17 when the rerun state machine ended it
    saved_iterations: list[int] = field(default_factory=list)
    iteration_seconds: float = 0.0  # the iterations this process trained, all kept
    leading_skips: Optional[LeadingSkips] = None

    def add(self, iteration: int, outcome: StepOutcome) -> Optional[str]:
        """Count the iteration in; returns the line that ends fp16's leading skips, if any."""
        self.train_losses.append(outcome.loss)
        self.iterations = iteration
        self.consumed_samples += outcome.global_batch_size
        self.skipped_iterations += outcome.skipped
        if not outcome.skipped:
            self.schedule_samples += outcome.global_batch_size
        self.trained_iterations += 1
        self.loss_scale = outcome.loss_scale
        self.iteration_seconds += outcome.seconds
        if self.leading_skips is not None:
            return self.leading_skips.after(iteration, outcome.skipped, outcome.loss_scale)
        return None

    def step_lines(self) -> list[str]:
        """The run's last words on its optimizer steps, with a warning when every one was skipped (exit 0, as
        Megatron-LM)."""
        trained, skipped = self.trained_iterations, self.skipped_iterations
        if trained == 0:
            return []
        first = self.iterations - trained + 1
        span = f"iteration {first}" if trained == 1 else f"iterations {first}-{self.iterations}"
        skips = f"{skipped} skipped for fp16 gradient overflow" if skipped else "none skipped"
        lines = [f"> trained {trained} iteration{'s' if trained != 1 else ''} ({span}): {trained - skipped} "
                 f"optimizer step{'s' if trained - skipped != 1 else ''} taken, {skips}"]
        if self.leading_skips is not None and (why := self.leading_skips.at_end()) is not None:
            lines.append(why)
        if skipped == trained:
            lines.append(f"> warning: every step of this run ({skipped} of {trained}) was skipped for gradient overflow "
                         f"(loss scale now {self.loss_scale:g}): the weights are still those it started from; lower "
                         f"--lr or --initial-loss-scale (--loss-scale), or train in bf16")
        return lines

    def effective_time_line(self, wall_s: float) -> str:
        """The run's effective training time, as Llama 3 reports its own."""
        share = self.iteration_seconds / wall_s if wall_s > 0 else 0.0
        return (f"> effective training time: {share * 100:.1f}% ({self.trained_iterations} iterations took "
                f"{self.iteration_seconds:.2f} s of the {wall_s:.2f} s since this process started; the rest: "
                f"start-up, evaluation, checkpoints)")


def tokens_used_up(settings: RunSettings, consumed_samples: int, iteration: int, state: ParallelState) -> bool:
    """Megatron-DeepSpeed's loop condition for --train-tokens."""
    train_tokens = settings.config.training.train_tokens
    if train_tokens is None or settings.tokens_in(consumed_samples) < train_tokens:
        return False
    if state.is_first_rank:
        print(f" stopping before iteration {iteration}: --train-tokens {train_tokens} consumed", flush=True)
    return True


def early_exit(exit_conditions: Optional[ExitConditions], iteration: int, state: ParallelState,
               save: Callable[[int], None]) -> Optional[str]:
    """After an iteration: a requested save, and the reason to stop early, saved first."""
    if exit_conditions is None:
        return None
    if exit_conditions.save_requested(iteration):
        save(iteration)
        exit_conditions.save_done()
    reason = exit_conditions.check(iteration)
    if reason is not None:
        if state.is_first_rank:
            print(f" exiting after iteration {iteration}: {reason}", flush=True)
        save(iteration)
    return reason


def rerun_exit(verdict: RerunExit, iteration: int, summary: TrainingSummary,
               save: Optional[Callable[[int, bool], None]], state: ParallelState) -> TrainingSummary:
    """The rerun state machine ended the job before `iteration`'s update; with exit 16 its starting weights are
    saved."""
    done = iteration - 1
    if verdict.checkpoint and save is not None:  # again if saved already: now with the machine's pending re-run
        save(done, True)
    kept = (f"; resume from the checkpoint of iteration {done} to re-run iteration {iteration}"
            if verdict.checkpoint and save is not None else "")
    summary.exit_reason = f"the rerun state machine ended the job at iteration {iteration} (exit {verdict.code}){kept}"
    summary.exit_code = verdict.code
    if state.is_first_rank:
        print(f" exiting before the update of iteration {iteration}: {summary.exit_reason}", flush=True)
    return summary


def train(step: TrainStep, metrics: IntervalMetrics, evaluator: Evaluator, memory: FirstIterationMemory,
          settings: RunSettings, state: ParallelState, *, start_iteration: int = 0, consumed_samples: int = 0,
          schedule_samples: Optional[int] = None, save_checkpoint: Optional[SaveCheckpoint] = None,
          exit_conditions: Optional[ExitConditions] = None, commit_saves: Optional[Callable[[int], None]] = None,
          faults: Optional[FaultSchedule] = None) -> TrainingSummary:
    """Train from `start_iteration` + 1 to --train-iters; a resume passes its checkpoint's iteration, samples and
    schedule position."""
    training, save_interval = settings.config.training, settings.config.checkpoint.save_interval
    summary = TrainingSummary(start_iteration, consumed_samples, leading_skips=LeadingSkips.of(training, start_iteration),
                              schedule_samples=consumed_samples if schedule_samples is None else schedule_samples)
    lr = 0.0  # the rate of the last update, saved with the checkpoint

    def save(iteration: int, again: bool = False) -> None:  # once an iteration unless `again`
        if save_checkpoint is not None and (again or summary.saved_iterations[-1:] != [iteration]):
            save_checkpoint(iteration, summary.consumed_samples, lr, summary.schedule_samples)
            summary.saved_iterations.append(iteration)

    if faults is not None:
        faults.start()
    for iteration in range(start_iteration + 1, (start_iteration if training.skip_train else training.train_iters) + 1):
        if tokens_used_up(settings, summary.consumed_samples, iteration, state):
            break
        if commit_saves is not None:  # Megatron-LM's maybe_finalize_async_save, at the top of its loop too
            commit_saves(iteration)
        try:
            outcome = step(iteration, summary.consumed_samples, memory.measures_activations(iteration),
                           schedule_samples=summary.schedule_samples)
        except TrainingDiverged as diverged:  # the caller names the checkpoint to restart from
            diverged.history = DivergenceHistory(start_iteration, summary.train_losses + [diverged.loss],
                                                 list(summary.saved_iterations))
            raise
        except RerunExit as verdict:  # as Megatron-LM's train(): save, then exit
            return rerun_exit(verdict, iteration, summary, save if save_checkpoint is not None else None, state)
        if faults is not None:
            faults.after_step(iteration)
        lr = outcome.lr
        if (why := summary.add(iteration, outcome)) is not None and state.is_first_rank:
            print(why, flush=True)
        metrics.add(iteration, summary.consumed_samples, summary.skipped_iterations, outcome)
        memory.after(iteration)
        if evaluator.due("valid", iteration, last=iteration == training.train_iters):
            summary.final_valid_loss = evaluator.run("valid", iteration, summary.consumed_samples)
        if save_interval is not None and iteration % save_interval == 0:
            save(iteration)
        if faults is not None:  # a fault armed by this iteration lands after its save
            faults.after_iteration(iteration)
        if (reason := early_exit(exit_conditions, iteration, state, save)) is not None:
            summary.exit_reason = reason
            return summary
    if summary.iterations > start_iteration:
        save(summary.iterations)  # the end of training is always kept
    if exit_conditions is not None and summary.iterations >= training.train_iters:
        exit_conditions.training_finished()
    final_evaluations(evaluator, training.skip_train, summary)
    return summary


def final_evaluations(evaluator: Evaluator, skip_train: bool, summary: TrainingSummary) -> None:
    """The test split at the end; with --skip-train the valid split first, as Megatron-LM."""
    if skip_train and evaluator.due("valid", summary.iterations, last=True):
        summary.final_valid_loss = evaluator.run("valid", summary.iterations, summary.consumed_samples)
    if evaluator.due("test", summary.iterations, last=True):
        summary.final_test_loss = evaluator.run("test", summary.iterations, summary.consumed_samples)
