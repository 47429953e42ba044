"""The one registry of the Hugging Face families: every sub-folder of families/ but common/ is a family giving `FAMILY`,
found by scanning, so adding a family is adding its folder; the lookups read what it found, in claim order.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Optional

import families
from base.errors import ConfigError
from families.common.dense import DenseFamily
from families.common.family import Family
from families.common.layout import FamilyWeights
from families.common.llama_shaped import is_apertus
from families.common.reader import FamilyReader
from gpt.model_config import ModelConfig

SHARED = frozenset({"common"})  # the folders that are no family


@functools.cache
def registered() -> tuple[Family, ...]:
    """Every family folder's FAMILY, in claim order."""
    found = []
    for info in sorted(pkgutil.iter_modules(families.__path__), key=lambda info: info.name):
        if info.ispkg and info.name not in SHARED:
            family = importlib.import_module(f"{families.__name__}.{info.name}").FAMILY
            found.append(Family(**{**family.__dict__, "name": info.name}))
    found.sort(key=lambda family: family.claim_order)
    orders = [family.claim_order for family in found]
    assert len(set(orders)) == len(orders), f"two families share a claim_order: {orders}"
    types = [model_type for family in found for model_type in family.model_types]
    assert len(set(types)) == len(types), f"a model_type is read by two families: {types}"
    return tuple(found)


def family_named(name: str) -> Family:
    return next(family for family in registered() if family.name == name)


def dense_families() -> dict[str, DenseFamily]:
    """model_type -> DenseFamily (the export asks them in this order)."""
    return {dense.model_type: dense for family in registered() for dense in family.dense}


def family_readers() -> dict[str, FamilyReader]:
    """model_type -> FamilyReader: the families read by a reader of their own (MoE, Llama-shaped, GPT-2)."""
    return {reader.model_type: reader for family in registered() for reader in family.readers}


def family_weights() -> dict[str, FamilyWeights]:
    """model_type -> FamilyWeights: the MoE families' weights, in the order `family_of` asks them."""
    return {family.weights.model_type: family.weights for family in registered() if family.weights is not None}


def llama_families() -> tuple[str, ...]:
    """The model_types whose weights move through families/common/llama_shaped.py."""
    return tuple(model_type for family in registered() if family.llama_shaped for model_type in family.model_types)


def architectures() -> dict[str, tuple[str, ...]]:
    """Every model_type read here and its architectures (the readers' first, then the dense families')."""
    return {**{model_type: reader.architectures for model_type, reader in family_readers().items()},
            **{model_type: dense.architectures for model_type, dense in dense_families().items()}}


def fallback_family() -> Family:
    """The family a model no other family claims exports as: the last in claim order with a mapping of its own
    (GPT-2)."""
    return next(family for family in reversed(registered()) if family.export is not None)


def family_of(config: ModelConfig) -> Optional[FamilyWeights]:
    """The MoE family a model exports as, or None."""
    if is_apertus(config):
        return None
    return next((weights for weights in family_weights().values() if weights.claims(config)), None)


def export_family(model: ModelConfig, older_classes_hold: bool) -> Optional[DenseFamily]:
    """The dense family the export writes `model` as: --hf-model-type's (refused if it does not fit), else None where
    GPT-2's or Llama's classes hold it, else the first dense family that holds it."""
    dense = dense_families()
    wanted = "gemma3_text" if model.hf_model_type == "gemma3" else model.hf_model_type
    if wanted is not None and wanted in dense:
        family = dense[wanted]
        misfits = family.misfits(model)
        if misfits:
            raise ConfigError(f"--hf-model-type {wanted}: as a {family.architecture} this model would need "
                              f"{', '.join(misfits)}")
        return family
    if wanted is not None or older_classes_hold:
        return None
    return next((family for family in dense.values() if family.section is None and not family.misfits(model)),
                None)


def __getattr__(name: str):
    """The tables under their older names."""
    tables = {"FAMILIES": dense_families, "FAMILY_READERS": family_readers, "FAMILY_WEIGHTS": family_weights,
              "LLAMA_FAMILIES": llama_families}
    if name in tables:
        return tables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
