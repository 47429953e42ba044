"""The output layer and the vocab-parallel cross entropy in one (--cross-entropy-loss-fusion), never holding the full
logits: chunks of tokens are reduced to the unfused path's per-token statistics and dropped, only the log-sum-exp is
kept, and the backward recomputes each chunk's logits (one more GEMM per chunk)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallel.state import ParallelState

# tokens whose logits exist at once: 4096 x 50304 fp32 is 0.8 GB at TP 1
DEFAULT_CHUNK_TOKENS = 4096


def _real_columns(local_vocab: int, vocab_start_index: int, vocab_size: int) -> int:
    """Columns [real, local_vocab) of this shard are vocabulary padding."""
    return max(0, min(local_vocab, vocab_size - vocab_start_index))


def _local_target(target: torch.Tensor, vocab_start_index: int, local_vocab: int):
    not_here = (target < vocab_start_index) | (target >= vocab_start_index + local_vocab)
    return (target - vocab_start_index).masked_fill(not_here, 0), not_here


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, vocab_start_index: int,
                vocab_size: int, state: ParallelState, chunk_tokens: int) -> torch.Tensor:
        flat_hidden = hidden.reshape(-1, hidden.shape[-1])
        flat_target = target.reshape(-1)
        local_vocab = weight.shape[0]
        real = _real_columns(local_vocab, vocab_start_index, vocab_size)
        stat_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        losses = torch.empty(flat_target.shape, dtype=stat_dtype, device=hidden.device)
        log_sum_exp = torch.empty_like(losses)
        for start in range(0, flat_target.numel(), chunk_tokens):
            end = min(start + chunk_tokens, flat_target.numel())
            logits = F.linear(flat_hidden[start:end], weight)
            if real > 0:
                logits_max = logits[:, :real].amax(dim=-1).to(stat_dtype)
            else:
                logits_max = torch.full((end - start,), float("-inf"), dtype=stat_dtype, device=hidden.device)
            state.comm.all_reduce(logits_max, state.tensor_parallel_group, "tp", op=dist.ReduceOp.MAX)
            shifted = logits - logits_max.unsqueeze(-1)
            shifted[:, real:] = float("-inf")
            local_target, not_here = _local_target(flat_target[start:end], vocab_start_index, local_vocab)
            target_logit = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(not_here, 0.0)
            statistics = torch.stack([target_logit, shifted.exp_().sum(dim=-1)])
            state.comm.all_reduce(statistics, state.tensor_parallel_group, "tp")
            target_logit, sum_exp = statistics.unbind(0)
            losses[start:end] = torch.log(sum_exp) - target_logit
            log_sum_exp[start:end] = logits_max + torch.log(sum_exp)
        ctx.save_for_backward(hidden, weight, target, log_sum_exp)
        ctx.vocab_start_index, ctx.real, ctx.chunk_tokens = vocab_start_index, real, chunk_tokens
        return losses.view(target.shape)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        hidden, weight, target, log_sum_exp = ctx.saved_tensors
        flat_hidden = hidden.reshape(-1, hidden.shape[-1])
        flat_target, flat_grad = target.reshape(-1), grad_loss.reshape(-1)
        grad_hidden = torch.empty_like(flat_hidden) if ctx.needs_input_grad[0] else None
        # accumulated in fp32 across chunks: a bf16 weight's gradient rounds once
        grad_weight = torch.zeros(weight.shape, dtype=log_sum_exp.dtype, device=weight.device)
        local_vocab = weight.shape[0]
        for start in range(0, flat_target.numel(), ctx.chunk_tokens):
            end = min(start + ctx.chunk_tokens, flat_target.numel())
            chunk_hidden = flat_hidden[start:end]
            logits = F.linear(chunk_hidden, weight)
            # softmax - one_hot(target), times the loss's gradient
            grad_logits = (logits - log_sum_exp[start:end].unsqueeze(-1)).exp_()
            grad_logits[:, ctx.real:] = 0.0
            local_target, not_here = _local_target(flat_target[start:end], ctx.vocab_start_index, local_vocab)
            grad_logits.scatter_add_(-1, local_target.unsqueeze(-1), -(~not_here).to(grad_logits.dtype).unsqueeze(-1))
            grad_logits.mul_(flat_grad[start:end].unsqueeze(-1))
            grad_logits = grad_logits.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[start:end] = grad_logits @ weight
            grad_weight += (grad_logits.t() @ chunk_hidden).to(grad_weight.dtype)
        grad_hidden = None if grad_hidden is None else grad_hidden.view(hidden.shape)
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               vocab_start_index: int, vocab_size: int, state: ParallelState,
                               chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Per-token cross entropy [batch, seq] of `F.linear(hidden, weight)` against global `target` ids, without the
    logits. `hidden` must already be in the TP region."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, target, vocab_start_index, vocab_size, state,
                                            chunk_tokens)
