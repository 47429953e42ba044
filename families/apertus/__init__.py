"""Apertus: a Llama-shaped family (config.py: its config.json fields, rules and settings; its weights move
through families/common/llama_shaped.py, shared by the Llama-shaped families)."""

from families.apertus import config
from families.common.family import Family

FAMILY = Family(claim_order=210, readers=(config.READER,), llama_shaped=True)
