"""The dense families of issue 63 (families/, families/common/dense_weights.py), each a tiny random folder made
and saved by transformers (2 layers; where the family has a sliding window, one of 5 keys, shorter than the
32-token sequence; weights drawn away from their initial values): `pretrain_gpt.py --init-from-hf DIR` with no
shape flag trains it, iteration 1's logged loss is transformers' loss on that iteration's batch (<= 1e-5
relative; it is computed before any update), and `scripts/tools/convert_to_hf.py` of the checkpoint saved after step 1
loads in transformers as the same class, whose loss on iteration 2's batch is the one iteration 2 logged (computed
with the weights of step 1) within 1e-5 relative.

Each family's transformers modeling file is the spec (transformers 5, models/<family>/modeling_<family>.py):
Qwen2 (q/k/v biases; a full layer then a windowed one, layer_types), Qwen3 (per-head q/k norms, head_dim 24 at
hidden 64 / 4 heads, the same windows), Mistral (every layer windowed), Gemma 2 (sandwich 1 + w RMSNorms, GeGLU,
scaled embeddings, query_pre_attn_scalar, both soft-cappings, alternating windows), Gemma 3 (its q/k norms, linear
rope scaling on the full layers, a local rotary base for the windowed ones), OLMo 2 (norms after the sublayers,
q/k norms over the projections), Phi-3 (fused qkv_proj and gate_up_proj, partial rotary, windows), Phi-3 with
LongRoPE (rope_scaling "longrope": its original context 16 below the 32 positions, so a 16-token run takes the short
factors and a 32-token run the long ones, both with the attention factor of factor 32 / 16; gpt/longrope.py), and
Llama 3.1 (LlamaForCausalLM with rope_type llama3, read before this issue)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tests.checkpoint.test_hf_folder_is_the_model import RUN, random_weights, transformers_loss

VOCAB, POSITIONS, WINDOW = 300, 32, 5  # the vocabulary of the session's prepared corpus (corpus_cache_300)
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=POSITIONS, rms_norm_eps=1e-6, bos_token_id=None,
              eos_token_id=None, pad_token_id=None)
QWEN_WINDOWS = dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
GEMMA = dict(head_dim=16, query_pre_attn_scalar=20, sliding_window=WINDOW)
# family -> (config class, model class, its settings beyond COMMON)
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", QWEN_WINDOWS),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=24, rope_theta=1e6, **QWEN_WINDOWS)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(GEMMA, attn_logit_softcapping=2.0,
                                                        final_logit_softcapping=3.0)),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        GEMMA, sliding_window_pattern=2, rope_scaling={"rope_type": "linear", "factor": 4.0},
        rope_local_base_freq=500.0)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(rope_theta=5e5)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=WINDOW, partial_rotary_factor=0.5)),
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM", dict(original_max_position_embeddings=POSITIONS // 2, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0, 1.3, 2.0, 3.5, 5.0, 8.0, 12.0, 20.0],
        "long_factor": [1.1, 1.9, 3.0, 6.0, 11.0, 17.0, 25.0, 40.0]})),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, rope_theta=5e5)),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Every family's folder, made once for the module."""
    import transformers

    made = {}
    for family, (config_class, model_class, extra) in FAMILIES.items():
        config = getattr(transformers, config_class)(**COMMON, **extra)
        model = getattr(transformers, model_class)(config)
        random_weights(model, seed=7)
        if family.startswith("gemma"):  # Gemma's RMSNorm weights are the gain less one: keep the gains near 1
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if name.endswith("norm.weight"):
                        param.sub_(1.0)
        made[family] = tmp_path_factory.mktemp(family) / "hf"
        model.save_pretrained(str(made[family]))
    return made


# (family, the run's --seq-length): every family at the folder's 32 positions; LongRoPE's also at its original
# context, 16, where transformers takes the short factors (longrope_frequency_update: max position + 1 > 16 or not)
CASES = [(family, POSITIONS) for family in sorted(FAMILIES)] + [("phi3_longrope", POSITIONS // 2)]


@pytest.mark.slow
@pytest.mark.parametrize("family, seq_length", CASES, ids=[f"{family}-{seq}" for family, seq in CASES])
def test_a_folder_trains_and_its_export_is_the_same_class_and_loss(family, seq_length, folders, tmp_path, monkeypatch,
                                                                   corpus_cache_300):
    from transformers import AutoModelForCausalLM

    import pretrain_gpt
    import training.prepare
    from scripts.tools import convert_to_hf

    folder = folders[family]
    built = []
    build_data = training.prepare.build_data
    monkeypatch.setattr("training.prepare.build_data", lambda *args: built.append(build_data(*args)) or built[-1])
    metrics = tmp_path / "m.jsonl"
    run = list(RUN)
    run[run.index("--train-iters") + 1] = "2"
    assert pretrain_gpt.main(["--init-from-hf", str(folder), *run, "--seq-length", str(seq_length), "--lr", "1e-3",
                              "--lr-warmup-iters", "0", "--data-cache-dir", corpus_cache_300, "--metrics-file",
                              str(metrics), "--save", str(tmp_path / "ckpt"), "--save-interval", "1"]) == 0
    records = [json.loads(line) for line in metrics.read_text().splitlines() if '"loss"' in line]
    batches = iter(built[0].make_train_loader(0))
    first, second = (next(batches)["tokens"] for _ in range(2))
    assert first.shape == (2, seq_length + 1)
    theirs = transformers_loss(folder, first)
    assert math.isclose(records[0]["loss"], theirs, rel_tol=1e-5), (records[0]["loss"], theirs)

    assert convert_to_hf.main([str(tmp_path / "ckpt" / "iter_0000001"), str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((folder / "config.json").read_text())
    assert (written["model_type"], written["architectures"]) == (source["model_type"], source["architectures"])
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32)
    assert type(exported).__name__ == FAMILIES[family][1]
    after_step = transformers_loss(tmp_path / "out", second)
    assert records[1]["iteration"] == 2
    assert math.isclose(records[1]["loss"], after_step, rel_tol=1e-5), (records[1]["loss"], after_step)
    assert not math.isclose(records[1]["loss"], transformers_loss(folder, second), rel_tol=1e-5)  # the step moved it


def test_hf_model_type_names_the_class_and_a_model_it_cannot_hold_is_refused_in_one_line():
    """--hf-model-type (which --init-from-hf sets to the folder's model_type) picks the class where the blocks fit
    several (a Mistral's are a Phi-3's); where they do not fit it, the export says which flags they would need."""
    from base.errors import ConfigError
    from base.options import replace_settings
    from checkpoint.hf.folders import check_convertible, dense_family
    from gpt.model_config import ModelConfig

    mistral = ModelConfig.of(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", add_bias_linear=False,
                          untie_embeddings_and_output_weights=True, window_size=(4, 0), vocab_size=VOCAB)
    assert dense_family(mistral).architecture == "MistralForCausalLM"  # the first family that holds it
    assert dense_family(ModelConfig(**{**mistral.__dict__, "hf_model_type": "phi3"})).architecture == "Phi3ForCausalLM"
    with pytest.raises(ConfigError) as error:
        check_convertible(ModelConfig(**{**mistral.__dict__, "hf_model_type": "gemma2"}), "the Hugging Face export")
    message = str(error.value)
    assert message.startswith("--hf-model-type gemma2: as a Gemma2ForCausalLM") and "\n" not in message
    assert "--gated-linear-unit" in message and "--apply-layernorm-1p" in message
    # --clip-qkv (OLMoE's clip_qkv): no dense family, Llama's or GPT-2's clamps q, k and v
    clipped = replace_settings(mistral, clip_qkv=8.0)
    for model_type in ("mistral", "llama", "gpt2"):
        with pytest.raises(ConfigError, match="no --clip-qkv"):
            check_convertible(replace_settings(clipped, hf_model_type=model_type), "the Hugging Face export")


@pytest.mark.slow  # importing transformers' Gemma3ForConditionalGeneration takes 10 s (its vision side)
def test_a_multimodal_gemma3_folder_is_its_language_model(tmp_path):
    """Gemma3ForConditionalGeneration (the released Gemma 3 4B-27B): its text_config is read as a Gemma 3 text model,
    its language model's weights (language_model.model.*) come in, the vision tower's and the projector's are not
    read (said at the start), and our logits on a text-only batch are transformers' within 1e-5."""
    import dataclasses

    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from arguments.config import PretrainConfig
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings
    from arguments.parser import parse_arguments
    from base.options import replace_settings
    from checkpoint.hf.source import initialize_from_hf
    from gpt.model import GPTModel
    from parallel.state import ParallelState
    from tests.zero_harness import ZeroHarness

    text = dict(COMMON, **FAMILIES["gemma3_text"][2])
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    model = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                                        boi_token_index=297, eoi_token_index=298,
                                                        image_token_index=299))
    random_weights(model, seed=9)
    with torch.no_grad():  # Gemma's RMSNorm weights are the gain less one
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.sub_(1.0)
    model.save_pretrained(str(tmp_path / "hf"))
    settings = {name: given.value for name, given in architecture_settings(read_hf_config(tmp_path / "hf")).items()}
    assert settings["hf_model_type"] == "gemma3_text" and settings["local_rotary_base"] == 500.0
    notes = parse_arguments(["--init-from-hf", str(tmp_path / "hf")]).notes
    assert any("is read by its text_config" in note and "not read" in note for note in notes), notes
    config = PretrainConfig()
    config = dataclasses.replace(config, zero=dataclasses.replace(config.zero, stage=1), model=replace_settings(
        config.model, **settings, seq_length=16, hidden_dropout=0.0, attention_dropout=0.0, vocab_size=VOCAB))
    cpu = ParallelState(device=torch.device("cpu"))
    ours = GPTModel(config.model, cpu)
    initialize_from_hf(ZeroHarness.from_config(ours, config, cpu, blocks=ours.blocks), ours, tmp_path / "hf",
                       config.model, cpu)
    tokens = torch.randint(0, 296, (2, 16), generator=torch.Generator().manual_seed(1))
    theirs = Gemma3ForConditionalGeneration.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager",
                                                            dtype=torch.float32).eval()
    with torch.no_grad():
        our_logits, their_logits = ours.eval()(tokens), theirs(input_ids=tokens).logits
    assert (our_logits - their_logits).abs().max() <= 1e-5 * their_logits.abs().max()
