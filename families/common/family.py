"""A folder of families/ as the registry reads it: its `FAMILY`, one `Family` giving what it maps (readers, a dense
record, MoE weights, or its own export) and its `claim_order` in the export's questions.
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
