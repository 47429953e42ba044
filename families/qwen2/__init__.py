"""Qwen2/2.5: a dense family (config.py: its config.json fields, settings, export and weight names; its weights
move through families/common/dense_weights.py)."""

from families.common.family import Family
from families.qwen2 import config

FAMILY = Family(claim_order=110, dense=(config.FAMILY,))
