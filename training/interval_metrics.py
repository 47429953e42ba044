"""What the loop logs every --log-interval iterations: the interval's record (Megatron's iteration line, one
JSONL/W&B/TensorBoard record) with its ETA, and a short line now and then between records so a slow run is never
silent."""

from __future__ import annotations

from typing import Optional

from base.progress import ProgressLines
from parallel.fp8.guard import merge_iterations
from parallel.state import ParallelState
from resilience.stragglers import StragglerReport, format_stragglers
from training.metrics import (
    MetricsWriter,
    flops_per_iteration,
    format_console_line,
    format_duration,
    model_flops_utilization,
    peak_memory_bytes,
    remaining_seconds,
    run_peak_tflops,
)
from training.recompute_share import recomputed_share
from training.run_settings import RunSettings
from training.train_step import StepOutcome
from zero.activations import ActivationMonitor


class IntervalMetrics:
    def __init__(self, settings: RunSettings, state: ParallelState, writer: MetricsWriter,
                 activations: ActivationMonitor, stragglers: Optional[StragglerReport] = None) -> None:
        self.settings, self.state, self.writer, self.activations = settings, state, writer, activations
        self.stragglers = stragglers
        self.training = settings.config.training
        self.peak_tflops = run_peak_tflops(state.device, settings.config.logging.peak_tflops)
        self.losses: list[float] = []
        self.moe_losses: list[dict] = []
        self.fp8_guard: list[dict] = []
        self.times: list[float] = []
        self.samples: list[int] = []
        # between records far apart, a short line with the ETA; no record
        self.heartbeat = ProgressLines()
        config = settings.config
        self.recomputed_share = recomputed_share(config.activations, config.model, config.parallel)

    def flops_for(self, global_batch_size: int, recompute: float) -> float:
        config = self.settings.config
        return flops_per_iteration(config.model, global_batch_size, activation_recompute=recompute,
                                   padded_vocab_size=self.settings.padded_vocab_size)

    def eta_s(self, iteration: int, consumed_samples: int) -> float:
        return remaining_seconds(sum(self.times) / sum(self.samples), consumed_samples,
                                 self.training.train_iters - iteration, self.settings.batch.consumed_after)

    def add(self, iteration: int, consumed_samples: int, skipped_iterations: int, outcome: StepOutcome) -> None:
        """Count a finished iteration; at the end of an interval, write its record."""
        self.times.append(outcome.seconds)
        self.losses.append(outcome.loss)
        self.moe_losses.append(outcome.moe_losses)
        self.fp8_guard.append(outcome.fp8_guard)
        self.samples.append(outcome.global_batch_size)
        if self.stragglers is not None:
            self.stragglers.add(outcome.seconds, outcome.collective_wait_s)
        if iteration % self.training.log_interval == 0 or iteration == self.training.train_iters:
            self.write(iteration, consumed_samples, skipped_iterations, outcome)
        else:
            self.heartbeat.update(lambda: f" iteration {iteration:>8d}/{self.training.train_iters:>8d}, ETA: "
                                          + format_duration(self.eta_s(iteration, consumed_samples)))

    def write(self, iteration: int, consumed_samples: int, skipped_iterations: int, last: StepOutcome) -> None:
        self.writer.write(*self.record(iteration, consumed_samples, skipped_iterations, last))
        self.heartbeat.shown_alive()
        self.losses.clear()
        self.moe_losses.clear()
        self.fp8_guard.clear()
        self.times.clear()
        self.samples.clear()

    def record(self, iteration: int, consumed_samples: int, skipped_iterations: int,
               last: StepOutcome) -> tuple[dict, str]:
        """The interval's record and its console line."""
        settings, state, training = self.settings, self.state, self.training
        interval_s = sum(self.times)
        recompute = self.recomputed_share
        record = {
            "iteration": iteration,
            "consumed_samples": consumed_samples,
            "global_batch_size": last.global_batch_size,
            "loss": sum(self.losses) / len(self.losses),
            **{name: sum(losses[name] for losses in self.moe_losses) / len(self.moe_losses)
               for name in self.moe_losses[-1]},
            "lr": last.lr,
            "grad_norm": last.grad_norm,
            "iter_time_s": interval_s / len(self.times),
            # over the interval, whose batch size may ramp
            "tokens_per_s": sum(map(settings.tokens_in, self.samples)) / interval_s,
            "tflops_per_gpu": sum(self.flops_for(samples, recompute) for samples in self.samples)
            / (interval_s * state.world_size * 1e12),
            "memory_bytes": peak_memory_bytes(state.device),
            "comm_bytes": state.comm.stats.snapshot(),
        }
        if self.peak_tflops is not None:
            # MFU counts the model's FLOPs only, not a recompute's.
            model_flops = sum(self.flops_for(samples, recompute=False) for samples in self.samples)
            record["mfu"] = model_flops_utilization(model_flops, interval_s, state.world_size, self.peak_tflops)
        timings = self.activations.take_timings()
        if timings:
            for phase in ("forward", "recompute+backward"):
                record[f"checkpoint_{phase.replace('+', '_')}_s"] = sum(
                    seconds for name, seconds in timings if name == phase)
        record.update(merge_iterations(self.fp8_guard))
        if last.moe_per_layer:
            record["moe_per_layer"] = last.moe_per_layer
        if training.mixed_precision.fp16:
            record["loss_scale"] = last.loss_scale
            record["skipped_iterations"] = skipped_iterations
        line = format_console_line(record, training.train_iters, self.eta_s(iteration, consumed_samples))
        if self.stragglers is not None:  # every rank gathers here, at the same iteration
            record["straggler"] = self.stragglers.gather()
            line += f" stragglers: {format_stragglers(record['straggler'])} |"
        return record, line
