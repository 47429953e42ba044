"""A setting's command-line flag, declared on its dataclass field.

    num_layers: int = option(4, help="transformer blocks", aliases={"--encoder-num-layers": "Megatron-LM"})

is `dataclasses.field(default=4, metadata={...})`: the help text and everything argparse needs beyond
the field's name and type sit beside the field, and arguments/parser.py builds the parser by walking
PretrainConfig's sections (as Megatron-Core's argument_utils builds groups from dataclass fields;
torchtitan's job_config likewise keeps each option's help beside its field). A field declared without
`option()` is a flag too, with no help.

What `option()` leaves out is read from the field:

- the flag: `--field-name` (`flags` gives others, the first being the flag messages name);
- the value's type: `int` or `float` from the annotation (`Optional[int]` is int), text otherwise;
- a `bool` field is a `--x/--no-x` pair (argparse.BooleanOptionalAction); `action="store_true"` makes
  it a switch that only turns on.

This module imports nothing of ours, so the config dataclasses of every floor (zero/, gpt/, arguments/)
can use it.
"""

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
    """Another flag that stores one fixed value in the same setting: `--no-pad-vocab-size` is
    `--make-vocab-size-divisible-by 1`."""
    options: tuple[str, ...]
    value: Any
    help: Optional[str] = None


def option(default: Any = MISSING, *, default_factory: Any = MISSING, help: Optional[str] = None,
           flags: Sequence[str] = (), aliases: Optional[Mapping[str, str]] = None,
           type: Optional[Callable[[str], Any]] = None, choices: Optional[Sequence[Any]] = None,
           metavar: Any = None, nargs: Any = None, action: Optional[str] = None, group: Optional[str] = None,
           consts: Sequence[Const] = (), setting: Optional[str] = None, feature: Any = None) -> Any:
    """A dataclass field that is a command-line flag.

    help: the --help text. flags: the option strings when they are not just `--field-name` (the first is
    the flag messages name; the others are spellings of it, parsed to the same value). aliases: other
    programs' names for the flag, {option: whose name it is} (`{"--batch-size": "DeepSpeed-Megatron"}`),
    said with the flag's value wherever it is shown (arguments/megatron/flags.py). type, choices, metavar,
    nargs, action: as argparse takes them, where the field's annotation does not say (see the module).
    group: the section whose --help group lists the flag, when that is not the field's own section.
    consts: other flags that each store one fixed value in this setting. setting: in a section, the setting's whole
    name where it is not the section's prefix + the field's name (MoESettings' num_experts, not moe_num_experts).
    feature: the setting is a block feature, math that a model file must hold once it differs from the default: the
    config.json key of the Hugging Face families that carry it, or True where they carry it each their own way."""
    metadata = {name: value for name, value in ((HELP, help), (FLAGS, tuple(flags)), (ALIASES, dict(aliases or {})),
                                                (TYPE, type), (CHOICES, None if choices is None else tuple(choices)),
                                                (METAVAR, metavar), (NARGS, nargs), (ACTION, action),
                                                (GROUP, group), (CONSTS, tuple(consts)), (SETTING, setting),
                                                (FEATURE, feature))
                if value not in (None, (), {})}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def flag_of(field: dataclasses.Field) -> str:
    """The flag a field is set with: its first declared flag, else `--field-name`."""
    return (field.metadata.get(FLAGS) or ("--" + field.name.replace("_", "-"),))[0]


def flag_of_setting(config_class: type, name: str) -> str:
    """The flag of the setting `name` of a config dataclass (`--zero-stage` for ZeroConfig's `stage`)."""
    return flag_of(next(f for f, _ in option_fields(config_class) if f.name == name))


def features(config_class: type) -> dict[str, Any]:
    """{setting: its `feature` (a config.json key, or True)} of every setting of a config dataclass declared a feature."""
    return {field.name: field.metadata[FEATURE] for field, _ in option_fields(config_class) if FEATURE in field.metadata}


def option_strings(field: dataclasses.Field) -> tuple[str, ...]:
    """Every option string of a field's flag: its flags, then the other programs' names (aliases)."""
    return (*(field.metadata.get(FLAGS) or (flag_of(field),)), *field.metadata.get(ALIASES, {}))


def aliases(field: dataclasses.Field) -> dict[str, str]:
    """The other programs' names for a field's flag: {option: whose name it is}."""
    return dict(field.metadata.get(ALIASES, {}))


def consts(field: dataclasses.Field) -> tuple[Const, ...]:
    return field.metadata.get(CONSTS, ())


def group_of(field: dataclasses.Field, own_section: str) -> str:
    """The section whose --help group lists a field's flag."""
    return field.metadata.get(GROUP, own_section)


def _value_type(annotation: Any) -> Any:
    """`Optional[X]` is X; anything else as it is."""
    if typing.get_origin(annotation) is typing.Union:
        kinds = [kind for kind in typing.get_args(annotation) if kind is not type(None)]
        if len(kinds) == 1:
            return kinds[0]
    return annotation


def argparse_keywords(field: dataclasses.Field, annotation: Any, default: Any) -> dict[str, Any]:
    """The add_argument keywords of a field's flag, but its option strings: `annotation` is the field's
    resolved type (typing.get_type_hints), `default` its default value."""
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
    """Add the setting `name` of a config dataclass to another program's parser, with the flag, type, choices and
    default the training program gives it, so a tool that takes a training flag reads it exactly as training does."""
    field, annotation = next((f, a) for f, a in option_fields(config_class) if f.name == name)
    default = field.default if field.default is not MISSING else field.default_factory()
    parser.add_argument(*option_strings(field), **argparse_keywords(field, annotation, default))


def section(kind: type) -> Any:
    """A field holding one component's settings: `kind` is a frozen dataclass of `option()` fields whose class
    attribute SETTING_PREFIX (a `ClassVar[str]`) names its settings, `mtp_` + `num_layers` = `mtp_num_layers`. Each
    is a setting of the owner as if declared there: its flag, YAML key and recorded name are the prefixed name
    (option_fields, setting_values, with_settings), so moving settings into a section renames nothing outside."""
    return dataclasses.field(default_factory=kind, metadata={SECTION: True})


def option_fields(config_class: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    """Each setting of a config dataclass with its resolved annotation; a section's in its place, each field a copy
    named as its setting (its flag's dest), so flag_of and argparse_keywords read it as any other."""
    yield from _option_fields(config_class)


@functools.lru_cache(maxsize=None)
def _option_fields(config_class: type) -> tuple[tuple[dataclasses.Field, Any], ...]:
    """option_fields, read once a class: resolving the annotations (typing.get_type_hints) was a sixth of a parse."""
    named = []
    for (field, annotation), (name, _) in zip(_leaf_fields(config_class), _setting_paths(config_class).items()):
        if field.name != name:
            field = copy.copy(field)
            field.name = name
        named.append((field, annotation))
    return tuple(named)


def _leaf_fields(config_class: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    """Each setting's own field (a section's field as its section declares it) with its resolved annotation."""
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        if field.metadata.get(SECTION):
            yield from _leaf_fields(field.default_factory)
        else:
            yield field, hints[field.name]


@functools.lru_cache(maxsize=None)
def _setting_paths(config_class: type) -> dict[str, tuple[str, ...]]:
    """Each setting's name -> the attributes that reach it from a `config_class` instance, in declaration order. A
    section's setting is its prefix + its name there, but a field's own `setting=` name, which no prefix changes."""
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
    if len(paths) != count:  # a section's name taken twice: one would hide the other
        raise TypeError(f"{config_class.__name__}: two settings share a name")
    return paths


def _named_whole(kind: type, path: tuple[str, ...]) -> bool:
    """Whether the field at `path` in a `kind` instance gives its own whole setting name (option's `setting=`)."""
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
