"""DeepSeek-V3: an MoE family (config.py: its config.json fields, rules and settings; weights.py: its weights)."""

from families.common.family import Family
from families.deepseek_v3 import config, weights

FAMILY = Family(claim_order=20, readers=(config.READER,), weights=weights.WEIGHTS)
