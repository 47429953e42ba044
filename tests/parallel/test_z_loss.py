"""llm-jp's z-loss in the vocab-parallel cross entropy (--z-loss-strength, --use-z-loss).

The spec is llm-jp's Megatron-LM fork: branch v4, megatron/core/tensor_parallel/cross_entropy.py,
_VocabParallelCrossEntropy.forward (`log_Z = torch.log(sum_exp_logits) + logits_max`,
`z_loss = z_loss_strength * log_Z * log_Z`, `loss = loss + z_loss`, and for the backward
`exp_logits *= (1.0 + 2 * z_loss_strength * log_Z.unsqueeze(dim=-1))`); branch nii-geniac does the same
with a fixed 1e-4 under --use-z-loss. The reference here is autograd on the textbook formula."""

import pytest
import torch
import torch.nn.functional as F

from parallel.cross_entropy import vocab_parallel_cross_entropy
from parallel.state import ParallelState

STATE = ParallelState(device=torch.device("cpu"))


def reference(logits: torch.Tensor, target: torch.Tensor, strength: float) -> torch.Tensor:
    log_z = torch.logsumexp(logits, dim=-1)
    ce = F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="none").view(target.shape)
    return ce + strength * log_z * log_z


@pytest.mark.parametrize("strength", [1e-4, 0.05])
def test_z_loss_values_and_gradients_match_the_formula(strength):
    torch.manual_seed(0)
    logits = (torch.randn(2, 5, 11, dtype=torch.float64) * 4 + 3).requires_grad_()
    target = torch.randint(0, 11, (2, 5))
    ours = vocab_parallel_cross_entropy(logits, target, 0, 11, STATE, z_loss_strength=strength)
    weights = torch.rand(2, 5, dtype=torch.float64)
    (ours * weights).sum().backward()
    ours_grad = logits.grad.clone()
    logits.grad = None
    expected = reference(logits, target, strength)
    (expected * weights).sum().backward()
    torch.testing.assert_close(ours, expected)
    torch.testing.assert_close(ours_grad, logits.grad)
    plain = vocab_parallel_cross_entropy(logits.detach(), target, 0, 11, STATE)
    assert (ours.detach() - plain > 0).all()  # the logits' log(Z) is far from 0: the term is there


def test_padding_columns_stay_out_of_log_z():
    """Padded vocabulary columns (vocab_size 7 of 11) take no part in log(Z), as in the softmax."""
    torch.manual_seed(1)
    logits = torch.randn(1, 4, 11, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, 7, (1, 4))
    ours = vocab_parallel_cross_entropy(logits, target, 0, 7, STATE, z_loss_strength=0.01)
    torch.testing.assert_close(ours, reference(logits[..., :7], target, 0.01))


def test_the_model_adds_the_z_loss_from_its_config():
    """gpt/model.py passes --z-loss-strength to the loss (--use-z-loss: llm-jp nii-geniac's fixed 1e-4)."""
    from arguments.config import OptimizerConfig
    from arguments.parser import parse_arguments
    from base.options import replace_settings
    from gpt.model import GPTModel
    from gpt.model_config import ModelConfig
    from tests.zero_harness import ZeroHarness
    from zero.config import ZeroConfig

    assert parse_arguments(["--use-z-loss"]).config.model.output.z_loss_strength == 1e-4
    config = ModelConfig.of(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=8, max_position_embeddings=8,
                         vocab_size=40, hidden_dropout=0.0, attention_dropout=0.0)
    tokens = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(5))
    model = GPTModel(config, STATE)
    ZeroHarness(model, OptimizerConfig(lr=1e-2), ZeroConfig(stage=0), STATE, seed=6)
    with torch.no_grad():
        plain = model(tokens[:, :-1], tokens[:, 1:]).double()
        log_z = torch.logsumexp(model(tokens[:, :-1]).double(), dim=-1)
        model.config = replace_settings(config, z_loss_strength=1e-4)
        with_z = model(tokens[:, :-1], tokens[:, 1:]).double()
    torch.testing.assert_close(with_z - plain, 1e-4 * log_z * log_z, rtol=1e-3, atol=1e-8)


def _tp_worker(rank, world_size):
    """Each TP rank holds half of a padded vocabulary; log(Z) must be the whole vocabulary's (the all-reduced max
    and sum of exp), so the loss and each rank's slice of the gradient equal the unsplit formula's."""
    from parallel.state import destroy, initialize

    state = initialize("cpu", tensor_parallel_size=2)
    try:
        torch.manual_seed(3)
        vocab, padded, strength = 13, 16, 0.02
        logits = torch.randn(2, 4, padded, dtype=torch.float64) * 3 + 2
        target = torch.randint(0, vocab, (2, 4))
        reference_logits = logits[..., :vocab].clone().requires_grad_()
        expected = reference(reference_logits, target, strength)
        weights = torch.rand(2, 4, dtype=torch.float64)
        (expected * weights).sum().backward()
        half = padded // 2
        shard = logits[..., rank * half:(rank + 1) * half].clone().requires_grad_()
        ours = vocab_parallel_cross_entropy(shard, target, rank * half, vocab, state, z_loss_strength=strength)
        (ours * weights).sum().backward()
        torch.testing.assert_close(ours, expected.detach())
        full_grad = torch.cat([reference_logits.grad, torch.zeros(2, 4, padded - vocab, dtype=torch.float64)], -1)
        torch.testing.assert_close(shard.grad, full_grad[..., rank * half:(rank + 1) * half])
    finally:
        destroy(state)


@pytest.mark.slow
def test_z_loss_across_two_tensor_parallel_ranks():
    from tests.distributed import run_distributed

    run_distributed(_tp_worker, 2, timeout=120)
