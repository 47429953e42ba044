"""Evaluation on the validation and test splits, averaged over the data-parallel group."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

import torch
from torch import nn

from arguments.training_config import TrainingConfig
from data.documents import DocumentMasking, DocumentMasks, masked_token_mean
from data.documents_cp import masks_on_this_rank
from parallel.context_parallel import batch_on_this_rank
from parallel.state import ParallelState
from training.metrics import MetricsWriter, format_eval_line, perplexity

# Re-creates an evaluation loader from its first sample, so every evaluation sees the same batches.
LoaderFactory = Callable[[], Iterable[dict]]


def whole_tokens(batch: dict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples hold seq_length+1 tokens: inputs are all but the last, labels all but the first."""
    tokens = batch["tokens"].to(device, non_blocking=True)
    return tokens[:, :-1], tokens[:, 1:]


def split_tokens(batch: dict, device: torch.device,
                 state: Optional[ParallelState] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`whole_tokens`; with context parallelism (a `state` of CP > 1) this rank keeps its chunks r and 2CP-1-r of
    both, as Megatron's get_batch_on_this_cp_rank: every CP rank read the same samples."""
    inputs, labels = whole_tokens(batch, device)
    if state is not None and state.context_parallel_size > 1:
        inputs, labels = batch_on_this_rank(inputs, state), batch_on_this_rank(labels, state)
    return inputs, labels


def mean_token_loss(losses: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """The micro-batch's mean token loss, fp32. With context parallelism, Megatron-LM's loss_func
    (pretrain_gpt.py since "Fix Cross Entropy Loss Averaging", adfa873d): this rank's loss sum and the token
    count summed over the CP group, the sum x CP / the count, so that the mean over DP x CP the gradients and the
    reported loss then take is the whole sequence's mean (the count is summed without autograd, as there). Every
    CP rank holds as many tokens here (no loss mask; `micro_batch_loss` sums a mask's count the same way)."""
    losses = losses.float()
    if state.context_parallel_size == 1:
        return losses.mean()
    count = torch.tensor(float(losses.numel()), device=losses.device)
    state.comm.all_reduce(count, state.context_parallel_group, "cp")
    return losses.sum() * state.context_parallel_size / count


def micro_batch_loss(losses: torch.Tensor, masks: Optional[DocumentMasks], state: ParallelState) -> torch.Tensor:
    """A micro-batch's loss from this rank's per-token losses: `mean_token_loss` without a loss mask; with one
    (--eod-mask-loss, --goldfish-loss) the masked mean of data/documents.py masked_token_mean, and under context
    parallelism this rank's masked sum x CP / the mask's count summed over the CP group (clamped at 1), so the
    mean over CP the gradients take is the whole sample's masked mean, whichever rank holds how many masked
    tokens. That is Megatron-LM's loss_func of core_r0.9-r0.12 (pretrain_gpt.py: `loss = cat([sum(losses x
    loss_mask), loss_mask.sum()])`, all-reduced over the CP group, `loss[0] * cp_size` over the summed count);
    since core_v0.13 loss_func returns the local sum and count and schedules.forward_step_calc_loss divides each
    CP rank's sum by its own count, so a rank holding fewer unmasked tokens weighs each of them more, unless
    --calculate-per-token-loss, which divides by the count summed over DP x CP: per micro-batch, the reduction here."""
    if masks is None or masks.loss_mask is None:
        return mean_token_loss(losses, state)
    if state.context_parallel_size == 1:
        return masked_token_mean(losses, masks)
    loss_mask = masks.loss_mask
    count = loss_mask.sum().detach()  # no autograd through the count, as Megatron's
    state.comm.all_reduce(count, state.context_parallel_group, "cp")
    return (losses.float() * loss_mask).sum() * state.context_parallel_size / count.clamp(min=1.0)


def split_micro_batch(batch: dict, device: torch.device, documents: Optional[DocumentMasking],
                      state: Optional[ParallelState] = None
                      ) -> tuple[torch.Tensor, torch.Tensor, Optional[DocumentMasks]]:
    """split_tokens (this rank's chunks with context parallelism), and the inputs' document masks where
    --reset-position-ids, --reset-attention-mask, --eod-mask-loss or --goldfish-loss asks for them (data/documents.py;
    None otherwise: nothing is built). With context parallelism the masks are the whole sample's, split with the
    tokens (data/documents_cp.py)."""
    if documents is None:
        return (*split_tokens(batch, device, state), None)
    inputs, labels = whole_tokens(batch, device)
    if state is None or state.context_parallel_size == 1:
        return inputs, labels, documents.masks(inputs, labels)
    masks = masks_on_this_rank(documents, inputs, labels, state.context_parallel_size, state.context_parallel_rank)
    return batch_on_this_rank(inputs, state), batch_on_this_rank(labels, state), masks


def average_over_data_parallel(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """Mean of `tensor` over the DP group, in place (a no-op without data parallelism). With context parallelism
    over DP x CP: each CP rank's value is its share of the whole sample's mean (`micro_batch_loss`: its sum x CP
    over the CP group's token count), so their mean is the whole sequence's."""
    size = state.data_context_parallel_size
    if size > 1:
        state.comm.all_reduce(tensor, state.data_context_parallel_group, "dp")
        tensor /= size
    return tensor


@torch.no_grad()
def evaluate(model: nn.Module, loader: Iterable[dict], num_micro_batches: int, state: ParallelState,
             forward: Optional[Callable[..., torch.Tensor]] = None,
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
            total += micro_batch_loss(per_token, masks, state)
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
