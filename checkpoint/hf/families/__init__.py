"""The Hugging Face families whose weights are mapped by a module of their own (issue 63), one table: model_type ->
its FamilyWeights (checkpoint/hf/families/layout.py). checkpoint/hf/folders.py asks `family_of` which family a model exports
as before its own GPT-2 / Llama / Mixtral / Qwen2-MoE / Apertus mapping (checkpoint/hf/llama.py); a folder's
config.json is read by the family's module of arguments/hf_families/."""

from __future__ import annotations

from typing import Optional

from arguments.config import ModelConfig
from checkpoint.hf.families import deepseek_v3, glm4_moe, gpt_oss, olmoe, qwen3_moe
from checkpoint.hf.families.layout import FamilyWeights
from checkpoint.hf.llama import is_apertus

# In the order `family_of` asks them: each claims models by the feature the later ones lack.
FAMILY_WEIGHTS: dict[str, FamilyWeights] = {weights.model_type: weights for weights in (
    gpt_oss.WEIGHTS, deepseek_v3.WEIGHTS, olmoe.WEIGHTS, glm4_moe.WEIGHTS, qwen3_moe.WEIGHTS)}


def family_of(config: ModelConfig) -> Optional[FamilyWeights]:
    """The family a model exports as, or None (checkpoint/hf/folders.py's own mapping decides; a --xielu model is always an
    Apertus there)."""
    if is_apertus(config):
        return None
    return next((weights for weights in FAMILY_WEIGHTS.values() if weights.claims(config)), None)
