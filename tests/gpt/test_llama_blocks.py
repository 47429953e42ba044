"""Llama-shaped blocks (issue 37): our fp32 logits equal transformers' LlamaForCausalLM built from the
same weights, for MHA, GQA (2 groups) and MQA, rotary base 1e4 and 5e5, tied and untied output, with
and without biases, at TP 1 and TP 2 (one 2-rank gloo launch for every TP 2 variant). The TP 2 ranks
build their slices from the seed alone and the reference is the TP 1 model, so the same launch checks
that initial values do not depend on the TP size. The math against its sources (NVIDIA/Megatron-LM at d98e8a64):
- RMSNorm, rotate-half rotary with fp32 inverse frequencies, repeat_kv, SwiGLU as down(silu(gate(x)) * up(x)):
  transformers' modeling_llama.py, executed here as the reference.
- Megatron-Core agrees: rotary_pos_embedding.py RotaryEmbedding (`inv_freq = 1.0 / (rotary_base ** (torch.arange(0,
  dim, 2, dtype=torch.float32) / dim))`, `dim = int(dim * rotary_percent)`, `torch.cat((freqs, freqs))`) and
  rope_utils.py (_rotate_half `torch.cat((-x2, x1))`; _apply_rotary_pos_emb_bshd rotates the first rot_dim dims).
- The fused QKV layout [group][its query heads, k, v][head_dim]: attention.py SelfAttention.
  get_query_key_value_tensors (`[sq, b, ng, (np/ng + 2) * hn]`), q_layernorm / k_layernorm on the split heads before
  rotary (--qk-layernorm; transformers' Qwen3Attention applies q_norm / k_norm at the same place).
- SwiGLU's default ffn (arguments.py validate_args): `int((4 * args.hidden_size * 2 / 3) / 64) * 64`, rounded down."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from base.errors import ConfigError
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from gpt.positions import PositionSettings
from gpt.rotary import apply_rotary, inverse_frequencies, rotary_angles
from parallel.sharding import record_of
from parallel.state import ParallelState, destroy, initialize
from tests.distributed import run_distributed

SINGLE = ParallelState(device=torch.device("cpu"))
TOLERANCE = 1e-5
LLAMA = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
             untie_embeddings_and_output_weights=True, add_bias_linear=False)
# name -> (the model's settings, TP sizes it runs at). MQA's single group cannot split over 2 ranks (refused).
VARIANTS = {
    "mha-base1e4-tied-bias": ({**LLAMA, "untie_embeddings_and_output_weights": False, "add_bias_linear": True},
                              (1, 2)),
    "gqa2-base5e5-untied-nobias": ({**LLAMA, "num_query_groups": 2, "rotary_base": 5e5}, (1, 2)),
    "gqa2-base1e4-tied-nobias": ({**LLAMA, "num_query_groups": 2, "untie_embeddings_and_output_weights": False},
                                 (1, 2)),
    "mha-base5e5-untied-bias": ({**LLAMA, "rotary_base": 5e5, "add_bias_linear": True}, (1, 2)),
    "mqa-base1e4-untied-bias": ({**LLAMA, "num_query_groups": 1, "add_bias_linear": True}, (1,)),
    "mqa-base5e5-tied-nobias": ({**LLAMA, "num_query_groups": 1, "rotary_base": 5e5,
                                 "untie_embeddings_and_output_weights": False}, (1,)),
    # Llama 3's rope scaling (factor 8; low 1, high 4, original context 8192 as Megatron fixes them)
    # --qk-layernorm: transformers' Qwen3 (Llama with RMSNorm over each query and key head, no MLP biases)
    "gqa2-qk-layernorm-untied-nobias": ({**LLAMA, "num_query_groups": 2, "qk_layernorm": True}, (1, 2)),
    "gqa2-base5e5-llama3-scaling": ({**LLAMA, "num_query_groups": 2, "rotary_base": 5e5, "use_rope_scaling": True},
                                    (1,)),
}


def tiny_config(**overrides) -> ModelConfig:
    values = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                  vocab_size=300, hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-6)
    values.update(overrides)
    return ModelConfig.of(**values)


def llama_state_dict(ours: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Our TP 1 state dict as LlamaForCausalLM's: the fused QKV rows [group][its queries, k, v][head_dim]
    split into q_proj, k_proj, v_proj; the padded vocabulary cut back."""
    heads, groups, d = (config.num_attention_heads, config.attention.query_groups(config.num_attention_heads),
                        config.head_dim)
    per_group, vocab = heads // groups, config.vocab_size
    theirs = {"model.embed_tokens.weight": ours["word_embeddings.weight"][:vocab],
              "model.norm.weight": ours["final_layernorm.weight"]}
    if config.output.untie_embeddings_and_output_weights:
        theirs["lm_head.weight"] = ours["output_layer.weight"][:vocab]
    for i in range(config.num_layers):
        block, layer = f"blocks.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias"):
            qkv = ours.get(block + "attention.query_key_value." + kind)
            if qkv is None:
                continue
            qkv = qkv.reshape(groups, per_group + 2, d, *qkv.shape[1:])
            theirs[layer + "self_attn.q_proj." + kind] = qkv[:, :per_group].reshape(heads * d, *qkv.shape[3:])
            theirs[layer + "self_attn.k_proj." + kind] = qkv[:, per_group].reshape(groups * d, *qkv.shape[3:])
            theirs[layer + "self_attn.v_proj." + kind] = qkv[:, per_group + 1].reshape(groups * d, *qkv.shape[3:])
        for our_name, their_name in (("attention.dense", "self_attn.o_proj"),
                                     ("mlp.dense_h_to_4h_gate", "mlp.gate_proj"),
                                     ("mlp.dense_h_to_4h_up", "mlp.up_proj"), ("mlp.dense_4h_to_h", "mlp.down_proj"),
                                     ("input_layernorm", "input_layernorm"),
                                     ("post_attention_layernorm", "post_attention_layernorm")):
            for kind in ("weight", "bias"):
                if block + our_name + "." + kind in ours:
                    theirs[layer + their_name + "." + kind] = ours[block + our_name + "." + kind]
        if config.attention.qk_layernorm:
            theirs[layer + "self_attn.q_norm.weight"] = ours[block + "attention.q_layernorm.weight"]
            theirs[layer + "self_attn.k_norm.weight"] = ours[block + "attention.k_layernorm.weight"]
    return theirs


def transformers_llama(ours: torch.nn.Module, config: ModelConfig):
    """LlamaForCausalLM, or with --qk-layernorm Qwen3ForCausalLM, holding our TP 1 model's weights."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    shared = dict(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.ffn_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.attention.query_groups(config.num_attention_heads),
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.norms.layernorm_epsilon,
        rope_parameters=rope_parameters(config),
        tie_word_embeddings=not config.output.untie_embeddings_and_output_weights,
        attention_bias=config.add_bias_linear, attention_dropout=0.0)
    if config.attention.qk_layernorm:
        assert config.norms.normalization == "RMSNorm" and not config.add_bias_linear  # Qwen3's shape
        their_config, model_class = Qwen3Config(head_dim=config.head_dim, **shared), Qwen3ForCausalLM
    else:
        their_config = LlamaConfig(mlp_bias=config.add_bias_linear, **shared)
        model_class = LlamaForCausalLM
    their_config._attn_implementation = "eager"
    theirs = model_class(their_config).eval()
    missing, unexpected = theirs.load_state_dict(llama_state_dict(ours.state_dict(), config),
                                                 strict=False)
    assert not unexpected, unexpected
    # a tied lm_head is the embedding, which transformers ties after loading
    expected_missing = set() if config.output.untie_embeddings_and_output_weights else {"lm_head.weight"}
    assert set(missing) == expected_missing, missing
    return theirs


def rope_parameters(config: ModelConfig) -> dict:
    positions = config.positions
    if not positions.use_rope_scaling:
        return {"rope_type": "default", "rope_theta": positions.rotary_base}
    return {"rope_type": "llama3", "rope_theta": positions.rotary_base, "factor": positions.rope_scaling_factor,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def tokens_for(config: ModelConfig) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (2, config.seq_length + 1), generator=torch.Generator().manual_seed(0))


def compare_with_transformers(name: str, state: ParallelState) -> float:
    """Max abs difference of this rank's logits from transformers' on the TP 1 model's weights; also
    checks the loss against the cross entropy of their logits."""
    settings, _ = VARIANTS[name]
    config = tiny_config(**settings)
    reference = build_gpt_model(config, SINGLE, seed=11).eval()
    theirs = transformers_llama(reference, config)
    ours = build_gpt_model(config, state, seed=11).eval()
    tokens = tokens_for(config)
    with torch.no_grad():
        their_logits = theirs(tokens[:, :-1]).logits
        our_logits = ours(tokens[:, :-1])
        our_loss = ours(tokens[:, :-1], tokens[:, 1:])
    expected_loss = F.cross_entropy(their_logits.transpose(1, 2), tokens[:, 1:], reduction="none")
    torch.testing.assert_close(our_loss, expected_loss, rtol=0, atol=TOLERANCE)
    if state.tensor_parallel_size > 1:
        check_gradients_are_tp1_slices(ours, reference, tokens, state)
    return (our_logits - their_logits).abs().max().item()


def check_gradients_are_tp1_slices(ours, reference, tokens, state: ParallelState) -> None:
    """Each rank's gradients are its slices of the TP 1 model's; a replicated parameter's (norm gains,
    --qk-layernorm's per-head gains that each rank applies to its own heads only) are the whole."""
    for model in (ours, reference):
        model(tokens[:, :-1], tokens[:, 1:]).sum().backward()
    whole = dict(reference.named_parameters())
    for name, param in ours.named_parameters():
        if name in ("word_embeddings.weight", "output_layer.weight"):  # padded differently per TP size
            continue
        expected = whole[name].grad
        dim = record_of(param).split_dim
        if dim is not None:
            expected = expected.chunk(state.tensor_parallel_size, dim=dim)[state.tensor_parallel_rank]
        # A gradient summed over the tokens (a bias's, a norm gain's) cancels: its fp32 rounding, from TP's other
        # reduction order, is relative to the largest element, not to each (seen: 2.4e-6 on an element of 0.08)
        atol = max(1e-6, 1e-5 * expected.abs().max().item())
        torch.testing.assert_close(param.grad, expected, rtol=1e-5, atol=atol, msg=lambda m: f"{name}: {m}")


def tp2_difference_from_tp1(rank, world_size, config_overrides: dict) -> float:
    """On each of 2 TP ranks: the largest loss difference between the TP 2 model and the TP 1 model of the same seed,
    after checking its gradients are its slices of the TP 1 model's (run_distributed(fn, 2, overrides))."""
    state = initialize("cpu", tensor_parallel_size=2)
    try:
        config = tiny_config(**config_overrides)
        reference = build_gpt_model(config, SINGLE, seed=11)
        ours = build_gpt_model(config, state, seed=11)
        tokens = tokens_for(config)
        with torch.no_grad():
            difference = (ours(tokens[:, :-1], tokens[:, 1:]) - reference(tokens[:, :-1], tokens[:, 1:])).abs().max()
        check_gradients_are_tp1_slices(ours, reference, tokens, state)
        return difference.item()
    finally:
        destroy(state)


@pytest.mark.parametrize("name", [name for name, (_, sizes) in VARIANTS.items() if 1 in sizes])
def test_logits_equal_transformers_llama_at_tp1(name):
    assert compare_with_transformers(name, SINGLE) <= TOLERANCE


def _tp2_variants(rank, world_size, names):
    state = initialize("cpu", tensor_parallel_size=2)
    try:
        return {name: compare_with_transformers(name, state) for name in names}
    finally:
        destroy(state)


def test_logits_equal_transformers_llama_at_tp2():
    names = [name for name, (_, sizes) in VARIANTS.items() if 2 in sizes]
    for per_rank in run_distributed(_tp2_variants, 2, names, timeout=300):
        assert per_rank.keys() == set(names)
        assert all(difference <= TOLERANCE for difference in per_rank.values()), per_rank


def test_key_value_groups_must_split_over_tensor_parallel_ranks_or_be_shared_by_them():
    """Fewer groups than TP ranks are read by tp / groups ranks each (Megatron-Core, gpt/qkv_projection.py QKVLayout;
    tests/gpt/test_kv_groups_below_tp.py trains them); a norm over the whole key projection is not."""
    tiny_config(**LLAMA, num_query_groups=1).validate_tensor_parallel(2)
    over_projection = tiny_config(**LLAMA, num_query_groups=1, qk_layernorm=True, qk_layernorm_over_projection=True)
    with pytest.raises(ConfigError, match="--qk-layernorm-over-projection with --num-query-groups 1 below"):
        over_projection.validate_tensor_parallel(2)
    for groups in (3, 0):
        with pytest.raises(ConfigError, match=f"--num-query-groups {groups} does not divide --num-attention-heads 4"):
            build_gpt_model(tiny_config(**LLAMA, num_query_groups=groups), SINGLE, seed=0)


def test_swiglu_default_ffn_is_megatrons():
    # int((4h * 2/3) / 64) * 64 (module docstring): Llama-2-7B's h=4096 gives 10880 (its launch scripts
    # pass --ffn-hidden-size 11008 explicitly), the tiny h=64 gives 128.
    llama = tiny_config(**LLAMA).mlp
    assert llama.ffn_size(4096, None) == 10880
    assert llama.ffn_size(64, None) == 128
    assert llama.ffn_size(4096, 11008) == 11008
    assert tiny_config().mlp.ffn_size(64, None) == 256
    model = build_gpt_model(tiny_config(**LLAMA), SINGLE, seed=0)
    assert model.blocks[0].mlp.dense_h_to_4h_gate.weight.shape == (128, 64)


def test_llama3_rope_scaling_equals_transformers():
    """At 16 positions the scaled (long) wavelengths barely move the logits, so the frequencies themselves
    are compared with transformers' llama3 rope parameters."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = tiny_config(**LLAMA, rotary_base=5e5, use_rope_scaling=True)
    their_config = LlamaConfig(hidden_size=2048, num_attention_heads=16, max_position_embeddings=131072,
                               rope_parameters=rope_parameters(config))
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](their_config, torch.device("cpu"))
    ours = inverse_frequencies(128, 5e5, torch.device("cpu"), config.positions.rope_scaling)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)
    unscaled = inverse_frequencies(128, 5e5, torch.device("cpu"))
    assert not torch.allclose(ours, unscaled) and torch.equal(ours[:8], unscaled[:8])  # only long wavelengths move


def test_rotary_percent_rotates_only_the_leading_dims():
    # Megatron's _apply_rotary_pos_emb_bshd: the first int(head_dim * rotary_percent) dims rotate, the rest
    # pass through unchanged; position 0 is the identity (angle 0).
    x = torch.randn(1, 2, 5, 16, generator=torch.Generator().manual_seed(1))
    cos, sin = rotary_angles(5, PositionSettings(rotary_percent=0.5).rotary_dim(16), 10000.0, x.device)
    rotated = apply_rotary(x, cos, sin)
    assert cos.shape == (5, 8)
    assert torch.equal(rotated[..., 8:], x[..., 8:])
    assert torch.equal(rotated[:, :, 0], x[:, :, 0])
    assert not torch.allclose(rotated[:, :, 1:, :8], x[:, :, 1:, :8])
    # a rotation keeps each pair's norm: (x_i, x_{i+4}) for the 8 rotating dims
    pairs = lambda t: t[..., :4] ** 2 + t[..., 4:8] ** 2  # noqa: E731
    torch.testing.assert_close(pairs(rotated), pairs(x))


def test_gpt2_default_has_gpt2s_parameters():
    """The default architecture builds exactly GPT-2's parameter names and shapes (bitwise values are
    checked against transformers' GPT-2 in test_model.py)."""
    config = tiny_config()
    model = build_gpt_model(config, SINGLE, seed=0)
    names = {name for name, _ in model.named_parameters()}
    assert "position_embeddings.weight" in names and "blocks.0.mlp.dense_h_to_4h.bias" in names
    assert "blocks.0.input_layernorm.bias" in names and not any("output_layer" in name for name in names)
    assert model.blocks[0].attention.query_key_value.weight.shape == (3 * 64, 64)
    llama = build_gpt_model(tiny_config(**LLAMA), SINGLE, seed=0)
    llama_names = {name for name, _ in llama.named_parameters()}
    assert not any(name.endswith("bias") for name in llama_names)
    assert "position_embeddings.weight" not in llama_names and "output_layer.weight" in llama_names
