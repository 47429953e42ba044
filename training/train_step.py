"""One training iteration as an object the cadence loop calls: micro-batches with gradient accumulation (backward under
the reducer's no_sync() but for the last), the gradient reduction and the optimizer step, to a `StepOutcome`.
`TrainStep` is the protocol; the pipeline step is a second class beside DataParallelTrainStep."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional, Protocol

import torch
from torch import nn

from arguments.schedule import tokens_seen_by_schedule
from data.documents import DocumentMasking
from gpt.fp8 import delayed_states, forget_fp8_weight_casts
from gpt.mtp import begin_mtp_iteration, finish_mtp_iteration
from parallel.state import ParallelState
from resilience.loss_checks import LossChecks
from resilience.rerun_state import ReplayingBatches, RerunExit, RerunStateMachine, torch_rng_saver
from training.cuda_graphs import CudaGraphs
from training.divergence import DivergenceHistory
from training.evaluation import mean_token_loss, micro_batch_loss, split_micro_batch
from training.fp8_guard_replay import Fp8GuardReplay
from training.logged_loss import LoggedLoss
from training.moe_metrics import begin_moe_iteration, finish_moe_iteration, moe_per_layer_values
from training.per_token_loss import token_count, token_scale, token_sum
from training.run_settings import RunSettings
from training.step_observer import NO_OBSERVER, StepObserver
from zero.activations import ActivationMonitor
from zero.apply import ZeroParts
from zero.optimizer import StepResult


@dataclass(frozen=True)
class StepOutcome:
    loss: float             # the logged loss (training/logged_loss.py)
    grad_norm: float        # before clipping
    skipped: bool           # fp16: an overflow made every rank skip the update
    loss_scale: float       # after the step (fp16 lowers it on a skip)
    global_batch_size: int  # samples consumed (a ramp changes it)
    lr: float
    seconds: float          # wall time, the device waited for
    # time inside collectives (--log-straggler)
    collective_wait_s: float = 0.0
    moe_losses: dict = field(default_factory=dict)
    moe_per_layer: dict = field(default_factory=dict)  # --moe-per-layer-logging
    fp8_guard: dict = field(default_factory=dict)  # --fp8-guard's counts of this rank's casts


class TrainStep(Protocol):
    def __call__(self, iteration: int, consumed_samples: int, measure_activations: bool,
                 schedule_samples: Optional[int] = None) -> StepOutcome:
        """Train iteration `iteration` on the batch after `consumed_samples`; raise TrainingDiverged on divergence."""


class TrainingDiverged(FloatingPointError):
    """A non-finite loss or gradient norm, or an fp16 run that only skips: the run stops before saving that step."""
    loss: Optional[float] = None
    history: Optional[DivergenceHistory] = None


def check_step_is_finite(iteration: int, loss: float, step: StepResult) -> None:
    """Stop at a non-finite loss, and at a non-finite gradient norm unless fp16 skipped the step."""
    if not math.isfinite(loss):  # Megatron's --rerun-mode validate_results would re-run it first: say so
        raise TrainingDiverged(f"iteration {iteration}: loss {loss}, gradient norm {step.grad_norm}; the run "
                               f"diverged and stopped without saving this step (lower --lr, or check the data; "
                               f"--rerun-mode validate_results re-runs such an iteration to tell a transient fault)")
    if not step.skipped and not math.isfinite(step.grad_norm):
        raise TrainingDiverged(f"iteration {iteration}: loss {loss}, gradient norm {step.grad_norm}; the run "
                               f"diverged and stopped without saving this step (lower --lr, or check the data)")


def check_skip_limit(iteration: int, consecutive_skips: int, limit: int, loss_scale: float) -> None:
    """Stop an fp16 run whose last `limit` steps were all skipped."""
    if limit and consecutive_skips >= limit:
        raise TrainingDiverged(f"iteration {iteration}: {consecutive_skips} steps in a row skipped for gradient "
                               f"overflow (loss scale now {loss_scale:g}); the run diverged and stopped without "
                               f"saving (lower --lr, or raise --max-consecutive-skipped-iterations)")


class DataParallelTrainStep:
    """Micro-batches under ZeRO's reducer, then ZeRO's optimizer step."""

    def __init__(self, model: nn.Module, zero: ZeroParts, train_batches: Iterator[dict], settings: RunSettings,
                 state: ParallelState, activations: ActivationMonitor,
                 documents: Optional[DocumentMasking] = None, observer: StepObserver = NO_OBSERVER,
                 rerun: Optional[RerunStateMachine] = None, cuda_graphs: Optional[CudaGraphs] = None,
                 rng=None) -> None:
        self.model, self.zero = model, zero
        # told each iteration, as their capture waits for one
        self.cuda_graphs = cuda_graphs
        self.settings, self.state, self.activations = settings, state, activations
        self.documents, self.observer = documents, observer
        self.iteration_token_scale: Optional[torch.Tensor] = None  # --calculate-per-token-loss's
        # --rerun-mode and --fp8-guard re-run an iteration: its micro-batches are kept for the replay
        self.rerun = rerun
        reruns = rerun is not None and rerun.enabled
        fp8_guard = getattr(model, "fp8_guard", None)
        self.replay = ReplayingBatches(train_batches) if reruns or fp8_guard is not None else None
        # Megatron-LM's loss_func checks, made after the micro-batches
        training = settings.config.training
        self.loss_checks = LossChecks(rerun, training.faults.check_for_nan_in_loss_and_grad,
                                      training.faults.check_for_spiky_loss)
        self.train_batches = self.replay if self.replay is not None else train_batches
        self.fp8_replay = None
        if fp8_guard is not None:
            save_rng, restore_rng = torch_rng_saver(rng, state.device)
            self.fp8_replay = Fp8GuardReplay(fp8_guard, list(delayed_states(model).values()), self.replay,
                                             save_rng, restore_rng, rerun if reruns else None)
        self.consecutive_skips = 0  # fp16 steps skipped in a row; every rank counts the same verdicts
        model.train()

    def learning_rate(self, consumed_samples: int, decoupled: bool = False) -> float:
        """The rate at the samples consumed before the update, as Megatron."""
        settings = self.settings
        schedule = settings.decoupled_lr_schedule if decoupled else settings.lr_schedule
        return schedule.rate(consumed_samples, tokens_seen_by_schedule(
            settings.batch, consumed_samples, settings.config.model.seq_length))

    def __call__(self, iteration: int, consumed_samples: int, measure_activations: bool,
                 schedule_samples: Optional[int] = None) -> StepOutcome:
        started = time.perf_counter()
        state, optimizer = self.state, self.zero.optimizer
        if state.comm.log is not None:
            state.comm.log.take_wait_s()  # waits before this iteration are not its own
        global_batch_size = self.settings.batch.global_batch_at(consumed_samples)
        # a skipped fp16 step does not advance the schedule
        position = consumed_samples if schedule_samples is None else schedule_samples
        lr = self.learning_rate(position)
        for group in optimizer.param_groups:
            group["lr"] = self.learning_rate(position, decoupled=True) if group.get("decoupled_lr") else lr
        accumulation_steps = self.settings.batch.accumulation_steps_at(consumed_samples)
        fp8_guard = getattr(self.model, "fp8_guard", None)
        if fp8_guard is not None:
            fp8_guard.begin_iteration(iteration)  # its figures from zero
        logged_loss, step = self.run_iteration(iteration, accumulation_steps, measure_activations)
        # MoE bias update and logged losses read values back: not on the dry run's path
        moe_losses = finish_moe_iteration(self.model, state, accumulation_steps)
        # Megatron-Core's "mtp_k loss" beside them
        moe_losses.update(finish_mtp_iteration(self.model, state, accumulation_steps,
                                               self.settings.config.model.mtp.num_layers))
        moe_per_layer = self.moe_per_layer(accumulation_steps)
        self.consecutive_skips = self.consecutive_skips + 1 if step.skipped else 0
        if step.skipped and state.is_first_rank:
            print(f" iteration {iteration}: gradient overflow at loss scale {step.loss_scale:g}; step "
                  f"skipped, loss scale now {optimizer.loss_scaler.scale:g}", flush=True)
        loss = logged_loss.item()  # waits for the device: the time is complete
        captured = self.cuda_graphs.take_capture_line() if self.cuda_graphs is not None else None
        if captured and state.is_first_rank:
            print(captured, flush=True)
        fp8_figures = fp8_guard.finish_iteration() if fp8_guard is not None else {}  # read with its verdict
        seconds = time.perf_counter() - started
        collective_wait_s = state.comm.log.take_wait_s() if state.comm.log is not None else 0.0
        try:
            check_step_is_finite(iteration, loss, step)
            if step.skipped:
                check_skip_limit(iteration, self.consecutive_skips,
                                 self.settings.config.training.mixed_precision.max_consecutive_skipped_iterations,
                                 optimizer.loss_scaler.scale)
        except TrainingDiverged as diverged:
            diverged.loss = loss
            raise
        return StepOutcome(loss=loss, grad_norm=step.grad_norm, skipped=step.skipped,
                           loss_scale=optimizer.loss_scaler.scale, global_batch_size=global_batch_size, lr=lr,
                           seconds=seconds, collective_wait_s=collective_wait_s, moe_losses=moe_losses,
                           moe_per_layer=moe_per_layer, fp8_guard=fp8_figures)

    def moe_per_layer(self, accumulation_steps: int) -> dict:
        model_config = self.settings.config.model
        if not self.settings.config.logging.moe_per_layer_logging or model_config.moe is None:
            return {}
        return moe_per_layer_values(self.model, self.state, accumulation_steps, model_config.num_layers,
                                    model_config.moe.num_experts, model_config.experts_per_layer())

    def run_iteration(self, iteration: int, accumulation_steps: int, measure_activations: bool
                      ) -> tuple[torch.Tensor, Optional[StepResult]]:
        """Every collective of an iteration and all its work that reads no value back; the dry run calls this on
        meta."""
        state, rerun = self.state, self.rerun
        state.comm.iteration = iteration  # named in the line a lost peer ends in
        if self.cuda_graphs is not None:
            self.cuda_graphs.begin_iteration(accumulation_steps)
        if self.replay is not None:
            self.replay.advance()  # this iteration's micro-batches from here on
        if rerun is None:
            logged = self.forward_backward_checked(accumulation_steps, measure_activations)
        else:  # Megatron-LM's train_step: `while rerun_state_machine.should_run_forward_backward(...)`
            while rerun.should_run_forward_backward(iteration, self.replay):
                logged = self.forward_backward_checked(accumulation_steps, measure_activations)
            should_checkpoint, should_exit, exit_code = rerun.should_checkpoint_and_exit()
            if should_exit:  # before the update: a checkpoint holds the weights this iteration started from
                raise RerunExit(exit_code, should_checkpoint)
        step = self.observer.optimizer_step(self.zero.optimizer)
        return logged.reduce(state), step

    def forward_backward_checked(self, accumulation_steps: int, measure_activations: bool) -> LoggedLoss:
        """The iteration's micro-batches; under --fp8-guard again until no FP8 layer failed its check."""
        def passes() -> LoggedLoss:
            return self.forward_backward_from_zero(accumulation_steps, measure_activations)
        return passes() if self.fp8_replay is None else self.fp8_replay.run(passes)

    def forward_backward_from_zero(self, accumulation_steps: int, measure_activations: bool) -> LoggedLoss:
        """The iteration's micro-batches from zeroed gradients."""
        state = self.state
        self.zero.reducer.zero_grad()
        state.comm.stats.snapshot_and_reset()  # the record's comm_bytes cover this iteration only
        begin_moe_iteration(self.model, self.zero.optimizer.loss_scaler.scale, accumulation_steps,
                            self.state.context_parallel_size)
        begin_mtp_iteration(self.model, self.zero.optimizer.loss_scaler.scale, accumulation_steps)
        forget_fp8_weight_casts(self.model)  # each FP8 weight cast again in the first (TE's is_first_microbatch)
        self.loss_checks.start()
        logged = self.forward_backward(accumulation_steps, measure_activations)
        forget_fp8_weight_casts(self.model)  # the step writes the weights
        self.loss_checks.validate()  # read back once, outside the micro-batches
        return logged

    def per_token_batches(self, micro_batches: int) -> list:
        """With --calculate-per-token-loss, the micro-batches read first and their token scale."""
        self.iteration_token_scale = None
        if not self.settings.config.training.calculate_per_token_loss:
            return []
        batches = [split_micro_batch(next(self.train_batches), self.state.device, self.documents, self.state)
                   for _ in range(micro_batches)]
        self.use_token_scale(batches)
        return batches

    def use_token_scale(self, batches: list) -> None:
        """The iteration's token scale, for the main, MoE and MTP losses."""
        counts = [token_count(labels, masks) for _, labels, masks in batches]
        self.iteration_token_scale = token_scale(counts, self.state)
        scale = self.zero.optimizer.loss_scaler.scale * self.iteration_token_scale
        begin_moe_iteration(self.model, scale, per_token=True)
        begin_mtp_iteration(self.model, scale, per_token=True)

    def micro_batch_loss(self, losses: torch.Tensor, masks, accumulation_steps: int) -> torch.Tensor:
        """A micro-batch's loss: its mean over the accumulation steps, or its sum x the token scale."""
        if self.iteration_token_scale is not None:
            return token_sum(losses, masks) * self.iteration_token_scale
        if masks is None:
            return mean_token_loss(losses, self.state) / accumulation_steps
        return micro_batch_loss(losses, masks, self.state) / accumulation_steps

    def forward_backward(self, accumulation_steps: int, measure_activations: bool) -> LoggedLoss:
        """The micro-batches of one iteration; returns this rank's sums of the logged loss, on the device."""
        reducer, activations, device, observer = self.zero.reducer, self.activations, self.state.device, self.observer
        logged = LoggedLoss(self.documents, device)
        micro_batches = observer.micro_batches(accumulation_steps)
        # --calculate-per-token-loss reads the micro-batches first, for their token count
        batches = self.per_token_batches(len(micro_batches))
        for micro_batch in micro_batches:
            observer.micro_batch_start(micro_batch)
            inputs, labels, masks = batches.pop(0) if batches else \
                split_micro_batch(next(self.train_batches), device, self.documents, self.state)
            last = micro_batch == accumulation_steps - 1
            with contextlib.nullcontext() if last else reducer.no_sync():
                # No autocast in 16-bit training: it only adds fp32 copies (8% slower, 1.3 GiB more on a 1.5B model).
                with observer.phase("forward"), \
                        activations.measuring() if measure_activations else contextlib.nullcontext():
                    losses = self.model(inputs, labels) if masks is None else self.model(inputs, labels, masks)
                    loss = self.micro_batch_loss(losses, masks, accumulation_steps)
                    self.loss_checks.keep(loss, accumulation_steps)
                with observer.phase("backward"):
                    self.zero.scale_loss(loss).backward()
            reducer.finish_grad_sync()
            logged.add(losses, masks, loss)
            observer.micro_batch_end(micro_batch)
        observer.passes_end()
        return logged
