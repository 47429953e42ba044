"""The block features a family carries: settings declared `feature=` are math a model file must hold once off their
default. An export refuses every feature its family does not declare it carries, so a new feature is refused until a
family says it holds it.
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
    """The flag each feature `config` sets, and `carries` does not name, would need."""
    carried = set(carries)
    return [flag_for(name, _defaults()[name]) for name in set_features(config) if name not in carried]


def carried_fields(config: ModelConfig, carries: Iterable[str]) -> dict[str, Any]:
    """{config.json key: value} of the carried features that have a key."""
    keys = features(ModelConfig)
    return {keys[name]: setting_value(config, name) for name in carries if isinstance(keys.get(name), str)}


def carried_settings(values: dict, carries: Iterable[str]) -> dict[str, FolderValue]:
    """{setting: its value in a folder's config.json} of the carried features that have a key."""
    keys = features(ModelConfig)
    return {name: FolderValue(values[keys[name]], keys[name]) for name in carries if isinstance(keys.get(name), str)}


def flag_for(name: str, value) -> str:
    """The flag (and value) that sets ModelConfig setting `name` to `value`."""
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
