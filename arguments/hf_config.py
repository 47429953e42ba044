"""A Hugging Face folder's config.json, read and checked here before transformers sees any of it.

transformers 5 checks a config with huggingface_hub's strict dataclasses: a wrongly typed field
(`"num_hidden_layers": "2"`, `"hidden_size": null`) ends in a StrictDataclassFieldValidationError
traceback, and what it does not check (a negative size, `"rms_norm_eps": NaN`, any GPT-2 field, which
we compare without handing the dict to transformers) reaches our comparisons or the model as nonsense.
`read_hf_config` reads the file, picks the family by `model_type` (else by `architectures`), checks every field in
the family's table (its folder of families/, from families/registry.py) wherever the file has it, then the rules
between fields that transformers or our model need, and returns an `HFConfig`: the architecture in typed fields
(transformers' default where a key is left out) and the file's object for transformers, its float fields as floats
(transformers 5 refuses `"rms_norm_eps": 1`). Every refusal is one ConfigError line naming the file, the field, its
value as written and what it must be.

JSON as Python reads it: `true` is also an int in Python, but not a valid layer count; `2.0` is a float,
not an integer (transformers refuses it too); NaN and Infinity parse, and are no size or epsilon.
"""

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


# ---- reading ------------------------------------------------------------------------------------

def read_hf_config(hf_dir: str | os.PathLike) -> HFConfig:
    """The folder's config.json, checked field by field, then across fields."""
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise ConfigError(f"{hf_dir}: no such Hugging Face model folder")
    path = hf_dir / CONFIG_FILE
    return check_hf_config_json(read_json_object(path), path)


def check_hf_config_json(raw: dict, path: str | os.PathLike = CONFIG_FILE) -> HFConfig:
    """`raw` (a config.json's object) checked; `path` names it in every error. A quantization_config is checked
    and said for every family (`_quantization`)."""
    path = Path(path)
    return _quantization(_checked(raw, path), raw, path)


def _quantization(config: HFConfig, raw: dict, path: Path) -> HFConfig:
    """A quantization_config says how a release stores its weights (families/common/quantized_release.py):
    the families that declare it (GPT-OSS, DeepSeek-V3) check and name it; in any other folder (a Llama or GPT-2
    quantized by GPTQ, AWQ, bitsandbytes...) it was passed over in silence, and one that is not an object failed
    only once transformers read it, after the data was prepared. Now: an object (or null), named in one start-up
    line."""
    if "quantization_config" in config.values:  # the family's own field and note
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
    if registered is not None:  # its module's rules between fields, Llama's beneath them
        return dataclasses.replace(registered.typed(values, raw, path, fields), family=family, values=values)
    return reader.read(values, raw, path, fields)


def registered_family(model_type: str):
    """The dense family (families/registry.py dense_families) of `model_type`, or None."""
    return dense_families().get(model_type)


def families() -> dict[str, tuple[str, ...]]:
    """Every model_type read here and its architectures (families/registry.py)."""
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
