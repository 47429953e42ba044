"""Grouped-query attention through SDPA's enable_gqa (torch 2.5+) instead of copies of each group's key
and value per query head: at fp32 on a CPU the logits and every gradient are bit-identical to the copies'
(SDPA's math kernel reads query head i against key/value head i // (heads / groups), the map
repeat_interleave builds, transformers' repeat_kv and Megatron-Core's GQA use), dropout included; and the
copies stay where a kernel may not take enable_gqa (--attention-backend fused) and for multi-head attention."""


import pytest
import torch

from base.options import replace_settings
from gpt.attention_kernel import sdpa_takes_grouped_kv
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState

CPU = ParallelState(device=torch.device("cpu"))
LLAMA = ModelConfig.of(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                    vocab_size=300, normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
                    untie_embeddings_and_output_weights=True, add_bias_linear=False)


def logits_and_gradients(config: ModelConfig, native: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = build_gpt_model(config, CPU, seed=3)
    model.rng = None
    for block in model.blocks:
        block.attention.rng = TensorParallelRNG(5, CPU) if config.attention.attention_dropout else None
        assert block.attention.kernel.native_gqa  # what the default chooses for grouped heads
        block.attention.kernel.native_gqa = native
    tokens = torch.randint(0, config.vocab_size, (2, config.seq_length + 1), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(7)  # SDPA's dropout draws from the default generator
    logits = model(tokens[:, :-1])
    logits.square().mean().backward()
    return logits.detach(), {name: param.grad for name, param in model.named_parameters()}


@pytest.mark.parametrize("groups, dropout", [(2, 0.0), (1, 0.0), (2, 0.1)])
def test_native_grouped_attention_is_bit_identical_to_the_copies(groups, dropout):
    config = replace_settings(LLAMA, num_query_groups=groups, attention_dropout=dropout, hidden_dropout=0.0)
    native_logits, native_grads = logits_and_gradients(config, native=True)
    copied_logits, copied_grads = logits_and_gradients(config, native=False)
    assert torch.equal(native_logits, copied_logits)
    for name, grad in native_grads.items():
        assert torch.equal(grad, copied_grads[name]), name


def test_copies_stay_for_multi_head_attention_and_the_fused_backend():
    assert not build_gpt_model(LLAMA, CPU, seed=0).blocks[0].attention.kernel.native_gqa  # one group per head
    fused = replace_settings(LLAMA, num_query_groups=2, attention_backend="fused")
    assert not build_gpt_model(fused, CPU, seed=0).blocks[0].attention.kernel.native_gqa
    assert not sdpa_takes_grouped_kv("fused")
