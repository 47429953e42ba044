"""A Hugging Face folder's config.json, read and checked before transformers sees any of it. The family comes from
`model_type` (else `architectures`); every field in the family's table is checked, then the rules between fields, so
each refusal is one ConfigError line naming the file, field, value and what it must be."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from base.errors import ConfigError
from families.common.fields import (  # noqa: F401 - HFConfig and RopeConfig are this reader's result, named here too
    MISSING,
    NAME,
    NAMES,
    OBJECT,
    HFConfig,
    RopeConfig,
    checked_field,
    read_json_object,
    shown,
    wrong_value,
)
from families.common.quantized_release import quantization_note
from families.registry import architectures, dense_families, family_readers

CONFIG_FILE = "config.json"


def read_hf_config(hf_dir: str | os.PathLike) -> HFConfig:
    """The folder's config.json, checked field by field, then across fields."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise ConfigError(f"{hf_dir}: no such Hugging Face model folder")
    path = hf_dir / CONFIG_FILE
    return check_hf_config_json(read_json_object(path), path)


def check_hf_config_json(raw: dict, path: str | os.PathLike = CONFIG_FILE) -> HFConfig:
    """`raw` (a config.json's object) checked; `path` names it in every error."""
    path = Path(path)
    return _quantization(_checked(raw, path), raw, path)


def _quantization(config: HFConfig, raw: dict, path: Path) -> HFConfig:
    """A quantization_config of a family that does not declare one (a GPTQ or AWQ Llama): an object or null, named in
    one start-up line."""
    if "quantization_config" in config.values:
        return config
    block = raw.get("quantization_config")
    if block is None:
        return config
    if not OBJECT.accepts(block):
        raise ConfigError(wrong_value(path, "quantization_config", block, OBJECT, nullable=True))
    architectures = raw.get("architectures")
    name = architectures[0] if isinstance(architectures, list) and architectures and \
        isinstance(architectures[0], str) else f"model_type {config.family}"
    return dataclasses.replace(config, notes=config.notes + quantization_note(path, block, name))


def _checked(raw: dict, path: Path) -> HFConfig:
    family = _family(raw, path)
    registered, reader = registered_family(family), family_readers().get(family)
    if registered is not None and registered.section is not None:  # the model is one object of a larger config
        section = raw.get(registered.section)
        if not OBJECT.accepts(section):
            raise ConfigError(wrong_value(path, registered.section, section, OBJECT, nullable=False))
        raw = section
    fields = dict(raw)
    values = {}
    for spec in (registered or reader).fields:
        values[spec.key] = checked_field(raw, spec, path, fields)
    if registered is not None:
        return dataclasses.replace(registered.typed(values, raw, path, fields), family=family, values=values)
    return reader.read(values, raw, path, fields)


def registered_family(model_type: str):
    """The dense family of `model_type`, or None."""
    return dense_families().get(model_type)


def families() -> dict[str, tuple[str, ...]]:
    """Every model_type read here and its architectures."""
    return architectures()


def _supported() -> str:
    listed = [f"{model_type!r} ({classes[0]})" for model_type, classes in families().items()]
    return ", ".join(listed[:-1]) + " and " + listed[-1]


def _family(raw: dict, path: Path) -> str:
    architectures = raw.get("architectures")
    if architectures is not None and not NAMES.accepts(architectures):
        raise ConfigError(wrong_value(path, "architectures", architectures, NAMES, nullable=True))
    model_type = raw.get("model_type", MISSING)
    if model_type is MISSING:
        named = {family for family, classes in families().items() for name in architectures or () if name in classes}
        if len(named) == 1:
            return named.pop()
        raise ConfigError(f"{path}: has no model_type, and its architectures ({shown(architectures)}) name no "
                          f"model read here; supported: {_supported()}")
    if not isinstance(model_type, str):
        raise ConfigError(wrong_value(path, "model_type", model_type, NAME, nullable=False))
    if model_type not in families():
        raise ConfigError(f"{path}: model_type {json.dumps(model_type)} is not read here; supported: {_supported()}")
    return model_type
