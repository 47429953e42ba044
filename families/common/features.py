"""The block features a family carries: a section's settings declared `feature=` (base/options.py) are math a model
file must hold once they differ from their default (a clamp of q, k and v, a soft-capping, a gate). A family
declares the features it holds (its `carries`: written to its config.json, or pinned and decided by its own rules),
and an export refuses every other feature the model sets: a feature added to a section is refused by every family
until one says it carries it, rather than exported without it by each family whose list of what it lacks was not
updated. A feature whose section names a config.json key (OLMoE's clip_qkv, Gemma's soft-cappings) is read and
written under that key by `carried_settings` and `carried_fields`, so a family carrying it needs no code of its own.
"""

from __future__ import annotations

import functools
from typing import Any, Iterable

from base.options import features, flag_of_setting, setting_value
from families.common.fields import FolderValue
from gpt.model_config import ModelConfig


@functools.cache
def _defaults() -> dict[str, Any]:
    default = ModelConfig()
    return {name: setting_value(default, name) for name in features(ModelConfig)}


def set_features(config: ModelConfig) -> dict[str, Any]:
    """{feature: value} of every block feature `config` sets away from its default."""
    return {name: value for name, default in _defaults().items()
            if (value := setting_value(config, name)) != default}


def uncarried(config: ModelConfig, carries: Iterable[str]) -> list[str]:
    """The flag (`no --clip-qkv`, `--sublayer-norms input`) each feature `config` sets, and `carries` does not name,
    would need."""
    carried = set(carries)
    return [flag_for(name, _defaults()[name]) for name in set_features(config) if name not in carried]


def carried_fields(config: ModelConfig, carries: Iterable[str]) -> dict[str, Any]:
    """{config.json key: value} of the carried features that have a key (their sections' `feature=`)."""
    keys = features(ModelConfig)
    return {keys[name]: setting_value(config, name) for name in carries if isinstance(keys.get(name), str)}


def carried_settings(values: dict, carries: Iterable[str]) -> dict[str, FolderValue]:
    """{setting: its value in a folder's config.json} of the carried features that have a key."""
    keys = features(ModelConfig)
    return {name: FolderValue(values[keys[name]], keys[name]) for name in carries if isinstance(keys.get(name), str)}


def flag_for(name: str, value) -> str:
    """The flag (and value) that sets the ModelConfig setting `name` to `value` (Megatron-LM reads
    --num-query-groups only beside --group-query-attention)."""
    if name == "add_bias_linear":
        return "no --disable-bias-linear" if value else "--disable-bias-linear"
    flag = flag_of_setting(ModelConfig, name)
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    if value is None:
        return f"no {flag}"
    if name == "num_query_groups":
        return f"--group-query-attention {flag} {value}"
    return f"{flag} {value}"
