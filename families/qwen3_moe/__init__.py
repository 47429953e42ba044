"""Qwen3-MoE: an MoE family (config.py: its config.json fields, rules and settings; weights.py: its weights)."""

from families.common.family import Family
from families.qwen3_moe import config, weights

FAMILY = Family(claim_order=50, readers=(config.READER,), weights=weights.WEIGHTS)
