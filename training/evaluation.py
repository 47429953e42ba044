"""Evaluation on the validation and test splits, averaged over the data-parallel group."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import nn

from arguments.config import PretrainConfig
from data.documents import DocumentMasking, DocumentMasks, masked_token_mean
from parallel.context_parallel import batch_on_this_rank
from parallel.state import ParallelState
from training.metrics import MetricsWriter, format_eval_line, perplexity

# Re-creates an evaluation loader from its first sample, so every evaluation sees the same batches.
LoaderFactory = Callable[[], Iterable[dict]]


def split_tokens(batch: dict, device: torch.device,
                 state: Optional[ParallelState] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples hold seq_length+1 tokens: inputs are all but the last, labels all but the first. With context
    parallelism (a `state` of CP > 1) this rank keeps its chunks r and 2CP-1-r of both, as Megatron's
    get_batch_on_this_cp_rank: every CP rank read the same samples."""
    tokens = batch["tokens"].to(device, non_blocking=True)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    if state is not None and state.context_parallel_size > 1:
        inputs, labels = batch_on_this_rank(inputs, state), batch_on_this_rank(labels, state)
    return inputs, labels


def mean_token_loss(losses: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """The micro-batch's mean token loss, fp32. With context parallelism, Megatron-LM's loss_func
    (pretrain_gpt.py since "Fix Cross Entropy Loss Averaging", adfa873d): this rank's loss sum and the token
    count summed over the CP group, the sum x CP / the count, so that the mean over DP x CP the gradients and the
    reported loss then take is the whole sequence's mean (the count is summed without autograd, as there). Every
    CP rank holds as many tokens here (no loss mask), and a mask's count would be summed the same way."""
    losses = losses.float()
    if state.context_parallel_size == 1:
        return losses.mean()
    count = torch.tensor(float(losses.numel()), device=losses.device)
    state.comm.all_reduce(count, state.context_parallel_group, "cp")
    return losses.sum() * state.context_parallel_size / count


def split_micro_batch(batch: dict, device: torch.device, documents: Optional[DocumentMasking],
                      state: Optional[ParallelState] = None
                      ) -> tuple[torch.Tensor, torch.Tensor, Optional[DocumentMasks]]:
    """split_tokens (this rank's chunks with context parallelism), and the inputs' document masks where
    --reset-position-ids, --reset-attention-mask, --eod-mask-loss or --goldfish-loss asks for them (data/documents.py; None
    otherwise: nothing is built; refused with context parallelism)."""
    inputs, labels = split_tokens(batch, device, state)
    return inputs, labels, documents.masks(inputs, labels) if documents is not None else None


def average_over_data_parallel(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """Mean of `tensor` over the DP group, in place (a no-op without data parallelism). With context parallelism
    over DP x CP: each CP rank's value is the mean over its chunks, and every CP rank holds as many tokens (no
    loss mask here), so their mean is the whole sequence's."""
    size = state.data_context_parallel_size
    if size > 1:
        state.comm.all_reduce(tensor, state.data_context_parallel_group, "dp")
        tensor /= size
    return tensor


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[dict], num_micro_batches: int, config: PretrainConfig,
             state: ParallelState, forward: Optional[Callable[..., torch.Tensor]] = None,
             documents: Optional[DocumentMasking] = None) -> float:
    """Mean token loss over the first `num_micro_batches` micro-batches of `loader` on every DP rank.
    `forward(inputs, labels, documents)`: the per-token loss (the model's own forward unless given: with
    pipeline stages, training/pipeline_step.py's PipelineForward, whose loss exists on the last stage only).
    `documents`: the training's document masking, which evaluation uses too (Megatron's evaluate runs the same
    forward_step, masks and loss_func): each micro-batch's loss is then the masked mean, as in training."""
    forward = forward or model
    model.eval()
    total = torch.zeros((), device=state.device)
    count = 0
    try:
        for batch, _ in zip(loader, range(num_micro_batches)):
            inputs, labels, masks = split_micro_batch(batch, state.device, documents, state)
            per_token = forward(inputs, labels) if masks is None else forward(inputs, labels, masks)
            total += mean_token_loss(per_token, state) if masks is None else masked_token_mean(per_token, masks)
            count += 1
    finally:
        model.train()
    if count == 0:
        raise RuntimeError("evaluation data ran out before the first batch")
    mean = total / count
    if state.pipeline_parallel_size > 1:  # the loss is the last stage's; every stage records it
        torch.distributed.broadcast(mean, src=state.stage_rank(-1), group=state.pipeline_parallel_group)
    return average_over_data_parallel(mean, state).item()


class Evaluator:
    """The validation split every --eval-interval iterations and at the end, the test split once at the
    end: --eval-iters global batches each, one record per evaluation."""

    def __init__(self, model: nn.Module, make_valid_loader: Optional[LoaderFactory],
                 make_test_loader: Optional[LoaderFactory], micro_batches: int, config: PretrainConfig,
                 state: ParallelState, writer: MetricsWriter,
                 forward: Optional[Callable[..., torch.Tensor]] = None,
                 documents: Optional[DocumentMasking] = None) -> None:
        self.model, self.config, self.state, self.writer = model, config, state, writer
        self.forward, self.documents = forward, documents  # see evaluate
        self.loaders = {"valid": make_valid_loader, "test": make_test_loader}
        self.micro_batches = micro_batches

    def due(self, split: str, iteration: int, last: bool) -> bool:
        if self.loaders[split] is None or self.micro_batches <= 0:
            return False
        return split == "test" or last or iteration % self.config.training.eval_interval == 0

    def run(self, split: str, iteration: int, consumed_samples: int) -> float:
        loss = evaluate(self.model, self.loaders[split](), self.micro_batches, self.config, self.state,
                        self.forward, self.documents)
        record = {"iteration": iteration, "consumed_samples": consumed_samples, "split": split,
                  "loss": loss, "ppl": perplexity(loss)}
        self.writer.write(record, format_eval_line(record))
        return loss
