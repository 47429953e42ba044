"""--cross-entropy-loss-fusion's fallback (issue 40, point 5): the chunked linear + vocab-parallel cross
entropy gives the unfused path's loss and gradients, at TP 1 and TP 2, with vocabulary padding and chunks
that do not divide the tokens. Both paths compute in fp32; only the GEMMs' blocking differs, so the
tolerance is fp32 rounding: rtol 1e-5, atol 1e-6."""


import pytest
import torch
import torch.nn.functional as F

import gpt.output_head
from arguments.config import ModelConfig
from base.options import replace_settings
from gpt.model import build_gpt_model
from parallel.cross_entropy import vocab_parallel_cross_entropy
from parallel.fused_linear_cross_entropy import fused_linear_cross_entropy
from parallel.mappings import copy_to_tensor_parallel_region
from parallel.state import ParallelState, destroy, initialize
from tests.distributed import run_distributed

SINGLE = ParallelState(device=torch.device("cpu"))
VOCAB, PADDED, HIDDEN = 37, 40, 16
TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def _inputs():
    generator = torch.Generator().manual_seed(7)
    hidden = torch.randn(2, 7, HIDDEN, generator=generator)
    weight = torch.randn(PADDED, HIDDEN, generator=generator) * 0.5
    weight[VOCAB:] = 0.0  # padding rows are zeros, as the embedding initialises them
    target = torch.randint(0, VOCAB, (2, 7), generator=generator)
    grad_loss = torch.rand(2, 7, generator=generator)  # not all ones: the loss's gradient must scale each token
    return hidden, weight, target, grad_loss


def _loss_and_grads(loss_fn, hidden, weight, target, grad_loss, state=SINGLE):
    hidden = hidden.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    loss = loss_fn(copy_to_tensor_parallel_region(hidden, state), weight, target)
    loss.backward(grad_loss)
    return loss.detach(), hidden.grad, weight.grad


def _unfused(start, state=SINGLE):
    return lambda hidden, weight, target: vocab_parallel_cross_entropy(F.linear(hidden, weight), target, start,
                                                                       VOCAB, state)


def _fused(start, chunk_tokens, state=SINGLE):
    return lambda hidden, weight, target: fused_linear_cross_entropy(hidden, weight, target, start, VOCAB, state,
                                                                     chunk_tokens=chunk_tokens)


@pytest.mark.parametrize("chunk_tokens", [1, 5, 14, 4096])
def test_fused_equals_unfused_at_tp1(chunk_tokens):
    inputs = _inputs()
    reference = _loss_and_grads(_unfused(0), *inputs)
    fused = _loss_and_grads(_fused(0, chunk_tokens), *inputs)
    for got, expected in zip(fused, reference):
        torch.testing.assert_close(got, expected, **TOLERANCE)
    # and the unfused loss is the textbook one (padding excluded)
    logits = F.linear(inputs[0], inputs[1])[..., :VOCAB]
    torch.testing.assert_close(fused[0], F.cross_entropy(logits.transpose(1, 2), inputs[2], reduction="none"),
                               **TOLERANCE)


def _tp2_worker(rank, world_size):
    state = initialize("cpu", tensor_parallel_size=2)
    try:
        hidden, weight, target, grad_loss = _inputs()
        rows = PADDED // 2
        start = state.tensor_parallel_rank * rows
        shard = weight[start:start + rows]
        reference_loss, reference_hidden_grad, reference_weight_grad = _loss_and_grads(_unfused(0), hidden, weight,
                                                                                       target, grad_loss)
        loss, hidden_grad, weight_grad = _loss_and_grads(_fused(start, 5, state), hidden, shard, target, grad_loss,
                                                         state)
        torch.testing.assert_close(loss, reference_loss, **TOLERANCE)
        torch.testing.assert_close(hidden_grad, reference_hidden_grad, **TOLERANCE)
        torch.testing.assert_close(weight_grad, reference_weight_grad[start:start + rows], **TOLERANCE)
    finally:
        destroy(state)


def test_fused_equals_unfused_at_tp2():
    """Rank 1's shard holds the padding rows and some real targets: the max and the sums cross the group."""
    run_distributed(_tp2_worker, 2, timeout=120)


def test_the_flag_switches_the_models_loss_path_and_changes_no_value(monkeypatch):
    config = ModelConfig.of(num_layers=1, hidden_size=32, num_attention_heads=2, seq_length=8, max_position_embeddings=8,
                         vocab_size=50, hidden_dropout=0.0, attention_dropout=0.0)
    assert not config.output.cross_entropy_loss_fusion  # off by default: today's path
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))

    def loss_and_grads(model_config):
        model = build_gpt_model(model_config, SINGLE, seed=4)
        loss = model(tokens[:, :-1], tokens[:, 1:]).mean()
        loss.backward()
        return loss.detach(), {name: p.grad for name, p in model.named_parameters()}

    reference_loss, reference_grads = loss_and_grads(config)
    monkeypatch.setattr(gpt.output_head, "vocab_parallel_cross_entropy",
                        lambda *args: pytest.fail("the fused path built the logits"))
    fused_loss, fused_grads = loss_and_grads(replace_settings(config, cross_entropy_loss_fusion=True))
    torch.testing.assert_close(fused_loss, reference_loss, **TOLERANCE)
    for name, grad in reference_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, **TOLERANCE, msg=name)


def test_megatrons_flag_is_honoured_not_ignored():
    """Megatron-LM's --cross-entropy-loss-fusion (megatron/training/arguments.py: store_true, default off;
    arguments/megatron/flags_harvested.json) was classified "no effect" before; now it sets the lever."""
    from arguments.parser import parse_config
    assert parse_config(["--cross-entropy-loss-fusion"]).model.output.cross_entropy_loss_fusion
    assert not parse_config([]).model.output.cross_entropy_loss_fusion


def test_under_zero_stage3_training_is_the_unfused_one():
    """Stage 3 gathers the tied output weight for the forward and frees it after: the fused backward
    recomputes logits from that weight, so three steps of training must match the unfused path's."""
    from arguments.config import OptimizerConfig
    from gpt.model import GPTModel
    from tests.zero_harness import ZeroHarness
    from zero.config import ZeroConfig

    config = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=2, seq_length=8, max_position_embeddings=8,
                         vocab_size=50, hidden_dropout=0.0, attention_dropout=0.0)
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(5)).expand(3, 2, 9)  # one batch, 3 steps

    def train(model_config):
        model = GPTModel(model_config, SINGLE)
        zero = ZeroHarness(model, OptimizerConfig(lr=1e-2), ZeroConfig(stage=3), SINGLE, seed=6,
                           stage3_units=model.blocks)
        losses = []
        for batch in tokens:
            zero.zero_grad()
            loss = model(batch[:, :-1], batch[:, 1:]).mean()
            zero.backward(loss, last_micro_batch=True)
            zero.step()
            losses.append(loss.item())
        return torch.tensor(losses)

    reference = train(config)
    assert reference[-1] < reference[0]  # it trained
    torch.testing.assert_close(train(replace_settings(config, cross_entropy_loss_fusion=True)), reference,
                               **TOLERANCE)
