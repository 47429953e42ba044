"""GPT-2: config.py (its config.json fields, rule and settings) and weights.py (GPT2LMHeadModel's names and layout);
the export writes a model as GPT-2 where no other family claims it."""

from families.common.family import Family
from families.gpt2 import config, weights

FAMILY = Family(claim_order=300, readers=(config.READER,), export=weights)
