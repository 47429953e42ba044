"""A folder of families/ as the registry (families/registry.py) reads it: its `FAMILY`, one `Family`.

`claim_order` is the family's place in the order the export asks the families whether a model is theirs (lower
first: the MoE families, each claiming by the feature the later ones lack, then the dense families, then the
Llama-shaped ones and GPT-2); no two families share one. A family gives what it maps: `readers` (config.json read
by a FamilyReader: its field table, rules and settings), `dense` (DenseFamily: config.json both ways and the names
families/common/dense_weights.py moves), `weights` (an MoE family's FamilyWeights), `llama_shaped` (its weights
move through families/common/llama_shaped.py) and `export` (a mapping of its own: GPT-2's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from families.common.dense import DenseFamily
from families.common.layout import FamilyWeights
from families.common.reader import FamilyReader


@dataclass(frozen=True)
class Family:
    claim_order: int
    readers: tuple[FamilyReader, ...] = ()
    dense: tuple[DenseFamily, ...] = ()
    weights: Optional[FamilyWeights] = None
    llama_shaped: bool = False
    export: Optional[Any] = None
    name: str = ""  # its folder's name, set by the registry

    @property
    def model_types(self) -> tuple[str, ...]:
        return tuple(entry.model_type for entry in (*self.readers, *self.dense))
