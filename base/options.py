"""A setting's command-line flag, declared on its dataclass field with `option()`: help, flags and aliases sit beside
the field, and arguments/parser.py builds the parser from them. The type comes from the annotation; a `bool` is a
`--x/--no-x` pair."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import typing
from dataclasses import MISSING, dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

HELP, FLAGS, ALIASES, TYPE, CHOICES, METAVAR, NARGS, ACTION, GROUP, CONSTS, SETTING, FEATURE = (
    "help", "flags", "aliases", "type", "choices", "metavar", "nargs", "action", "group", "consts", "setting", "feature")
SECTION = "section"


@dataclass(frozen=True)
class Const:
    """Another flag storing one fixed value in the same setting (`--no-pad-vocab-size`)."""
    options: tuple[str, ...]
    value: Any
    help: Optional[str] = None


def option(default: Any = MISSING, *, default_factory: Any = MISSING, help: Optional[str] = None,
           flags: Sequence[str] = (), aliases: Optional[Mapping[str, str]] = None,
           type: Optional[Callable[[str], Any]] = None, choices: Optional[Sequence[Any]] = None,
           metavar: Any = None, nargs: Any = None, action: Optional[str] = None, group: Optional[str] = None,
           consts: Sequence[Const] = (), setting: Optional[str] = None, feature: Any = None) -> Any:
    """A dataclass field that is a command-line flag.

    flags: option strings other than `--field-name` (the first is the one messages name). aliases: {other program's
    option: whose name}. consts: flags storing a fixed value here. setting: the whole name where it is not the section
    prefix + field name. feature: a block feature a model file must record (its config.json key, or True)."""
    metadata = {name: value for name, value in ((HELP, help), (FLAGS, tuple(flags)), (ALIASES, dict(aliases or {})),
                                                (TYPE, type), (CHOICES, None if choices is None else tuple(choices)),
                                                (METAVAR, metavar), (NARGS, nargs), (ACTION, action),
                                                (GROUP, group), (CONSTS, tuple(consts)), (SETTING, setting),
                                                (FEATURE, feature))
                if value not in (None, (), {})}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def flag_of(field: dataclasses.Field) -> str:
    return (field.metadata.get(FLAGS) or ("--" + field.name.replace("_", "-"),))[0]


def flag_of_setting(config_class: type, name: str) -> str:
    """The flag of setting `name` of a config dataclass."""
    return flag_of(next(f for f, _ in option_fields(config_class) if f.name == name))


def features(config_class: type) -> dict[str, Any]:
    """{setting: its feature} for every setting declared a feature."""
    return {field.name: field.metadata[FEATURE] for field, _ in option_fields(config_class) if FEATURE in field.metadata}


def option_strings(field: dataclasses.Field) -> tuple[str, ...]:
    return (*(field.metadata.get(FLAGS) or (flag_of(field),)), *field.metadata.get(ALIASES, {}))


def aliases(field: dataclasses.Field) -> dict[str, str]:
    return dict(field.metadata.get(ALIASES, {}))


def consts(field: dataclasses.Field) -> tuple[Const, ...]:
    return field.metadata.get(CONSTS, ())


def group_of(field: dataclasses.Field, own_section: str) -> str:
    return field.metadata.get(GROUP, own_section)


def _value_type(annotation: Any) -> Any:
    if typing.get_origin(annotation) is typing.Union:
        kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
        if len(kinds) == 1:
            return kinds[0]
    return annotation


def argparse_keywords(field: dataclasses.Field, annotation: Any, default: Any) -> dict[str, Any]:
    """The add_argument keywords for a field's flag, given its resolved annotation and default."""
    metadata = field.metadata
    kind = _value_type(annotation)
    keywords: dict[str, Any] = {"dest": field.name, "default": default}
    if kind is bool:
        keywords["action"] = metadata.get(ACTION, argparse.BooleanOptionalAction)
    else:
        if ACTION in metadata:
            keywords["action"] = metadata[ACTION]
        value_type = metadata.get(TYPE, kind if kind in (int, float) else None)
        if value_type is not None:
            keywords["type"] = value_type
        for name in (CHOICES, NARGS, METAVAR):
            if name in metadata:
                keywords[name] = metadata[name]
    keywords["help"] = metadata.get(HELP)
    return keywords


def add_setting_flag(parser: argparse.ArgumentParser, config_class: type, name: str) -> None:
    """Add a training setting's flag to another tool's parser, parsed exactly as training parses it."""
    field, annotation = next((f, a) for f, a in option_fields(config_class) if f.name == name)
    default = field.default if field.default is not MISSING else field.default_factory()
    parser.add_argument(*option_strings(field), **argparse_keywords(field, annotation, default))


def section(kind: type) -> Any:
    """A field holding a component's settings: a frozen dataclass whose SETTING_PREFIX prefixes its names, so the flag
    and YAML key are `mtp_num_layers`."""
    return dataclasses.field(default_factory=kind, metadata={SECTION: True})


def option_fields(config_class: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    """Each setting of a config dataclass with its resolved annotation, section fields renamed to their setting."""
    yield from _option_fields(config_class)


@functools.lru_cache(maxsize=None)
def _option_fields(config_class: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    named = []
    for (field, annotation), (name, _) in zip(_leaf_fields(config_class), _setting_paths(config_class).items()):
        if field.name != name:
            field = copy.copy(field)
            field.name = name
        named.append((field, annotation))
    return tuple(named)


def _leaf_fields(config_class: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        if field.metadata.get(SECTION):
            yield from _leaf_fields(field.default_factory)
        else:
            yield field, hints[field.name]


@functools.lru_cache(maxsize=None)
def _setting_paths(config_class: type) -> dict[str, tuple[str, ...]]:
    """Each setting's name -> the attribute path reaching it, in declaration order."""
    paths: dict[str, tuple[str, ...]] = {}
    count = 0
    for field in dataclasses.fields(config_class):
        if field.metadata.get(SECTION):
            kind = field.default_factory
            for name, inner in _setting_paths(kind).items():
                whole = name if _named_whole(kind, inner) else kind.SETTING_PREFIX + name
                paths[whole] = (field.name, *inner)
                count += 1
        else:
            paths[field.metadata.get(SETTING, field.name)] = (field.name,)
            count += 1
    if len(paths) != count:
        raise TypeError(f"{config_class.__name__}: two settings share a name")
    return paths


def _named_whole(kind: type, path: tuple[str, ...]) -> bool:
    for name in path[:-1]:
        kind = next(f.default_factory for f in dataclasses.fields(kind) if f.name == name)
    return SETTING in next(f for f in dataclasses.fields(kind) if f.name == path[-1]).metadata


def setting_names(config_class: type) -> tuple[str, ...]:
    """Every setting of a config dataclass by name, its sections' included."""
    return tuple(_setting_paths(config_class))


def setting_value(config: Any, name: str) -> Any:
    """The setting `name` of a config dataclass instance, in whichever section holds it."""
    value = config
    for attribute in _setting_paths(type(config))[name]:
        value = getattr(value, attribute)
    return value


def setting_values(config: Any) -> dict[str, Any]:
    """{setting: value} of a config dataclass instance, its sections' settings in their place."""
    return {name: setting_value(config, name) for name in _setting_paths(type(config))}


def _by_field(config_class: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """{setting: value} as a tree of field names: {field: value}, a section's {field: {its field: value}}."""
    paths = _setting_paths(config_class)
    unknown = [name for name in values if name not in paths]
    if unknown:
        raise TypeError(f"{config_class.__name__} has no setting {unknown[0]!r}")
    tree: dict[str, Any] = {}
    for name, value in values.items():
        *sections, field = paths[name]
        node = tree
        for section_name in sections:
            node = node.setdefault(section_name, {})
        node[field] = value
    return tree


def _built(config_class: type, tree: Mapping[str, Any]) -> Any:
    kinds = {f.name: f.default_factory for f in dataclasses.fields(config_class) if f.metadata.get(SECTION)}
    return config_class(**{name: _built(kinds[name], value) if name in kinds else value for name, value in tree.items()})


def _replaced(config: Any, tree: Mapping[str, Any]) -> Any:
    sections = {f.name for f in dataclasses.fields(config) if f.metadata.get(SECTION)}
    return dataclasses.replace(config, **{name: _replaced(getattr(config, name), value) if name in sections else value
                                          for name, value in tree.items()})


def with_settings(config_class: type, values: Mapping[str, Any]) -> Any:
    """A `config_class` built from {setting: value} (flags, YAML keys, a recorded config), the defaults for the rest."""
    return _built(config_class, _by_field(config_class, values))


def replace_settings(config: Any, **changes: Any) -> Any:
    """dataclasses.replace by setting name: a section's settings change in their section."""
    return _replaced(config, _by_field(type(config), changes))


def count(text: str) -> int:
    """An element count: a whole number, also written as 5e8."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"invalid count {text!r} (a whole number such as 500000000 or 5e8)")
    return int(value)
