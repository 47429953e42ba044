"""The Hugging Face families read by a module of their own (issue 63), one table: model_type -> its reader
(arguments/hf_settings.py FamilyReader: the field table, the rules between fields, the settings it gives).
arguments/hf_config.py and arguments/hf_folder.py look a family up here before their own (GPT-2, Llama, Mixtral,
Qwen2-MoE, Apertus); each family's weights are mapped in checkpoint/hf_families/, registered the same way.
"""

from __future__ import annotations

from arguments.hf_families import deepseek_v3, glm4_moe, gpt_oss, olmoe, qwen3_moe
from arguments.hf_settings import FamilyReader

FAMILY_READERS: dict[str, FamilyReader] = {reader.model_type: reader for reader in (
    qwen3_moe.READER, deepseek_v3.READER, gpt_oss.READER, olmoe.READER, glm4_moe.READER)}
