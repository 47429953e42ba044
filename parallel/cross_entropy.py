"""Cross entropy over logits whose vocabulary is split across the tensor-parallel group: only three [batch, seq]
statistics cross the group (max, target logit, sum of exp), as Megatron-Core's, and the backward needs no communication.
Vocabulary padding is left out of the softmax; an optional z-loss adds s * log(Z)^2."""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.state import ParallelState


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, vocab_start_index: int, vocab_size: int,
                state: ParallelState, z_loss_strength: float = 0.0) -> torch.Tensor:
        local_vocab = logits.shape[-1]
        # columns [real_columns, local_vocab) are padding (possibly the whole shard)
        real_columns = max(0, min(local_vocab, vocab_size - vocab_start_index))
        if real_columns > 0:
            logits_max = logits[..., :real_columns].amax(dim=-1).float()
        else:
            logits_max = torch.full(logits.shape[:-1], float("-inf"), device=logits.device)
        state.comm.all_reduce(logits_max, state.tensor_parallel_group, "tp", op=dist.ReduceOp.MAX)

        shifted = logits - logits_max.unsqueeze(-1)
        shifted[..., real_columns:] = float("-inf")

        not_here = (target < vocab_start_index) | (target >= vocab_start_index + local_vocab)
        local_target = (target - vocab_start_index).masked_fill(not_here, 0)
        target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(not_here, 0.0)

        exp_logits = shifted.exp_()
        statistics = torch.stack([target_logit, exp_logits.sum(dim=-1)])
        state.comm.all_reduce(statistics, state.tensor_parallel_group, "tp")
        target_logit, sum_exp = statistics.unbind(0)

        softmax = exp_logits.div_(sum_exp.unsqueeze(-1))
        loss = torch.log(sum_exp) - target_logit
        if z_loss_strength > 0:
            log_z = torch.log(sum_exp) + logits_max
            loss = loss + z_loss_strength * log_z * log_z
            softmax.mul_((1.0 + 2.0 * z_loss_strength * log_z).unsqueeze(-1))  # d(s log(Z)^2)/d logits
        ctx.save_for_backward(softmax, local_target, not_here)
        ctx.input_dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        softmax, local_target, not_here = ctx.saved_tensors
        # the saved softmax becomes the gradient in place, as in Megatron: it is the largest activation. A second
        # backward is refused by autograd's version check
        grad = softmax
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -(~not_here).to(grad.dtype).unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(ctx.input_dtype), None, None, None, None, None


def vocab_parallel_cross_entropy(vocab_parallel_logits: torch.Tensor, target: torch.Tensor,
                                 vocab_start_index: int, vocab_size: int, state: ParallelState,
                                 z_loss_strength: float = 0.0) -> torch.Tensor:
    """Per-token cross entropy [batch, seq] (fp32) from this rank's logit shard [batch, seq, V/TP]. `vocab_start_index`:
    the shard's first global column; `vocab_size`: the real vocabulary; `target`: global ids, the same on every TP
    rank."""
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, vocab_start_index, vocab_size, state,
                                            z_loss_strength)
