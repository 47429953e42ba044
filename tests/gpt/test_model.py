"""The GPT model against transformers' GPT-2, and the analytic size and FLOP counts against the model."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from arguments.config import ModelConfig
from checkpoint.hf.folders import from_hf_state_dict, hf_config, to_hf_state_dict
from gpt.model import build_gpt_model
from parallel.state import ParallelState
from training.metrics import flops_per_iteration, parameter_count

CPU = ParallelState(device=torch.device("cpu"))


def small_config(**overrides) -> ModelConfig:
    values = dict(num_layers=3, hidden_size=64, num_attention_heads=4, seq_length=32,
                  max_position_embeddings=48, vocab_size=1000, hidden_dropout=0.0, attention_dropout=0.0)
    values.update(overrides)
    return ModelConfig.of(**values)


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_logits_match_transformers_gpt2(activation):
    from transformers import GPT2LMHeadModel

    config = small_config(activation=activation)
    ours = build_gpt_model(config, CPU, seed=7).eval()
    theirs = GPT2LMHeadModel(hf_config(config)).eval()
    missing, unexpected = theirs.load_state_dict(to_hf_state_dict(ours.state_dict(), config), strict=False)
    assert not unexpected and all(name.endswith("attn.bias") or name.endswith("masked_bias") for name in missing)

    tokens = torch.randint(0, config.vocab_size, (2, config.seq_length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        our_logits = ours(tokens)
        their_logits = theirs(tokens).logits
    assert our_logits.shape == their_logits.shape == (2, config.seq_length, config.vocab_size)
    assert torch.allclose(our_logits, their_logits, atol=1e-4, rtol=0)


def test_hf_mapping_round_trip_is_lossless():
    config = small_config()
    model = build_gpt_model(config, CPU, seed=3)
    state = model.state_dict()
    back = from_hf_state_dict(to_hf_state_dict(state, config), config, config.padded_vocab_size())
    assert back.keys() == state.keys()
    for name in state:
        assert torch.equal(back[name], state[name]), name


@pytest.mark.smoke
def test_loss_is_cross_entropy_of_the_logits_and_ignores_vocab_padding():
    config = small_config(vocab_size=1000)  # padded to 1024
    model = build_gpt_model(config, CPU, seed=1).eval()
    assert model.word_embeddings.weight.shape[0] == 1024
    tokens = torch.randint(0, 1000, (2, 17))
    logits = model(tokens[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
    assert torch.allclose(model(tokens[:, :-1], tokens[:, 1:]).flatten(), expected)


def test_vocab_padding_does_not_change_initialisation():
    a = build_gpt_model(small_config(make_vocab_size_divisible_by=128), CPU, seed=5)
    b = build_gpt_model(small_config(make_vocab_size_divisible_by=8), CPU, seed=5)
    assert a.word_embeddings.weight.shape != b.word_embeddings.weight.shape
    assert torch.equal(a.word_embeddings.weight[:1000], b.word_embeddings.weight[:1000])
    assert torch.count_nonzero(a.word_embeddings.weight[1000:]) == 0
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        if name != "word_embeddings.weight":
            assert torch.equal(pa, pb), name


def test_initialisation_follows_gpt2():
    config = small_config(num_layers=8, hidden_size=256, num_attention_heads=8, vocab_size=4000)
    model = build_gpt_model(config, CPU, seed=0)
    scaled = 0.02 / math.sqrt(2 * config.num_layers)
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(param) == 0 or "layernorm" in name, name
        elif "layernorm" in name:
            assert torch.all(param == 1), name
        elif name.endswith(("attention.dense.weight", "dense_4h_to_h.weight")):
            assert param.std().item() == pytest.approx(scaled, rel=0.05), name
        elif name == "word_embeddings.weight":
            assert param[: config.vocab_size].std().item() == pytest.approx(0.02, rel=0.05)
        else:
            assert param.std().item() == pytest.approx(0.02, rel=0.05), name
    assert build_gpt_model(config, CPU, seed=0).state_dict().keys() == model.state_dict().keys()
    assert torch.equal(build_gpt_model(config, CPU, seed=0).blocks[3].mlp.dense_h_to_4h.weight,
                       model.blocks[3].mlp.dense_h_to_4h.weight)


@pytest.mark.parametrize("ffn", [None, 96])
def test_parameter_count_matches_the_model(ffn):
    config = small_config(ffn_hidden_size=ffn)
    model = build_gpt_model(config, CPU, seed=0)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())


def count_matmul_flops_of_one_forward(config: ModelConfig, batch: int) -> tuple[int, int]:
    """Counts the FLOPs of every matmul of one forward by running it under FlopCounterMode.

    Returns (transformer-block FLOPs, logit-layer FLOPs). The counter has no rule for the CPU kernel
    of scaled_dot_product_attention, so the two attention matmuls (scores and context, unmasked, as
    Megatron counts them) are run explicitly at the shapes the block uses."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_gpt_model(config, CPU, seed=0)
    hidden = torch.randn(batch, config.seq_length, config.hidden_size)
    with FlopCounterMode(display=False) as counter:
        model.blocks[0](hidden)
        heads, head_dim = config.num_attention_heads, config.head_dim
        query = torch.randn(batch, heads, config.seq_length, head_dim)
        scores = query @ query.transpose(-1, -2)
        scores @ query
    block = counter.get_total_flops()
    with FlopCounterMode(display=False) as counter:
        F.linear(hidden, model.word_embeddings.weight)
    return block, counter.get_total_flops()


@pytest.mark.parametrize("recompute", [False, True])
def test_flops_formula_matches_counted_matmuls(recompute):
    config = small_config(vocab_size=1000, seq_length=32)
    batch = 3
    block, logits = count_matmul_flops_of_one_forward(config, batch)
    # backward = 2 x forward; full recompute adds one more forward of every block.
    block_passes = 4 if recompute else 3
    expected = block_passes * config.num_layers * block + 3 * logits
    assert flops_per_iteration(config, batch, activation_recompute=recompute) == pytest.approx(expected, rel=1e-9)


def test_flops_formula_is_megatrons_closed_form():
    config = ModelConfig.of(num_layers=48, hidden_size=1600, num_attention_heads=16, seq_length=1024,
                         max_position_embeddings=1024, vocab_size=50257)
    b, s, layers, h, v = 512, 1024, 48, 1600, config.padded_vocab_size()
    no_recompute = 72 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    recompute = 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert flops_per_iteration(config, b) == pytest.approx(no_recompute, rel=1e-12)
    assert flops_per_iteration(config, b, activation_recompute=True) == pytest.approx(recompute, rel=1e-12)


def test_dropout_is_active_in_training_only():
    model = build_gpt_model(small_config(hidden_dropout=0.5, attention_dropout=0.5), CPU, seed=0)
    tokens = torch.randint(0, 1000, (2, 16))
    model.train()
    assert not torch.equal(model(tokens), model(tokens))
    model.eval()
    assert torch.equal(model(tokens), model(tokens))


def test_kv_channels_sets_each_heads_width_and_lifts_the_divisibility_rule():
    """Megatron-LM asserts hidden % heads == 0 only where it derives kv_channels from them (validate_args); the
    attention is then heads x kv_channels wide (Megatron-Core's SelfAttention: linear_qkv to
    (heads + 2 groups) x kv_channels, linear_proj from heads x kv_channels to the hidden size)."""
    from arguments.parser import parse_config
    from base.errors import ConfigError

    config = parse_config(["--hidden-size", "66", "--num-attention-heads", "4", "--kv-channels", "16"])
    assert config.model.head_dim == 16
    model = build_gpt_model(dataclasses.replace(config.model, vocab_size=64), ParallelState(device=torch.device("cpu")), seed=1)
    attention = model.blocks[0].attention
    assert tuple(attention.query_key_value.weight.shape) == (3 * 4 * 16, 66)
    assert tuple(attention.dense.weight.shape) == (66, 4 * 16)
    with pytest.raises(ConfigError, match="give each head's width with --kv-channels"):
        parse_config(["--hidden-size", "66", "--num-attention-heads", "4"])
