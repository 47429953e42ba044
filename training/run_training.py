"""A prepared run trained to its end: the loop's parts (train step, interval metrics, evaluation, memory report) put
together for the cadence loop, and what a diverged run can restart from."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Optional

from base.process_clock import seconds_since_process_start
from data.documents import DocumentMasking, megatron_pad_id
from data.tokenizer import NullTokenizer, megatron_pad
from resilience.fault_injection import plan_faults
from resilience.fault_tolerance import FaultTolerance
from resilience.restart_progress import RestartProgress, restart_count, restarts_possible
from resilience.stragglers import StragglerReport
from training.divergence import resumable_checkpoint
from training.evaluation import Evaluator
from training.interval_metrics import IntervalMetrics
from training.loop import TrainingSummary, train
from training.loop_events import LoopEvents
from training.memory_report import FirstIterationMemory
from training.metrics import perplexity
from training.pipeline_step import PipelineForward, PipelineTrainStep
from training.prepare import Run
from training.train_step import DataParallelTrainStep, TrainingDiverged


def train_run(run: Run, fault_tolerance: Optional[FaultTolerance] = None) -> TrainingSummary:
    settings, start, log = run.settings, run.start, run.log
    config = settings.config
    training, checkpoint = config.training, config.checkpoint
    finished = start.iteration >= training.train_iters or (
        training.train_tokens is not None and settings.tokens_in(start.consumed_samples) >= training.train_tokens)
    if training.skip_train:
        finished = True
        log(f"> --skip-train: evaluating iteration {start.iteration}, training nothing")
    elif finished:
        log(f"> the checkpoint is already at {training.train_iters} iterations"
            f"{f' or {training.train_tokens} tokens' if training.train_tokens is not None else ''}; nothing to train")
    built, state, writer = run.built, run.state, run.writer
    try:
        train_batches = iter(run.data.make_train_loader(start.consumed_samples)) if not finished else iter(())
        step_class = PipelineTrainStep if state.pipeline_parallel_size > 1 else DataParallelTrainStep
        data = config.data
        pad, named = megatron_pad(run.tokenizer, data.null_tokenizer_pad_id)
        pad_id, pad_note = megatron_pad_id(pad, named, run.tokenizer.eod_id, data.allow_ambiguous_pad_tokens,
                                           from_flag=isinstance(run.tokenizer, NullTokenizer))
        if pad_note:
            log(pad_note)
        documents = DocumentMasking.of(run.tokenizer.eod_id, data.reset_position_ids, data.reset_attention_mask,
                                       data.eod_mask_loss,
                                       (data.goldfish_k, data.goldfish_h) if data.goldfish_loss else None, pad_id)
        # --rerun-mode's state machine (None: disabled)
        step = step_class(built.model, built.zero, train_batches, settings, state, built.activations, documents=documents,
                          rerun=run.rerun, cuda_graphs=built.cuda_graphs, rng=built.rng)
        logged = config.logging
        stragglers = (StragglerReport(state.comm, logged.straggler_minmax_count)
                      if logged.log_straggler and not logged.disable_straggler_on_startup else None)
        metrics = IntervalMetrics(settings, state, writer, built.activations, stragglers)
        eval_micro_batches = training.eval_batches * settings.batch.final_accumulation_steps
        forward = PipelineForward(built.model, state, config.model.hidden_size) \
            if state.pipeline_parallel_size > 1 else None
        evaluator = Evaluator(built.model, run.data.make_valid_loader, run.data.make_test_loader,
                              eval_micro_batches, config.training, state, writer, forward, documents)
        memory = FirstIterationMemory(built.zero.optimizer, settings, state, writer, built.activations,
                                      run.memory_check, first_iteration=start.iteration + 1,
                                      micro_batches=settings.batch.accumulation_steps_at(start.consumed_samples))
        events = loop_events(run, fault_tolerance)
        faults = plan_faults(training.fault_injector, state, start.iteration, log, restart=restart_count(os.environ)[0])
        try:
            summary = train(events.around_step(step), metrics, evaluator, memory, settings, state,
                            start_iteration=start.iteration,
                            consumed_samples=start.consumed_samples, schedule_samples=start.schedule_samples,
                            save_checkpoint=events.around_save(run.save), exit_conditions=run.exit_conditions,
                            commit_saves=run.save.poll if run.save is not None else None, faults=faults)
        except BaseException:
            if faults is not None:
                faults.end()
            raise
        if faults is not None:
            faults.end(log)
        if run.save is not None:  # the last save is committed first
            run.save.finish()
    except TrainingDiverged as error:
        if run.save is not None:  # every rank diverged at the same iteration, so
            run.save.finish()  # a background save is committed and can be named
        raise TrainingDiverged(f"{error}; {resumable_checkpoint(error.history, checkpoint.save, start.path)}") from None
    finally:  # closed before the last lines are said
        run.exit_conditions.close()
        run.writer.close()
    for line in summary.step_lines():
        log(line)
    if summary.trained_iterations:
        log(summary.effective_time_line(seconds_since_process_start()))
    if summary.final_valid_loss is not None:
        log(f"> final validation perplexity: {perplexity(summary.final_valid_loss):.3f}")
    metrics_file = Path(run.claimed.metrics_file)
    log(f"> metrics written to {metrics_file}")
    log(f"> draw the curves: {plot_command(metrics_file)}")
    return summary


def loop_events(run: Run, fault_tolerance: Optional[FaultTolerance]) -> LoopEvents:
    """The loop's watchers: fault tolerance, and rank 0's restart progress."""
    save_dir = run.settings.config.checkpoint.save
    if fault_tolerance is not None and run.start.path is not None:
        fault_tolerance.checkpoint_loaded()
    progress = None
    if save_dir and run.state.rank == 0 and (restarts_possible(os.environ) or fault_tolerance is not None):
        progress = RestartProgress(save_dir, run.start.iteration, os.environ, run.log)
    return LoopEvents(fault_tolerance, progress)


def plot_command(metrics_file: Path) -> str:
    """The command that draws a run's curves into curves.png beside its metrics."""
    return (f"python -m training.plot {shlex.quote(str(metrics_file))} "
            f"-o {shlex.quote(str(metrics_file.with_name('curves.png')))}")
