"""Tiny random Hugging Face folders of the MoE families read by families/ (issue 63), made and saved by
transformers: 2 layers, every weight random (norm gains around 1), the routers' biases non-zero (DeepSeek-V3's and
GLM-4.5's e_score_correction_bias, GPT-OSS's router bias) and GPT-OSS's attention sinks; GPT-OSS with a sliding
window shorter than the sequence and YaRN positions (truncate false), DeepSeek-V3 with MLA's YaRN, GLM-4.5 with
partial rotary, q/k norms, q/k/v biases, group-limited routing and 6 heads of 16 over a hidden size of 64, Qwen3-MoE
with a dense first layer. No tokenizer: the embedded corpus's byte-level BPE is trained to fit VOCAB
(tests/checkpoint/test_hf_folder_is_the_model.py). Shared
by the family test (tests/checkpoint/test_hf_moe_families.py) and the parallel ones
(tests/training/test_moe_families_parallel.py)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 320
POSITIONS = 32  # the sequence: the tiny preset's 128 cut to the folder's positions

_COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=POSITIONS, bos_token_id=None, eos_token_id=None, pad_token_id=None,
               tie_word_embeddings=False)

# family -> (transformers' config class, its CausalLM class, the config's arguments beyond _COMMON)
FAMILIES = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        num_key_value_heads=2, head_dim=24, intermediate_size=96, moe_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, mlp_only_layers=[0], norm_topk_prob=True, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1,
        n_group=4, topk_group=2, num_experts_per_tok=4, first_k_dense_replace=1, routed_scaling_factor=2.5,
        q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "original_max_position_embeddings": 4096})),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        num_key_value_heads=2, head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=5, swiglu_limit=1.0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 8, "truncate": False})),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(
        num_key_value_heads=2, intermediate_size=32, num_experts=4, num_experts_per_tok=2)),
    # GLM-4.5's released shape: its heads x head_dim is not hidden_size, nor do the heads divide it (4096 with 96
    # heads of 128 in GLM-4.5-Air; 64 with 6 of 16 here), which Glm4MoeConfig allows and LlamaConfig refuses
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", dict(
        num_attention_heads=6, num_key_value_heads=2, head_dim=16, intermediate_size=96, moe_intermediate_size=32,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
        routed_scaling_factor=1.5, use_qk_norm=True, attention_bias=True)),
    # Megatron-Core's default shared expert (ungated); attention_multiplier 1/sqrt(head_dim) is Megatron's own scale
    "granitemoeshared": ("GraniteMoeSharedConfig", "GraniteMoeSharedForCausalLM", dict(
        num_key_value_heads=2, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        shared_intermediate_size=48, attention_multiplier=0.25)),
}


def family_folder(family: str, path: Path, seed: int = 3) -> Path:
    """`family`'s tiny folder at `path`, saved by transformers' save_pretrained."""
    import transformers

    config_class, model_class, arguments = FAMILIES[family]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**{**_COMMON, **arguments}))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *((name, buffer) for name, buffer in model.named_buffers()
                                                         if name.endswith("e_score_correction_bias"))]:
            gain = "norm" in name and tensor.ndim == 1
            tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + (1.0 if gain else 0.0))
    model.save_pretrained(str(path))
    return path
