"""Qwen3-Next: a hybrid MoE family (config.py: its config.json fields, rules and settings; weights.py: its weights)."""

from families.common.family import Family
from families.qwen3_next import config, weights

FAMILY = Family(claim_order=8, readers=(config.READER,), weights=weights.WEIGHTS)
