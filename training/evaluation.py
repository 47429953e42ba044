"""Evaluation on the validation and test splits, the loss reduced over the data-parallel group as training's
(training/logged_loss.py)."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import nn

from arguments.training_config import TrainingConfig
from data.documents import DocumentMasking, DocumentMasks, masked_token_mean
from data.documents_cp import masks_on_this_rank
from parallel.context_parallel import batch_on_this_rank
from parallel.state import ParallelState
from training.logged_loss import LoggedLoss
from training.metrics import MetricsWriter, format_eval_line, perplexity

# Re-creates an evaluation loader from its first sample.
LoaderFactory = Callable[[], Iterable[dict]]


def whole_tokens(batch: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs are a sample's tokens but the last, labels all but the first."""
    tokens = batch["tokens"].to(device, non_blocking=True)
    return tokens[:, :-1], tokens[:, 1:]


def split_tokens(batch: dict, device: torch.device,
                 state: Optional[ParallelState] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`whole_tokens`, with context parallelism this rank's chunks r and 2CP-1-r."""
    inputs, labels = whole_tokens(batch, device)
    if state is not None and state.context_parallel_size > 1:
        inputs, labels = batch_on_this_rank(inputs, state), batch_on_this_rank(labels, state)
    return inputs, labels


def mean_token_loss(losses: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """The micro-batch's mean token loss in fp32; under CP this rank's sum x CP over the CP-summed count, as
    Megatron-LM's loss_func."""
    losses = losses.float()
    if state.context_parallel_size == 1:
        return losses.mean()
    count = torch.tensor(float(losses.numel()), device=losses.device)
    state.comm.all_reduce(count, state.context_parallel_group, "cp")
    return losses.sum() * state.context_parallel_size / count


def micro_batch_loss(losses: torch.Tensor, masks: Optional[DocumentMasks], state: ParallelState) -> torch.Tensor:
    """A micro-batch's loss: `mean_token_loss`, or the masked mean (under CP over the CP-summed mask count)."""
    if masks is None or masks.loss_mask is None:
        return mean_token_loss(losses, state)
    if state.context_parallel_size == 1:
        return masked_token_mean(losses, masks)
    loss_mask = masks.loss_mask
    count = loss_mask.sum().detach()  # no autograd through the count
    state.comm.all_reduce(count, state.context_parallel_group, "cp")
    return (losses.float() * loss_mask).sum() * state.context_parallel_size / count.clamp(min=1.0)


def split_micro_batch(batch: dict, device: torch.device, documents: Optional[DocumentMasking],
                      state: Optional[ParallelState] = None
                      ) -> tuple[torch.Tensor, torch.Tensor, Optional[DocumentMasks]]:
    """split_tokens plus the document masks a document flag asks for (built before the pad id becomes token 0)."""
    if documents is None:
        return (*split_tokens(batch, device, state), None)
    inputs, labels = whole_tokens(batch, device)
    if state is None or state.context_parallel_size == 1:
        masks = documents.masks(inputs, labels)
        return documents.unpadded(inputs), documents.unpadded(labels), masks
    masks = masks_on_this_rank(documents, inputs, labels, state.context_parallel_size, state.context_parallel_rank)
    inputs, labels = documents.unpadded(inputs), documents.unpadded(labels)
    return batch_on_this_rank(inputs, state), batch_on_this_rank(labels, state), masks


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[dict], num_micro_batches: int, state: ParallelState,
             forward: Optional[Callable[..., torch.Tensor]] = None,
             documents: Optional[DocumentMasking] = None) -> float:
    """The loss over the first `num_micro_batches` of `loader` on every DP rank: with a loss mask the masked sum over
    the token count of them all, as Megatron-LM's `evaluate`, else the mean of their mean token losses."""
    forward = forward or model
    model.eval()
    logged = LoggedLoss(documents, state.device)
    count = 0
    try:
        for batch, _ in zip(loader, range(num_micro_batches)):
            inputs, labels, masks = split_micro_batch(batch, state.device, documents, state)
            per_token = forward(inputs, labels) if masks is None else forward(inputs, labels, masks)
            logged.add(per_token, masks, None if logged.masked else micro_batch_loss(per_token, masks, state))
            count += 1
    finally:
        model.train()
    if count == 0:
        raise RuntimeError("evaluation data ran out before the first batch")
    logged.average_over(count)
    if state.pipeline_parallel_size > 1:  # the loss is the last stage's; every stage records it
        torch.distributed.broadcast(logged.sums, src=state.stage_rank(-1), group=state.pipeline_parallel_group)
    return logged.reduce(state).item()


class Evaluator:
    """The validation split every --eval-interval iterations and at the end, the test split at the end."""

    def __init__(self, model: nn.Module, make_valid_loader: Optional[LoaderFactory],
                 make_test_loader: Optional[LoaderFactory], micro_batches: int, training: TrainingConfig,
                 state: ParallelState, writer: MetricsWriter,
                 forward: Optional[Callable[..., torch.Tensor]] = None,
                 documents: Optional[DocumentMasking] = None) -> None:
        self.model, self.training, self.state, self.writer = model, training, state, writer
        self.forward, self.documents = forward, documents  # see evaluate
        self.loaders = {"valid": make_valid_loader, "test": make_test_loader}
        self.micro_batches = micro_batches

    def due(self, split: str, iteration: int, last: bool) -> bool:
        if self.loaders[split] is None or self.micro_batches <= 0:
            return False
        return split == "test" or last or iteration % self.training.eval_interval == 0

    def run(self, split: str, iteration: int, consumed_samples: int) -> float:
        loss = evaluate(self.model, self.loaders[split](), self.micro_batches, self.state,
                        self.forward, self.documents)
        record = {"iteration": iteration, "consumed_samples": consumed_samples, "split": split,
                  "loss": loss, "ppl": perplexity(loss)}
        self.writer.write(record, format_eval_line(record))
        return loss
