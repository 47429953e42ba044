"""Sliding-window attention (--window-size, --window-attn-skip-freq; gpt/attention_window.py).

Which layers, and which keys, against their sources, copied here as the references:
- megatron/core/transformer/utils.py (github:NVIDIA/Megatron-LM at d98e8a64) is_layer_window_attention picks the
  layers (1-based layer_number; an int N windows every layer but each N-th, a list gives one 1/0 per layer) and
  get_sliding_window_causal_mask the keys of a (left, right) window (device="cuda" there, the CPU here);
- transformers' masking_utils.sliding_window_overlay (`kv_idx > q_idx - sliding_window`) on top of its causal mask:
  its W keys, the query included, are our --window-size W-1,0.
Then the model: our logits equal transformers' MistralForCausalLM (every layer windowed) and Qwen2ForCausalLM (a
full layer, then a windowed one: layer_types) on the same weights, with a window shorter than the sequence."""

from __future__ import annotations

import pytest
import torch

from arguments.parser import parse_arguments
from base.errors import ConfigError
from base.options import replace_settings
from gpt.attention_window import causal_window_mask, layer_windows
from gpt.model import build_gpt_model
from parallel.state import ParallelState
from tests.gpt.test_llama_blocks import LLAMA, llama_state_dict, tiny_config

SINGLE = ParallelState(device=torch.device("cpu"))


def megatron_is_layer_window_attention(window_size, window_attn_skip_freq, layer_number):
    """megatron/core/transformer/utils.py is_layer_window_attention, as written there."""
    if not window_size:
        return False
    if window_attn_skip_freq is None:
        return True
    if isinstance(window_attn_skip_freq, int):
        return layer_number % window_attn_skip_freq != 0
    if isinstance(window_attn_skip_freq, list):
        return bool(window_attn_skip_freq[layer_number - 1])
    raise ValueError(window_attn_skip_freq)


def megatron_sliding_window_causal_mask(sq, skv, window_size):
    """megatron/core/transformer/utils.py get_sliding_window_causal_mask (True where masked), on the CPU."""
    m = torch.ones(sq, skv, dtype=torch.bool)
    mu = torch.triu(m, diagonal=skv - sq - window_size[0])
    ml = torch.tril(mu, diagonal=skv - sq + window_size[1])
    return ~ml


@pytest.mark.parametrize("freq, as_megatron", [(None, None), (2, 2), (3, 3), ("([1]*2+[0])*2", [1, 1, 0] * 2),
                                               ("[0,1,1,1,1,1]", [0, 1, 1, 1, 1, 1])])
def test_the_windowed_layers_are_megatrons(freq, as_megatron):
    ours = layer_windows((4, 0), freq, 6)
    assert [window is not None for window in ours] == \
        [megatron_is_layer_window_attention((4, 0), as_megatron, n) for n in range(1, 7)]
    assert set(ours) - {None} == {4}
    assert layer_windows(None, freq, 6) == (None,) * 6
    assert layer_windows((-1, -1), None, 6) == (None,) * 6  # -1: no limit, the whole causal context


def test_gpt_oss_windows_as_megatron_lm_launches_them():
    """Megatron-LM's tests/functional_tests/test_cases/moe/gpt_dynamic_inference_tp2_pp2_ep2_gptoss_20b_swa/
    model_config.yaml (d98e8a64) runs GPT-OSS-20B (transformers' sliding_window 128, layer_types alternating from a
    sliding layer) with `--window-size: 127,0` and `--window-attn-skip-freq: 2`: 127 keys before the query, as here."""
    model = parse_arguments(["--window-size", "127,0", "--window-attn-skip-freq", "2", "--num-layers", "4"]).config.model
    assert model.attention.window_size == (127, 0) and model.attention_windows() == (127, None, 127, None)


def test_the_windows_keys_are_megatrons_and_transformers():
    seq, window = 12, 4
    ours = causal_window_mask(seq, window, torch.device("cpu"))
    assert torch.equal(ours, ~megatron_sliding_window_causal_mask(seq, seq, (window, 0)))
    q, k = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    transformers_w = window + 1  # masking_utils: causal_mask_function and sliding_window_overlay(W)
    assert torch.equal(ours, (k <= q) & (k > q - transformers_w))
    assert ours.sum(dim=1).max().item() == window + 1


def test_bad_windows_are_refused_in_one_line():
    with pytest.raises(ConfigError, match="--window-attn-skip-freq '\\[1,0\\]' gives 2 values") as error:
        parse_arguments(["--window-size", "3,0", "--window-attn-skip-freq", "[1,0]", "--num-layers", "4"])
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="--window-size -2,0"):
        parse_arguments(["--window-size=-2,0"])
    with pytest.raises(ConfigError, match="--cp-comm-type p2p"):
        parse_arguments(["--window-size", "3,0", "--context-parallel-size", "2", "--seq-length", "16",
                         "--max-position-embeddings", "16"])
    with pytest.raises(ConfigError, match="--window-size: invalid window '3': give LEFT,RIGHT"):
        parse_arguments(["--window-size", "3"])
    notes = parse_arguments(["--window-size", "3,5"]).notes
    assert any(note.startswith("> --window-size 3,5:") for note in notes), notes


def _transformers(model_class, config_class, ours, config, **extra):
    theirs_config = config_class(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.ffn_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.attention.query_groups(config.num_attention_heads),
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.norms.layernorm_epsilon,
        rope_parameters={"rope_type": "default", "rope_theta": config.positions.rotary_base},
        tie_word_embeddings=False, attention_dropout=0.0, **extra)
    theirs_config._attn_implementation = "eager"
    theirs = model_class(theirs_config).eval()
    missing, unexpected = theirs.load_state_dict(llama_state_dict(ours.state_dict(), config),
                                                 strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return theirs


@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_logits_equal_transformers_with_a_window_shorter_than_the_sequence(family):
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    sliding_window = 5  # transformers' W: the query and the 4 keys before it
    if family == "mistral":
        settings = dict(LLAMA, num_query_groups=2, window_size=(sliding_window - 1, 0))
        classes, extra = (MistralForCausalLM, MistralConfig), {"sliding_window": sliding_window}
    else:  # a full layer, then a windowed one; Qwen2's bias on q, k and v alone
        settings = dict(LLAMA, num_query_groups=2, add_qkv_bias=True, window_size=(sliding_window - 1, 0),
                        window_attn_skip_freq="[0,1]")
        classes, extra = (Qwen2ForCausalLM, Qwen2Config), {
            "use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": 1,
            "layer_types": ["full_attention", "sliding_attention"]}
    config = tiny_config(seq_length=16, max_position_embeddings=16, **settings)
    ours = build_gpt_model(config, SINGLE, seed=5).eval()
    theirs = _transformers(*classes, ours, config, **extra)
    tokens = torch.randint(0, config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        our_logits, their_logits = ours(tokens), theirs(tokens).logits
        unwindowed = build_gpt_model(replace_settings(config, window_size=None), SINGLE, seed=5).eval()(tokens)
    torch.testing.assert_close(our_logits, their_logits, rtol=0, atol=1e-5)
    # the window changes the later positions' logits (it is shorter than the sequence), not the first W
    assert not torch.allclose(our_logits[:, sliding_window:], unwindowed[:, sliding_window:], atol=1e-3)
    torch.testing.assert_close(our_logits[:, :sliding_window], unwindowed[:, :sliding_window], rtol=0, atol=1e-6)
