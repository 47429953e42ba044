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

HELP, FLAGS, ALIASES, TYPE, CHOICES, METAVAR, NARGS, ACTION, GROUP, CONSTS = (
    "help", "flags", "aliases", "type", "choices", "metavar", "nargs", "action", "group", "consts")
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
           consts: Sequence[Const] = ()) -> Any:
    """A dataclass field that is a command-line flag.

    help: the --help text. flags: the option strings when they are not just `--field-name` (the first is
    the flag messages name; the others are spellings of it, parsed to the same value). aliases: other
    programs' names for the flag, {option: whose name it is} (`{"--batch-size": "DeepSpeed-Megatron"}`),
    said with the flag's value wherever it is shown (arguments/megatron/flags.py). type, choices, metavar,
    nargs, action: as argparse takes them, where the field's annotation does not say (see the module).
    group: the section whose --help group lists the flag, when that is not the field's own section.
    consts: other flags that each store one fixed value in this setting."""
    metadata = {name: value for name, value in ((HELP, help), (FLAGS, tuple(flags)), (ALIASES, dict(aliases or {})),
                                                (TYPE, type), (CHOICES, None if choices is None else tuple(choices)),
                                                (METAVAR, metavar), (NARGS, nargs), (ACTION, action),
                                                (GROUP, group), (CONSTS, tuple(consts)))
                if value not in (None, (), {})}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def flag_of(field: dataclasses.Field) -> str:
    """The flag a field is set with: its first declared flag, else `--field-name`."""
    return (field.metadata.get(FLAGS) or ("--" + field.name.replace("_", "-"),))[0]


def flag_of_setting(config_class: type, name: str) -> str:
    """The flag of the setting `name` of a config dataclass (`--zero-stage` for ZeroConfig's `stage`)."""
    return flag_of(next(f for f, _ in option_fields(config_class) if f.name == name))


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


def section(kind: type) -> Any:
    """A field holding one component's settings: `kind` is a frozen dataclass of `option()` fields whose class
    attribute SETTING_PREFIX (a `ClassVar[str]`) names its settings, `mtp_` + `num_layers` = `mtp_num_layers`. Each
    is a setting of the owner as if declared there: its flag, YAML key and recorded name are the prefixed name
    (option_fields, setting_values, with_settings), so moving settings into a section renames nothing outside."""
    return dataclasses.field(default_factory=kind, metadata={SECTION: True})


def option_fields(config_class: type) -> Iterator[tuple[dataclasses.Field, Any]]:
    """Each setting of a config dataclass with its resolved annotation; a section's in its place, each field a copy
    named as its setting (its flag's dest), so flag_of and argparse_keywords read it as any other."""
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        if field.metadata.get(SECTION):
            kind = field.default_factory
            for inner, annotation in option_fields(kind):
                named = copy.copy(inner)
                named.name = kind.SETTING_PREFIX + inner.name
                yield named, annotation
        else:
            yield field, hints[field.name]


@functools.lru_cache(maxsize=None)
def _setting_paths(config_class: type) -> dict[str, tuple[str, ...]]:
    """Each setting's name -> the attributes that reach it from a `config_class` instance."""
    paths: dict[str, tuple[str, ...]] = {}
    for field in dataclasses.fields(config_class):
        if field.metadata.get(SECTION):
            kind = field.default_factory
            for name, inner in _setting_paths(kind).items():
                paths[kind.SETTING_PREFIX + name] = (field.name, *inner)
        else:
            paths[field.name] = (field.name,)
    if len(paths) != sum(1 for _ in option_fields(config_class)):  # a section's name taken twice: one would hide
        raise TypeError(f"{config_class.__name__}: two settings share a name")
    return paths


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


def _grouped(config_class: type, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The keywords that construct `config_class` from {setting: value}: a section's settings as one section."""
    paths = _setting_paths(config_class)
    unknown = [name for name in values if name not in paths]
    if unknown:
        raise TypeError(f"{config_class.__name__} has no setting {unknown[0]!r}")
    keywords: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        path = paths[name]
        if len(path) == 1:
            keywords[name] = value
        else:
            sections.setdefault(path[0], {})[name[len(_prefix(config_class, path[0])):]] = value
    return keywords, sections


def _prefix(config_class: type, section_name: str) -> str:
    return next(f.default_factory.SETTING_PREFIX for f in dataclasses.fields(config_class) if f.name == section_name)


def with_settings(config_class: type, values: Mapping[str, Any]) -> Any:
    """A `config_class` built from {setting: value} (flags, YAML keys, a recorded config), the defaults for the rest."""
    keywords, sections = _grouped(config_class, values)
    kinds = {f.name: f.default_factory for f in dataclasses.fields(config_class) if f.metadata.get(SECTION)}
    return config_class(**keywords, **{name: with_settings(kinds[name], given) for name, given in sections.items()})


def replace_settings(config: Any, **changes: Any) -> Any:
    """dataclasses.replace by setting name: a section's settings change in their section."""
    keywords, sections = _grouped(type(config), changes)
    return dataclasses.replace(config, **keywords, **{
        name: replace_settings(getattr(config, name), **given) for name, given in sections.items()})


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
