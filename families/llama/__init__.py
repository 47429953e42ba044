"""Llama: a Llama-shaped family (config.py: its config.json fields, rules and settings; its weights move
through families/common/llama_shaped.py, shared by the Llama-shaped families)."""

from families.common.family import Family
from families.llama import config

FAMILY = Family(claim_order=240, readers=(config.READER,), llama_shaped=True)
