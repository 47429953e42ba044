"""Qwen2-MoE: a Llama-shaped family (config.py: its config.json fields, rules and settings; its weights move
through families/common/llama_shaped.py, shared by the Llama-shaped families)."""

from families.common.family import Family
from families.qwen2_moe import config

FAMILY = Family(claim_order=230, readers=(config.READER,), llama_shaped=True)
