"""Hugging Face Llama in and out (issue 37's acceptance): a tiny random LlamaForCausalLM saved with
transformers -> --init-from-hf's import -> 3 iterations -> scripts/tools/convert_to_hf.py -> loaded by transformers:
its logits equal our model's (1e-5, fp32), and a resume from the saved checkpoint continues exactly.

The layout claims checked here (families/common/llama_shaped.py's docstring): transformers' LlamaForCausalLM and our
rotary both rotate halves (transformers/models/llama/modeling_llama.py rotate_half; Megatron-Core
rope_utils._rotate_half without interleaving), so a folder saved by transformers needs no q/k permutation -
transformers' own models/llama/convert_llama_weights_to_hf.py applies `permute` ("permute for sliced
rotary") only to Meta's original interleaved consolidated.*.pth. If a permutation were needed, the logits
right after the import would differ from the folder's and the first assertion would fail.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from arguments.config import PretrainConfig
from base.errors import ConfigError
from base.options import replace_settings
from checkpoint.hf.folders import check_convertible, read_hf_folder
from checkpoint.hf.source import initialize_from_hf, load_hf_weights
from checkpoint.ours.sharded import load_checkpoint, save_checkpoint
from gpt.model import GPTModel
from parallel.state import ParallelState
from scripts.tools import convert_to_hf
from tests.checkpoint.hf_random import fill_random
from tests.zero_harness import ZeroHarness

CPU = ParallelState(device=torch.device("cpu"))
TOLERANCE = 1e-5
VOCAB = 300  # not a multiple of 128: our vocabulary is padded, transformers' is not
SHAPE = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
             hidden_dropout=0.0, attention_dropout=0.0, layernorm_epsilon=1e-6, normalization="RMSNorm", swiglu=True,
             position_embedding_type="rope", ffn_hidden_size=96)
# name -> (our settings beyond SHAPE, LlamaConfig's): GQA with 2 groups, untied, no biases, Llama 3's rope
# scaling; and MQA, tied, with biases.
VARIANTS = {
    "gqa2-untied-nobias-llama3": (
        dict(num_query_groups=2, untie_embeddings_and_output_weights=True, add_bias_linear=False, rotary_base=5e5,
             use_rope_scaling=True, rope_scaling_factor=8.0),
        dict(num_key_value_heads=2, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
             rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    # Megatron-LM's --kv-channels is transformers' head_dim: 4 heads of 24 at hidden 64
    "gqa2-head-dim-24": (
        dict(num_query_groups=2, untie_embeddings_and_output_weights=True, add_bias_linear=False, kv_channels=24),
        dict(num_key_value_heads=2, tie_word_embeddings=False, attention_bias=False, mlp_bias=False, head_dim=24,
             rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    "mqa-tied-bias": (
        dict(num_query_groups=1, untie_embeddings_and_output_weights=False, add_bias_linear=True),
        dict(num_key_value_heads=1, tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
             rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
}


def llama_run_config(variant: str, **overrides) -> PretrainConfig:
    config = PretrainConfig()
    model = replace_settings(config.model, **{**SHAPE, **VARIANTS[variant][0], "vocab_size": VOCAB, **overrides})
    return dataclasses.replace(config, model=model, zero=dataclasses.replace(config.zero, stage=1),
                               # large enough that 3 steps move every weight visibly
                               optimizer=dataclasses.replace(config.optimizer, lr=1e-2))


def random_llama_folder(path: Path, variant: str, vocab_size: int = VOCAB) -> Path:
    """A LlamaForCausalLM with every weight random (norm gains and biases too), saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    their_config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, max_position_embeddings=16, rms_norm_eps=1e-6,
                               bos_token_id=None, eos_token_id=None, pad_token_id=None, **VARIANTS[variant][1])
    model = LlamaForCausalLM(their_config)
    fill_random(model, seed=3, scale=0.1)
    model.save_pretrained(str(path))
    return path


def transformers_logits(hf_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(str(hf_dir), attn_implementation="eager", dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def build(config: PretrainConfig):
    model = GPTModel(config.model, CPU)
    return model, ZeroHarness.from_config(model, config, CPU, blocks=model.blocks)


def step(model, optimizer, tokens: torch.Tensor) -> float:
    optimizer.zero_grad()
    loss = model(tokens[:, :-1], tokens[:, 1:]).mean()
    optimizer.backward(loss)
    optimizer.step()
    return loss.item()


def our_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    model.eval()
    try:
        with torch.no_grad():
            return model(tokens)
    finally:
        model.train()


@pytest.mark.parametrize("variant", VARIANTS)
def test_llama_folder_imports_trains_exports_and_resumes_exactly(variant, tmp_path):
    source = random_llama_folder(tmp_path / "source", variant)
    config = llama_run_config(variant)
    tokens = torch.randint(0, VOCAB, (4, SHAPE["seq_length"] + 1), generator=torch.Generator().manual_seed(1))
    model, optimizer = build(config)
    initialize_from_hf(optimizer, model, source, config.model, CPU)
    imported = our_logits(model, tokens[:, :-1])
    assert imported.shape[-1] == VOCAB
    assert (imported - transformers_logits(source, tokens[:, :-1])).abs().max() <= TOLERANCE

    losses = [step(model, optimizer, tokens) for _ in range(3)]
    assert losses[-1] < losses[0]
    save_checkpoint(tmp_path / "ckpt", 3, 12, model, optimizer, None, config, CPU)
    assert convert_to_hf.main([str(tmp_path / "ckpt"), str(tmp_path / "back")]) == 0
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["architectures"] == ["LlamaForCausalLM"] and written["model_type"] == "llama"
    trained = our_logits(model, tokens[:, :-1])
    assert (trained - imported).abs().max() > 1e-3  # the 3 iterations changed the model
    assert (trained - transformers_logits(tmp_path / "back", tokens[:, :-1])).abs().max() <= TOLERANCE

    # Resume: a fresh model and optimizer from the checkpoint take the same next steps, bit for bit.
    resumed, resumed_optimizer = build(config)
    load_checkpoint(tmp_path / "ckpt", resumed, resumed_optimizer, None, CPU, load_rng=False)
    assert [step(resumed, resumed_optimizer, tokens) for _ in range(2)] == [step(model, optimizer, tokens)
                                                                             for _ in range(2)]


def test_import_at_any_vocabulary_padding_keeps_transformers_weights(tmp_path):
    """The export of an import gives back the folder's tensors exactly (no permutation, no padding)."""
    source = random_llama_folder(tmp_path / "source", "gqa2-untied-nobias-llama3")
    config = llama_run_config("gqa2-untied-nobias-llama3", make_vocab_size_divisible_by=64)
    model, optimizer = build(config)
    initialize_from_hf(optimizer, model, source, config.model, CPU)
    save_checkpoint(tmp_path / "ckpt", 0, 0, model, optimizer, None, config, CPU)
    assert convert_to_hf.main([str(tmp_path / "ckpt"), str(tmp_path / "back")]) == 0
    (_, before), (_, after) = read_hf_folder(source), read_hf_folder(tmp_path / "back")
    assert before.keys() == after.keys() and "lm_head.weight" in after
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_a_run_that_differs_from_the_folder_is_told_each_flag(tmp_path):
    source = random_llama_folder(tmp_path / "source", "gqa2-untied-nobias-llama3")
    config = llama_run_config("mqa-tied-bias", ffn_hidden_size=None)
    with pytest.raises(ConfigError) as error:
        load_hf_weights(source, config.model, CPU)
    message = str(error.value)
    assert "\n" not in message
    for expected in ("--group-query-attention --num-query-groups 2", "--untie-embeddings-and-output-weights",
                     "--disable-bias-linear", "--rotary-base 500000.0", "--use-rope-scaling",
                     "--ffn-hidden-size 96"):
        assert expected in message, expected


@pytest.mark.parametrize("change, named", [
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type 'linear'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
      "rope_parameters": None}, "rope_type 'yarn'"),
    ({"sliding_window": 8}, "sliding_window 8"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"mlp_bias": False}, "mlp_bias False"),
])
def test_a_llama_config_we_cannot_compute_is_refused_in_one_line(tmp_path, change, named):
    source = random_llama_folder(tmp_path / "source", "mqa-tied-bias")
    path = source / "config.json"
    written = json.loads(path.read_text())
    written.update(change)
    path.write_text(json.dumps({key: value for key, value in written.items() if value is not None}))
    with pytest.raises(ConfigError) as error:
        load_hf_weights(source, llama_run_config("mqa-tied-bias", add_bias_linear=False).model, CPU)
    assert "\n" not in str(error.value) and named in str(error.value) and "cannot be represented" in str(error.value)


def test_only_models_a_gpt2_or_llama_folder_can_hold_are_converted():
    llama = llama_run_config("gqa2-untied-nobias-llama3").model
    check_convertible(llama, "--init-from-hf")
    gpt2_untied = replace_settings(PretrainConfig().model, untie_embeddings_and_output_weights=True)
    interleaved = llama_run_config("gqa2-untied-nobias-llama3", rotary_interleaved=True).model
    # a Llama asked to stay one (--hf-model-type llama, as a Llama folder sets it) with per-head q/k norms
    qk_norm = llama_run_config("gqa2-untied-nobias-llama3", qk_layernorm=True, hf_model_type="llama").model
    for model, needs in ((gpt2_untied, "--normalization RMSNorm, --swiglu, --position-embedding-type rope"),
                         (interleaved, "no --rotary-interleaved"), (qk_norm, "no --qk-layernorm")):
        with pytest.raises(ConfigError, match="LlamaForCausalLM") as error:
            check_convertible(model, "--init-from-hf")
        assert needs in str(error.value) and "\n" not in str(error.value)
    # without it, per-head q/k norms are a Qwen3ForCausalLM's (families/common/dense_weights.py)
    from checkpoint.hf.folders import dense_family

    check_convertible(dataclasses.replace(qk_norm, hf_model_type=None), "--init-from-hf")
    assert dense_family(dataclasses.replace(qk_norm, hf_model_type=None)).architecture == "Qwen3ForCausalLM"


def test_a_folder_of_the_other_family_is_told_what_to_change(tmp_path):
    from tests.checkpoint.test_hf_checkpoint import random_hf_folder

    gpt2_folder = random_hf_folder(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match="which a GPT-2 folder lacks: drop them") as error:
        load_hf_weights(gpt2_folder, llama_run_config("mqa-tied-bias").model, CPU)
    assert "--normalization RMSNorm" in str(error.value) and "\n" not in str(error.value)
    llama_folder = random_llama_folder(tmp_path / "llama", "mqa-tied-bias")
    gpt2_run = llama_run_config("mqa-tied-bias", normalization="LayerNorm", swiglu=False,
                                position_embedding_type="learned_absolute", num_query_groups=None)
    with pytest.raises(ConfigError) as error:
        load_hf_weights(llama_folder, gpt2_run.model, CPU)
    for flag in ("--normalization RMSNorm", "--swiglu", "--position-embedding-type rope",
                 "--group-query-attention --num-query-groups 1"):
        assert flag in str(error.value), flag
