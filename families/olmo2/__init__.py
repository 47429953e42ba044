"""OLMo 2: a dense family (config.py: its config.json fields, settings, export and weight names; its weights
move through families/common/dense_weights.py)."""

from families.common.family import Family
from families.olmo2 import config

FAMILY = Family(claim_order=160, dense=(config.FAMILY,))
