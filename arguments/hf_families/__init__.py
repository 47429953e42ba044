"""The Hugging Face families beyond GPT-2, Llama, Mixtral, Qwen2-MoE and Apertus (arguments/hf_config.py,
arguments/hf_folder.py, checkpoint/hf/llama.py hold those), one module each, in two tables:

- FAMILIES, model_type -> DenseFamily (arguments/hf_families/dense.py): the dense families (Qwen2/2.5, Qwen3,
  Mistral, Gemma 2/3, OLMo 2, Phi-3): its config.json field table (type, meaning, transformers' default), the
  settings a folder gives, the config.json the export writes, and its weights' names (checkpoint/hf/dense.py maps
  them); the export tries them in this order where --hf-model-type does not name one.
- FAMILY_READERS, model_type -> FamilyReader (arguments/hf_settings.py): the MoE families (Qwen3-MoE, DeepSeek-V3,
  GPT-OSS, OLMoE, GLM-4.5): the field table, the rules between fields, the settings it gives; each family's weights
  are mapped in checkpoint/hf/families/, registered the same way.

arguments/hf_config.py and arguments/hf_folder.py look a family up in both before their own.
"""

from __future__ import annotations

from arguments.hf_families import (
    deepseek_v3,
    gemma2,
    gemma3,
    glm4_moe,
    gpt_oss,
    mistral,
    olmo2,
    olmoe,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
)
from arguments.hf_families.dense import DenseFamily
from arguments.hf_settings import FamilyReader

FAMILIES: dict[str, DenseFamily] = {family.model_type: family for family in (
    qwen2.FAMILY, qwen3.FAMILY, mistral.FAMILY, gemma2.FAMILY, gemma3.FAMILY, olmo2.FAMILY, phi3.FAMILY,
    gemma3.MULTIMODAL)}

FAMILY_READERS: dict[str, FamilyReader] = {reader.model_type: reader for reader in (
    qwen3_moe.READER, deepseek_v3.READER, gpt_oss.READER, olmoe.READER, glm4_moe.READER)}

# A model_type is read by one table only.
assert not FAMILIES.keys() & FAMILY_READERS.keys()
