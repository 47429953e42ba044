"""Hugging Face export of a --xielu model as transformers' ApertusForCausalLM (swiss-ai's Apertus; transformers
5.24 models/apertus/modeling_apertus.py): ApertusDecoderLayer's attention_layernorm / feedforward_layernorm,
ApertusAttention's q_norm / k_norm (RMSNorm over each head, before the rotary), ApertusMLP's
down_proj(act_fn(up_proj(x))) with act_fn = XIELUActivation (alpha_p, alpha_n parameters; beta, eps buffers) -
the same function as swiss-ai/Megatron-LM's megatron/training/activations.py XIELU. swiss-ai's own converter
(tools/checkpoint/saver_swissai_hf.py) writes `model.layers.{i}.mlp.act_fn.alpha_p` from the Megatron checkpoint's
`mlp.activation_func.alpha_p`, as here.

A checkpoint trained 3 steps -> scripts/convert_to_hf.py -> ApertusForCausalLM.from_pretrained: its logits equal
ours (1e-5, fp32). --init-from-hf reading an Apertus folder is not implemented: refused in one line.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from arguments.config import PretrainConfig
from base.errors import ConfigError
from checkpoint.hf import check_convertible, load_hf_weights
from checkpoint.sharded import save_checkpoint
from scripts import convert_to_hf
from tests.checkpoint.test_hf_llama import CPU, TOLERANCE, VOCAB, build, our_logits, step

APERTUS = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
               hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-6, normalization="RMSNorm",
               position_embedding_type="rope", ffn_hidden_size=96, activation="xielu", qk_layernorm=True,
               add_bias_linear=False, num_query_groups=2, untie_embeddings_and_output_weights=True,
               rotary_base=5e5, use_rope_scaling=True, rope_scaling_factor=8.0)


def apertus_run_config(**overrides) -> PretrainConfig:
    config = PretrainConfig()
    model = dataclasses.replace(config.model, **{**APERTUS, "vocab_size": VOCAB, **overrides})
    return dataclasses.replace(config, model=model, zero=dataclasses.replace(config.zero, stage=1),
                               optimizer=dataclasses.replace(config.optimizer, lr=1e-2))


def test_a_trained_xielu_checkpoint_exports_as_apertus_with_equal_logits(tmp_path):
    from transformers import ApertusForCausalLM

    config = apertus_run_config()
    tokens = torch.randint(0, VOCAB, (4, APERTUS["seq_length"] + 1), generator=torch.Generator().manual_seed(1))
    model, optimizer = build(config)
    losses = [step(model, optimizer, tokens) for _ in range(3)]
    assert losses[-1] < losses[0]
    alpha_p = model.blocks[0].mlp.activation_func.alpha_p.detach().clone()
    assert alpha_p.item() != 0.2109375  # trained away from the fork's initial value
    save_checkpoint(tmp_path / "ckpt", 3, 12, model, optimizer, None, config, CPU)
    assert convert_to_hf.main([str(tmp_path / "ckpt"), str(tmp_path / "apertus")]) == 0
    written = json.loads((tmp_path / "apertus" / "config.json").read_text())
    assert written["architectures"] == ["ApertusForCausalLM"] and written["model_type"] == "apertus"
    assert written["hidden_act"] == "xielu" and written["num_key_value_heads"] == 2
    theirs = ApertusForCausalLM.from_pretrained(str(tmp_path / "apertus"), attn_implementation="eager",
                                                dtype=torch.float32).eval()
    torch.testing.assert_close(theirs.model.layers[0].mlp.act_fn.alpha_p.detach(), alpha_p, rtol=0, atol=0)
    with torch.no_grad():
        their_logits = theirs(tokens[:, :-1]).logits
    assert (our_logits(model, tokens[:, :-1]) - their_logits).abs().max() <= TOLERANCE


@pytest.mark.parametrize("change, named", [
    (dict(qk_layernorm=False), "--qk-layernorm (Apertus normalizes each query and key head)"),
    (dict(add_bias_linear=True), "--disable-bias-linear (Apertus's linears have no biases)"),
    (dict(normalization="LayerNorm"), "--normalization RMSNorm"),
    (dict(kv_channels=24), "no --kv-channels other than hidden / heads")])
def test_a_xielu_model_apertus_cannot_hold_is_refused_in_one_line(change, named):
    with pytest.raises(ConfigError) as error:
        check_convertible(apertus_run_config(**change).model, "the Hugging Face export")
    assert named in str(error.value) and "ApertusForCausalLM" in str(error.value) and "\n" not in str(error.value)


def test_reading_an_apertus_folder_is_refused_in_one_line(tmp_path):
    from transformers import ApertusConfig, ApertusForCausalLM

    ApertusForCausalLM(ApertusConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
                       ).save_pretrained(str(tmp_path / "folder"))
    with pytest.raises(ConfigError, match="model_type \"apertus\" is not read here") as error:
        load_hf_weights(tmp_path / "folder", apertus_run_config().model, CPU)
    assert "\n" not in str(error.value)
