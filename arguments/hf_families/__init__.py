"""The Hugging Face families beyond GPT-2, Llama, Mixtral, Qwen2-MoE and Apertus (arguments/hf_config.py,
arguments/hf_folder.py, checkpoint/hf_llama.py hold those), one module each: its config.json field table (type,
meaning, transformers' default), the settings a folder gives, the config.json the export writes, and its weights'
names (checkpoint/hf_dense.py maps them). FAMILIES, model_type -> the family, is the one table they are registered
in; the export tries them in this order where --hf-model-type does not name one."""

from __future__ import annotations

from arguments.hf_families import gemma2, gemma3, mistral, olmo2, phi3, qwen2, qwen3
from arguments.hf_families.dense import DenseFamily

FAMILIES: dict[str, DenseFamily] = {family.model_type: family for family in (
    qwen2.FAMILY, qwen3.FAMILY, mistral.FAMILY, gemma2.FAMILY, gemma3.FAMILY, olmo2.FAMILY, phi3.FAMILY,
    gemma3.MULTIMODAL)}
