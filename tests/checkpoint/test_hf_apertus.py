"""Hugging Face export of a --xielu model as transformers' ApertusForCausalLM (swiss-ai's Apertus; transformers
5.24 models/apertus/modeling_apertus.py): ApertusDecoderLayer's attention_layernorm / feedforward_layernorm,
ApertusAttention's q_norm / k_norm (RMSNorm over each head, before the rotary), ApertusMLP's
down_proj(act_fn(up_proj(x))) with act_fn = XIELUActivation (alpha_p, alpha_n parameters; beta, eps buffers) -
the same function as swiss-ai/Megatron-LM's megatron/training/activations.py XIELU. swiss-ai's own converter
(tools/checkpoint/saver_swissai_hf.py) writes `model.layers.{i}.mlp.act_fn.alpha_p` from the Megatron checkpoint's
`mlp.activation_func.alpha_p`, as here.

A checkpoint trained 3 steps -> scripts/tools/convert_to_hf.py -> ApertusForCausalLM.from_pretrained: its logits equal
ours (1e-5, fp32); and an Apertus folder saved by transformers comes in through --init-from-hf.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from arguments.config import PretrainConfig
from base.errors import ConfigError
from base.options import replace_settings
from checkpoint.hf.folders import check_convertible
from checkpoint.hf.source import load_hf_weights
from checkpoint.ours.sharded import save_checkpoint
from scripts.tools import convert_to_hf
from tests.checkpoint.test_hf_llama import CPU, TOLERANCE, VOCAB, build, our_logits, step

APERTUS = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
               hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-6, normalization="RMSNorm",
               position_embedding_type="rope", ffn_hidden_size=96, activation="xielu", qk_layernorm=True,
               add_bias_linear=False, num_query_groups=2, untie_embeddings_and_output_weights=True,
               rotary_base=5e5, use_rope_scaling=True, rope_scaling_factor=8.0)


def apertus_run_config(**overrides) -> PretrainConfig:
    config = PretrainConfig()
    model = replace_settings(config.model, **{**APERTUS, "vocab_size": VOCAB, **overrides})
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
    (dict(kv_channels=24), "no --kv-channels other than hidden / heads"),
    (dict(num_experts=4), "no --num-experts (Apertus has no experts)")])
def test_a_xielu_model_apertus_cannot_hold_is_refused_in_one_line(change, named):
    with pytest.raises(ConfigError) as error:
        check_convertible(apertus_run_config(**change).model, "the Hugging Face export")
    assert named in str(error.value) and "ApertusForCausalLM" in str(error.value) and "\n" not in str(error.value)


def random_apertus_folder(path, alpha_p: float = 0.4, alpha_n: float = -0.6):
    """An ApertusForCausalLM with every weight random (norm gains around 1) and its xIELU scalars set, saved by
    transformers (beta and eps buffers included)."""
    from transformers import ApertusConfig, ApertusForCausalLM

    their_config = ApertusConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                                 rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                 tie_word_embeddings=False, dtype=torch.float32,
                                 rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 8192})
    model = ApertusForCausalLM(their_config)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "act_fn" in name:
                param.fill_(alpha_p if name.endswith("alpha_p") else alpha_n)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1 + (1.0 if param.ndim == 1 else 0.0))
    model.save_pretrained(str(path))
    return path


def apertus_logits(hf_dir, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import ApertusForCausalLM

    model = ApertusForCausalLM.from_pretrained(str(hf_dir), attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def test_an_apertus_folder_imports_trains_exports_and_resumes_exactly(tmp_path):
    """--init-from-hf of an Apertus folder: its config.json gives --xielu, --qk-layernorm and Llama's settings; the
    imported logits equal transformers' (so its alpha_p/alpha_n reached our scalars); 3 steps, the export, and a
    resume that takes the same next steps bit for bit."""
    from arguments.parser import parse_config
    from checkpoint.hf.source import initialize_from_hf
    from checkpoint.ours.sharded import load_checkpoint

    source = random_apertus_folder(tmp_path / "source")
    read = parse_config(["--init-from-hf", str(source), "--seq-length", "16"]).model
    assert (read.mlp.activation, read.attention.qk_layernorm, read.mlp.swiglu, read.add_bias_linear, read.norms.normalization,
            read.attention.num_query_groups, read.ffn_hidden_size) == ("xielu", True, False, False, "RMSNorm", 2, 96)
    config = apertus_run_config()
    tokens = torch.randint(0, VOCAB, (4, APERTUS["seq_length"] + 1), generator=torch.Generator().manual_seed(1))
    model, optimizer = build(config)
    initialize_from_hf(optimizer, model, source, config.model, CPU)
    assert model.blocks[1].mlp.activation_func.alpha_p.item() == pytest.approx(0.4)
    imported = our_logits(model, tokens[:, :-1])
    assert (imported - apertus_logits(source, tokens[:, :-1])).abs().max() <= TOLERANCE

    [step(model, optimizer, tokens) for _ in range(3)]
    save_checkpoint(tmp_path / "ckpt", 3, 12, model, optimizer, None, config, CPU)
    assert convert_to_hf.main([str(tmp_path / "ckpt"), str(tmp_path / "back")]) == 0
    trained = our_logits(model, tokens[:, :-1])
    assert (trained - imported).abs().max() > 1e-3
    assert (trained - apertus_logits(tmp_path / "back", tokens[:, :-1])).abs().max() <= TOLERANCE
    resumed, resumed_optimizer = build(config)
    load_checkpoint(tmp_path / "ckpt", resumed, resumed_optimizer, None, CPU, load_rng=False)
    assert [step(resumed, resumed_optimizer, tokens) for _ in range(2)] == [step(model, optimizer, tokens)
                                                                             for _ in range(2)]


def test_an_apertus_folder_with_another_xielu_beta_is_refused_in_one_line(tmp_path):
    from safetensors.torch import load_file, save_file

    source = random_apertus_folder(tmp_path / "source")
    tensors = load_file(str(source / "model.safetensors"))
    tensors["model.layers.1.mlp.act_fn.beta"] = torch.tensor(0.25)
    save_file(tensors, str(source / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match=r"model.layers.1.mlp.act_fn.beta is 0.25: xIELU's beta is 0.5") as error:
        load_hf_weights(source, apertus_run_config().model, CPU)
    assert "\n" not in str(error.value)
