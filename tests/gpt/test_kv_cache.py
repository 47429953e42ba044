"""Generation with a KV cache (gpt/kv_cache.py, gpt/decode.py) against recomputing the whole sequence each step:
the same greedy tokens, and at every position the same logits within fp32 roundings (the cached step's
attention sums over the same keys through a mask, the full forward's through the causal kernel). Tiny models with
weights drawn wide (std 0.2) so that the logits are far from ties: GPT-2's learned positions, Llama's rotary and
grouped-query attention, sliding windows on every other layer, soft-capping, attention sinks, experts, and
multi-latent attention with rope or YaRN.
"""

from __future__ import annotations

import pytest
import torch

from base.errors import ConfigError
from gpt.decode import decode, new_cache
from gpt.generation import generate
from gpt.kv_cache import cached_elements_per_token
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from gpt.sampling import Sampling
from parallel.state import ParallelState

CPU = ParallelState(device=torch.device("cpu"))
LLAMA = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", num_query_groups=2,
             untie_embeddings_and_output_weights=True, add_bias_linear=False)
MLA = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", multi_latent_attention=True,
           kv_lora_rank=16, q_lora_rank=None, qk_head_dim=8, qk_pos_emb_head_dim=8, v_head_dim=8)
VARIANTS = {
    "gpt2": {},
    "llama-gqa2": LLAMA,
    "llama-window-every-other-layer": {**LLAMA, "window_size": (3, 0), "window_attn_skip_freq": 2},
    "llama-softcap": {**LLAMA, "attn_logit_softcapping": 5.0},
    "llama-learnable-sinks": {**LLAMA, "softmax_type": "learnable"},
    "llama-experts": {**LLAMA, "num_experts": 4, "moe_router_topk": 2},
    "mla-rope": {**MLA, "rope_type": "rope"},
    "mla-yarn-sinks": {**MLA, "rope_type": "yarn", "softmax_type": "off-by-one"},
    "attention-then-mla": {**MLA, "rope_type": "rope", "hybrid_layer_pattern": "*-+-"},  # both mixers in one model
}
GREEDY = Sampling(top_k=1)


def tiny(**overrides) -> ModelConfig:
    values = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                  vocab_size=64, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.2)
    return ModelConfig.of(**{**values, **overrides})


def tiny_model(**overrides):
    return build_gpt_model(tiny(**overrides), CPU, seed=11).eval()


@pytest.mark.parametrize("variant", VARIANTS)
def test_cached_steps_give_the_full_forwards_logits_and_greedy_tokens(variant):
    model = tiny_model(**VARIANTS[variant])
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens)
    cache = new_cache(model, 12)
    # the prompt at once, then a token a step, as generation feeds them
    stepped = torch.cat([decode(model, tokens[:, :5], cache)] +
                        [decode(model, tokens[:, i:i + 1], cache) for i in range(5, 12)], dim=1)
    assert cache.length == 12
    assert float((stepped - full).abs().max()) <= 1e-5 * float(full.abs().max())

    prompt = tokens[:, :4]
    cached = generate(model, prompt, 10, GREEDY)
    recomputed = generate(model, prompt, 10, GREEDY, use_cache=False)
    assert cached.shape == (2, 10)
    assert torch.equal(cached, recomputed)


def test_a_window_shorter_than_the_sequence_changes_what_a_step_sees():
    """The cached mask honours the window: without it the windowed model's later logits would be the plain one's."""
    tokens = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(4))
    plain, windowed = tiny_model(**LLAMA), tiny_model(**LLAMA, window_size=(2, 0))
    cache, windowed_cache = new_cache(plain, 10), new_cache(windowed, 10)
    assert torch.allclose(decode(plain, tokens[:, :3], cache), decode(windowed, tokens[:, :3], windowed_cache))
    later, windowed_later = decode(plain, tokens[:, 3:], cache), decode(windowed, tokens[:, 3:], windowed_cache)
    assert not torch.allclose(later, windowed_later)


def test_sampling_is_seeded_and_stops_at_the_stop_token():
    model = tiny_model(**LLAMA)
    prompt = torch.tensor([[1, 2, 3]])
    sampling = Sampling(temperature=1.5, top_p=0.9)
    first = generate(model, prompt, 12, sampling, torch.Generator().manual_seed(5))
    assert torch.equal(first, generate(model, prompt, 12, sampling, torch.Generator().manual_seed(5)))
    assert not torch.equal(first, generate(model, prompt, 12, sampling, torch.Generator().manual_seed(6)))
    stop = int(first[0, 2])
    stopped = generate(model, prompt, 12, sampling, torch.Generator().manual_seed(5), stop_id=stop)
    assert stopped[0].tolist() == first[0, :list(first[0]).index(stop) + 1].tolist()


def test_what_the_cache_cannot_serve_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="17 positions asked, and the learned position embedding has 16"):
        new_cache(tiny_model(), 17)
    with pytest.raises(ConfigError, match="18 positions asked, and the learned position embedding has 16"):
        generate(tiny_model(), torch.zeros(1, 8, dtype=torch.long), 10, GREEDY, use_cache=False)
    cache = new_cache(tiny_model(**LLAMA), 4)
    with pytest.raises(ConfigError, match="holds 4 positions, and 5 were asked"):
        decode(tiny_model(**LLAMA), torch.zeros(1, 5, dtype=torch.long), cache)


@pytest.mark.parametrize("variant", ["llama-gqa2", "mla-rope", "attention-then-mla"])
def test_the_cache_size_generation_checks_is_what_the_cache_holds(variant):
    """training/generate.py bounds a batch's memory by cached_elements_per_token: each layer by its own mixer (the
    mixed model's `*` layer a head per group, its `+` layer every head's whole key and value), as the cache holds."""
    config = tiny(**VARIANTS[variant])
    model = build_gpt_model(config, CPU, seed=11).eval()
    cache = new_cache(model, 12)
    with torch.no_grad():
        decode(model, torch.zeros(3, 12, dtype=torch.long), cache)
    held = sum(t.numel() for buffers in (cache._keys, cache._values) for t in buffers.values())
    assert held == 3 * 12 * cached_elements_per_token(config) > 0
