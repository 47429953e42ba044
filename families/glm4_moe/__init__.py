"""GLM-4.5: an MoE family (config.py: its config.json fields, rules and settings; weights.py: its weights)."""

from families.common.family import Family
from families.glm4_moe import config, weights

FAMILY = Family(claim_order=40, readers=(config.READER,), weights=weights.WEIGHTS)
