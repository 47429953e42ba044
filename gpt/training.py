"""The training loop: micro-batches with gradient accumulation, clipping, AdamW, evaluation, logging.

Everything the loop needs is passed in (model, optimizer, data, config, parallel state, metrics
writer); it owns only the cadence: when to step, evaluate and log.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional

import torch
from torch import nn

from gpt.config import OptimizerConfig, PretrainConfig
from gpt.metrics import (MetricsWriter, flops_per_iteration, format_console_line, format_eval_line,
                         peak_memory_bytes, perplexity)
from gpt.schedule import learning_rate
from parallel.grad_norm import clip_gradients
from parallel.state import ParallelState

# Re-creates an evaluation loader from its first sample, so every evaluation sees the same batches.
LoaderFactory = Callable[[], Iterable[dict]]


@dataclass
class TrainingSummary:
    iterations: int = 0
    consumed_samples: int = 0
    train_losses: list[float] = field(default_factory=list)  # one per iteration
    final_valid_loss: Optional[float] = None
    final_test_loss: Optional[float] = None


def apex_fused_adam():
    """NVIDIA apex's FusedAdam when the real apex (built from source) is installed, else None."""
    try:
        from apex.optimizers import FusedAdam
    except ImportError:
        return None
    return FusedAdam


def build_optimizer(model: nn.Module, config: OptimizerConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; biases and LayerNorm parameters (every parameter with fewer than 2 dims) get no decay."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    betas = (config.adam_beta1, config.adam_beta2)
    fused_adam = apex_fused_adam() if device.type == "cuda" else None
    if fused_adam is not None:
        return fused_adam(groups, lr=config.lr, betas=betas, eps=config.adam_eps, adam_w_mode=True)
    # PyTorch's own multi-tensor kernels: fused on CUDA, foreach on CPU.
    kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=config.lr, betas=betas, eps=config.adam_eps, **kernel)


def _autocast(config: PretrainConfig, device: torch.device):
    if config.training.bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _split_tokens(batch: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples hold seq_length+1 tokens: inputs are all but the last, labels all but the first."""
    tokens = batch["tokens"].to(device, non_blocking=True)
    return tokens[:, :-1], tokens[:, 1:]


def average_over_data_parallel(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """Mean of `tensor` over the DP group, in place (a no-op without data parallelism)."""
    if state.data_parallel_size > 1:
        state.comm.all_reduce(tensor, state.data_parallel_group, "dp")
        tensor /= state.data_parallel_size
    return tensor


def average_data_parallel_gradients(model: nn.Module, state: ParallelState) -> None:
    """Plain data parallelism: every rank ends with the mean gradient of the global batch.

    One all-reduce per parameter after the whole backward; ZeRO's bucketed, overlapped reduction
    replaces this when a ZeRO stage is selected."""
    if state.data_parallel_size == 1:
        return
    for param in model.parameters():
        if param.grad is not None:
            average_over_data_parallel(param.grad, state)


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[dict], num_micro_batches: int, config: PretrainConfig,
             state: ParallelState) -> float:
    """Mean token loss over the first `num_micro_batches` micro-batches of `loader` on every DP rank."""
    model.eval()
    total = torch.zeros((), device=state.device)
    count = 0
    try:
        for batch, _ in zip(loader, range(num_micro_batches)):
            inputs, labels = _split_tokens(batch, state.device)
            with _autocast(config, state.device):
                total += model(inputs, labels).mean()
            count += 1
    finally:
        model.train()
    if count == 0:
        raise RuntimeError("evaluation data ran out before the first batch")
    return average_over_data_parallel(total / count, state).item()


def train(model: nn.Module, optimizer: torch.optim.Optimizer, train_batches: Iterator[dict],
          make_valid_loader: Optional[LoaderFactory], make_test_loader: Optional[LoaderFactory],
          config: PretrainConfig, state: ParallelState, writer: MetricsWriter) -> TrainingSummary:
    training, device = config.training, state.device
    accumulation_steps = training.gradient_accumulation_steps(state.data_parallel_size)
    flops = flops_per_iteration(config.model, training.global_batch_size,
                                padded_vocab_size=config.model.padded_vocab_size(state.tensor_parallel_size))
    eval_micro_batches = training.eval_iters * accumulation_steps
    summary = TrainingSummary()
    interval_losses: list[float] = []
    interval_times: list[float] = []
    model.train()

    for iteration in range(1, training.train_iters + 1):
        iteration_start = time.perf_counter()
        lr = learning_rate(iteration, config.optimizer, training.train_iters)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        state.comm.stats.snapshot_and_reset()  # comm_bytes below cover this iteration only

        iteration_loss = torch.zeros((), device=device)
        for _ in range(accumulation_steps):
            inputs, labels = _split_tokens(next(train_batches), device)
            with _autocast(config, device):
                loss = model(inputs, labels).mean() / accumulation_steps
            loss.backward()
            iteration_loss += loss.detach()

        average_data_parallel_gradients(model, state)
        grad_norm = clip_gradients(model.parameters(), config.optimizer.clip_grad, state)
        optimizer.step()

        loss_value = average_over_data_parallel(iteration_loss, state).item()  # waits for the device, so the timing below is complete
        interval_times.append(time.perf_counter() - iteration_start)
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"loss is {loss_value} at iteration {iteration}; lower --lr or check data")
        summary.train_losses.append(loss_value)
        interval_losses.append(loss_value)
        summary.iterations = iteration
        summary.consumed_samples += training.global_batch_size

        if iteration % training.log_interval == 0 or iteration == training.train_iters:
            iter_time = sum(interval_times) / len(interval_times)
            record = {
                "iteration": iteration,
                "consumed_samples": summary.consumed_samples,
                "loss": sum(interval_losses) / len(interval_losses),
                "lr": lr,
                "grad_norm": grad_norm,
                "iter_time_s": iter_time,
                "tokens_per_s": training.global_batch_size * config.model.seq_length / iter_time,
                "tflops_per_gpu": flops / (iter_time * state.world_size * 1e12),
                "memory_bytes": peak_memory_bytes(device),
                "comm_bytes": state.comm.stats.snapshot(),
            }
            writer.write(record, format_console_line(record, training.train_iters))
            interval_losses.clear()
            interval_times.clear()

        last = iteration == training.train_iters
        if make_valid_loader is not None and eval_micro_batches > 0 and (
                iteration % training.eval_interval == 0 or last):
            summary.final_valid_loss = _evaluate_and_log(model, make_valid_loader, eval_micro_batches,
                                                         "valid", iteration, summary, config, state, writer)

    if make_test_loader is not None and eval_micro_batches > 0:
        summary.final_test_loss = _evaluate_and_log(model, make_test_loader, eval_micro_batches, "test",
                                                    summary.iterations, summary, config, state, writer)
    return summary


def _evaluate_and_log(model, make_loader: LoaderFactory, micro_batches: int, split: str, iteration: int,
                      summary: TrainingSummary, config: PretrainConfig, state: ParallelState,
                      writer: MetricsWriter) -> float:
    loss = evaluate(model, make_loader(), micro_batches, config, state)
    record = {"iteration": iteration, "consumed_samples": summary.consumed_samples, "split": split,
              "loss": loss, "ppl": perplexity(loss)}
    writer.write(record, format_eval_line(record))
    return loss
