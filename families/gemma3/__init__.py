"""Gemma 3, text and the multimodal folder's language model: a dense family (config.py: its config.json fields,
settings, export and weight names; its weights move through families/common/dense_weights.py)."""

from families.common.family import Family
from families.gemma3 import config

FAMILY = Family(claim_order=150, dense=(config.FAMILY, config.MULTIMODAL))
