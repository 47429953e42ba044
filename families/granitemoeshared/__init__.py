"""GraniteMoeShared: an MoE family (config.py: its config.json fields, rules and settings; weights.py: its weights)."""

from families.common.family import Family
from families.granitemoeshared import config, weights

FAMILY = Family(claim_order=60, readers=(config.READER,), weights=weights.WEIGHTS)
