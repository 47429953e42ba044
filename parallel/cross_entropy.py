"""Cross entropy over logits whose vocabulary is split across the tensor-parallel group.

Gathering [batch, seq, vocab] logits would cost each rank the full logit tensor in memory and
traffic; instead only three [batch, seq] statistics cross the group (Megatron-Core's method):

    1. max over the vocabulary       (all-reduce MAX; for a stable exp)
    2. the target's shifted logit    (the rank owning the target contributes it, others 0)
    3. sum of exp(shifted logits)    (2 and 3 travel in one all-reduce SUM)

    loss = log(sum_exp) - target_logit,   d loss / d logits = softmax - one_hot(target)

The backward needs no communication: each rank's gradient is its shard of softmax - one_hot. With a z-loss
strength s > 0 (llm-jp's fork, --z-loss-strength / --use-z-loss: its tensor_parallel/cross_entropy.py) each token's
loss gains s * log(Z)^2 (log(Z) = log(sum_exp) + max) and the gradient is softmax * (1 + 2 s log(Z)) - one_hot.

Vocabulary padding (global column >= `vocab_size`) is excluded from the softmax, so the loss does not depend on the
padding. Everything is computed in fp32 (fp64 for fp64 logits); the gradient comes back in the logits' dtype."""

from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.state import ParallelState


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, vocab_start_index: int, vocab_size: int,
                state: ParallelState, z_loss_strength: float = 0.0) -> torch.Tensor:
        local_vocab = logits.shape[-1]
        # Columns [real_columns, local_vocab) of this shard are padding (possibly the whole shard).
        real_columns = max(0, min(local_vocab, vocab_size - vocab_start_index))
        if real_columns > 0:
            logits_max = logits[..., :real_columns].amax(dim=-1).float()
        else:
            logits_max = torch.full(logits.shape[:-1], float("-inf"), device=logits.device)
        state.comm.all_reduce(logits_max, state.tensor_parallel_group, "tp", op=dist.ReduceOp.MAX)

        # logits (bf16 or fp32) - fp32 max allocates one fp32 tensor, reused in place below.
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
        # The saved softmax becomes the gradient in place, as in Megatron: it is the size of the logits
        # shard, the largest activation of the model. The price is one backward per forward; a second
        # one (retain_graph) is refused by autograd's version check, never silently wrong.
        grad = softmax
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -(~not_here).to(grad.dtype).unsqueeze(-1))
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad.to(ctx.input_dtype), None, None, None, None, None


def vocab_parallel_cross_entropy(vocab_parallel_logits: torch.Tensor, target: torch.Tensor,
                                 vocab_start_index: int, vocab_size: int, state: ParallelState,
                                 z_loss_strength: float = 0.0) -> torch.Tensor:
    """Per-token cross entropy [batch, seq] (fp32) from this rank's logit shard [batch, seq, V/TP].

    `vocab_start_index` is the global vocabulary index of the shard's first column (the token
    embedding's `vocab_start_index` when the output layer is tied); `vocab_size` is the real,
    unpadded vocabulary. `target` holds global token ids and must be the same on every TP rank.
    `z_loss_strength` > 0 adds that times log(Z)^2 to each token's loss (llm-jp's z-loss).
    """
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, vocab_start_index, vocab_size, state,
                                            z_loss_strength)
