"""NemotronH: a hybrid family of Mamba-2, attention and MLP layers (config.py: its config.json fields, rules and
settings; weights.py: its weights)."""

from families.common.family import Family
from families.nemotron_h import config, weights

FAMILY = Family(claim_order=5, readers=(config.READER,), weights=weights.WEIGHTS)
