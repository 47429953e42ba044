"""Megatron-style command-line flags over a YAML preset, parsed into one validated PretrainConfig. The layers are preset
< DeepSpeed JSON (--zero-config) < command line, except where the real Megatron-DeepSpeed + DeepSpeed pair lets the JSON
win; every value keeps its source, and every layer's problems are reported together."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from arguments.batch_schedule import deepspeed_batch_fits_no_size, json_batch_settings_not_used
from arguments.config import ConfigError, PretrainConfig
from arguments.config_sources import (
    DEFAULT,
    FLAG,
    FOLDER,
    JSON,
    MEGATRON_DEFAULTS,
    PRESET,
    Source,
    every_option_typed,
    in_the_typed_spelling,
    name_inherited_values,
    options_typed,
    show_value,
    values_set_by,
)
from arguments.deepspeed.client_objects import NotRead, set_aside_client_blocks
from arguments.deepspeed.clipping import apply_json_clipping
from arguments.deepspeed.differences import NOT_READ_UNDER_DEEPSPEED, UnusedJsonValue, difference_lines
from arguments.deepspeed.keys import precedence_of
from arguments.deepspeed.loss_scale import apply_json_loss_scaling
from arguments.deepspeed.precedence import INDEPENDENT, JSON_WINS, MUST_AGREE
from arguments.deepspeed.translation import DeepSpeedTranslation, load_deepspeed_config, resolve_zero_config
from arguments.flag_equivalents import unknown_flags_message
from arguments.hf_folder import folder_layer
from arguments.megatron.alcf import alcf_notes, alcf_problems
from arguments.megatron.deepspeed_checkpointing_flags import drop_unswitched_checkpointing_flags
from arguments.megatron.defaults import (
    equally_fitting_generations,
    file_format_note,
    is_megatron_launch,
    megatron_default_argv,
    megatron_default_note,
    null_tokenizer_note,
)
from arguments.megatron.flag_classes import is_deepspeed_moe_launch
from arguments.megatron.flags import (
    MEANING_DESTS,
    RefusedFlags,
    Resolved,
    add_meanings,
    add_spellings,
    aliases_of,
    describe_alias,
    resolve_meanings,
)
from arguments.megatron.harvested_flags import add_harvested, classified_options, harvested
from arguments.megatron.hybrid_layer_pattern import apply_hybrid_pattern
from arguments.megatron.limited_devices import apply_limited_devices
from arguments.option_table import OptionTable, option_table, stores_a_constant
from arguments.run_lengths import check_run_lengths, use_sample_based_lengths
from base.errors import CheckpointError, OneLineArgumentParser
from base.input_files import irregularity, read_text_file
from base.options import argparse_keywords, consts, group_of, option_fields, option_strings, setting_value
from gpt.moe.settings import largest_expert_count

PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "models"
DEFAULT_PRESET = "tiny"


# Flags that choose where settings come from, or what the program does; they are not settings.
SOURCE_FLAGS = ("config", "zero_config", "print_config")
HARVESTED_DESTS = tuple(classified_options())
NOT_SETTINGS = SOURCE_FLAGS + MEANING_DESTS + HARVESTED_DESTS
_NOT_SETTINGS = frozenset(NOT_SETTINGS + ("help",))


# --help's groups in order, each named by its section; another section's field that names the group
# (`option(group=...)`) follows the group's own.
GROUPS = (("model", "model"), ("optimizer", "optimizer and learning-rate schedule"), ("training", "training"),
          ("parallel", "parallelism (tensor, sequence, pipeline)"), ("data", "data and tokenizer"),
          ("logging", "logging"), ("checkpoint", "checkpoints, resume and preemption"),
          ("zero", "ZeRO and mixed precision"), ("activations", "activation checkpointing (ZeRO-R)"))


def build_parser() -> argparse.ArgumentParser:
    """Every setting's flag from PretrainConfig's fields (`option()`, base/options.py), then the flags that are not
    settings: the sources, Megatron's meanings and the harvested flags."""
    defaults = PretrainConfig()
    parser = FreshDefaultsParser(prog="pretrain_gpt.py", description="Pretrain a GPT (Megatron-style flags).",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False,
                                 add_help=False)
    table = parser.option_table = OptionTable()
    table.add(parser, "-h", "--help", action="help", help="show this help message and exit")
    table.add(parser, "--config", default=DEFAULT_PRESET,
                        help=f"YAML preset: a name in configs/models ({', '.join(preset_names())}; the ZeRO "
                             "paper's Table 4 models as zero_paper/NAME) or a path")
    table.add(parser, "--print-config", action="store_true",
                        help="print every setting with its value and where it came from (default, preset, JSON, "
                             "flag), then exit without training")
    groups = {section: parser.add_argument_group(title) for section, title in GROUPS}
    shown_in: dict[str, list] = {section: [] for section in groups}  # group -> (a guest?, field, type, default)
    for section in defaults.SECTIONS:
        values = getattr(defaults, section)
        for setting, annotation in option_fields(type(values)):
            shown = group_of(setting, section)
            if shown not in groups:
                raise ValueError(f"{section}.{setting.name}: option(group={shown!r}) names no section")
            shown_in[shown].append((shown != section, setting, annotation, setting_value(values, setting.name)))
    for section, group in groups.items():
        if section == "zero":
            add_zero_config(group, table)
        for _, setting, annotation, default in sorted(shown_in[section], key=lambda entry: entry[0]):
            add_setting(group, table, setting, annotation, default)
    add_meanings(parser)
    add_harvested(parser)
    parser.mutable_defaults = tuple(action for action in table if isinstance(action.default, (list, dict, set)))
    return parser


class FreshDefaultsParser(OneLineArgumentParser):
    """Hands each parse its own copy of a mutable default (--data-path's []): argparse shares the default object, and
    one parser serves every parse of a process."""

    mutable_defaults: tuple[argparse.Action, ...] = ()

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self.mutable_defaults:
            if getattr(namespace, action.dest, None) is action.default:
                setattr(namespace, action.dest, copy.deepcopy(action.default))
        return namespace, extras


def shared_parser() -> argparse.ArgumentParser:
    """build_parser()'s parser, built once per process (building is most of a short parse); a parse leaves it as built.
    A preset or DeepSpeed config added on disk gives a new one, for --help's listing."""
    return _parser_listing(tuple(preset_names()), tuple(zero_config_names()))


@functools.lru_cache(maxsize=1)
def _parser_listing(presets: tuple[str, ...], zero_configs: tuple[str, ...]) -> argparse.ArgumentParser:
    """Cached by the presets and DeepSpeed configs --help lists."""
    return build_parser()


def add_zero_config(group, table: OptionTable) -> None:
    """--zero-config, where settings come from, first in the ZeRO group."""
    table.add(
        group, "--zero-config", *aliases_of("--zero-config"), metavar="FILE.json",
        help="a DeepSpeed config JSON (a path, or a name in configs/zero: "
             f"{', '.join(zero_config_names())}); every key is honoured as a flag, accepted with no effect on the "
             "math, or refused with the alternative (arguments/deepspeed/keys.py). YAML preset < this file < "
             "command-line flags, except where the file wins in Megatron-DeepSpeed + DeepSpeed "
             "(arguments/deepspeed/precedence.py)")


def add_setting(group, table: OptionTable, setting: dataclasses.Field, annotation: Any, default: Any) -> None:
    """A setting's flag and aliases, then the flags that store one value in it (`option(consts=...)`, Megatron's
    spellings)."""
    table.add(group, *option_strings(setting), **argparse_keywords(setting, annotation, default))
    for const in consts(setting):
        table.add(group, *const.options, dest=setting.name, action="store_const", const=const.value,
                  help=const.help)
    add_spellings(group, table, setting.name)


def preset_names() -> list[str]:
    return sorted(path.stem for path in PRESET_DIR.glob("*.yaml"))


def zero_config_names() -> list[str]:
    return sorted(path.stem for path in (PRESET_DIR.parent / "zero").glob("*.json"))


def resolve_preset(name_or_path: str) -> Path:
    """A YAML path, or a preset's name in configs/models (`zero_paper/100b-125x8192` too)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        candidates = [path]
    elif path.parent == Path("."):
        candidates = [PRESET_DIR / f"{name_or_path}.yaml"]
    else:
        candidates = [path] + ([] if path.is_absolute() else [PRESET_DIR / f"{name_or_path}.yaml"])
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    if path.exists():  # a directory, a FIFO or a device: say which
        raise ConfigError(f"--config {name_or_path}: {irregularity(path)}; give a preset's name or a YAML file")
    raise ConfigError(f"--config {name_or_path}: no such preset file ({candidates[-1]}); "
                      f"presets: {', '.join(preset_names())}")


def preset_label(path: Path) -> str:
    """A preset as a user would name it: `tiny (configs/models/tiny.yaml)`, or its path."""
    if path.resolve().parent == PRESET_DIR:
        return f"{path.stem} (configs/models/{path.name})"
    return str(path)


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load refusing a key given twice in one mapping (`num_layers` beside `num-layers` too), where PyYAML
    keeps the last."""

    def construct_mapping(self, node, deep=False):
        seen: dict[str, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            name = str(key).replace("-", "_")
            if name in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is given twice (also as {seen[name]!r}); keep one", key_node.start_mark)
            seen[name] = key
        return super().construct_mapping(node, deep=deep)


def read_preset(path: Path) -> Any:
    """A preset's YAML; every way it is unreadable is a ConfigError naming it."""
    text = read_text_file(path, "--config")
    try:
        return yaml.load(text, Loader=UniqueKeyLoader) or {}
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a preset (a preset is a flat mapping)") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({error})") from None


def preset_to_flags(preset: dict[str, Any], parser: argparse.ArgumentParser, source: Path) -> list[str]:
    """A flat YAML mapping as the equivalent flags. A key is a flag's name (`zero_stage`, `zero-stage`) or its setting's
    (`stage`)."""
    flags = {}
    for action in option_table(parser):
        if action.option_strings and action.dest not in _NOT_SETTINGS:
            # a setting's own flag comes first, not one that stores a value in it (--no-pad-vocab-size)
            flags.setdefault(action.dest, action)
            for option in action.option_strings:
                if not (isinstance(action, argparse.BooleanOptionalAction) and option.startswith("--no-")):
                    flags[option[2:].replace("-", "_")] = action
    argv: list[str] = []
    for key, value in preset.items():
        name = str(key).replace("-", "_")
        if name in SOURCE_FLAGS:
            raise ConfigError(f"{source}: {key} cannot be set in a preset; pass --{name.replace('_', '-')} "
                              f"on the command line")
        if name not in flags:
            raise ConfigError(f"{source}: unknown key {key!r} (keys are flag names, e.g. num_layers)")
        option = flags[name].option_strings[0]
        if value is None:
            continue
        if isinstance(flags[name], argparse.BooleanOptionalAction):
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
            argv.append(option if value else "--no-" + option[2:])
        elif stores_a_constant(flags[name]) and flags[name].const is True:  # a switch (--swiglu)
            if not isinstance(value, bool):
                raise ConfigError(f"{source}: {key} must be true or false, got {value!r}")
            argv += [option] if value else []
        elif isinstance(value, list):
            argv += [option, *map(str, value)]
        else:  # one token, so -1e-3 is not taken for a flag
            argv.append(f"{option}={value}")
    return argv


@dataclass(frozen=True)
class ParsedArguments:
    config: PretrainConfig  # validated, with each value's source
    notes: tuple[str, ...]  # said once at start-up
    print_config: bool
    deepspeed: Optional[DeepSpeedTranslation]  # the JSON's classification
    preset: str  # as `preset_label` names it
    meanings: dict[str, Any]  # the Megatron-meaning flags given
    harvested: dict[str, Any] = None  # the other Megatron/DeepSpeed flags given
    # JSON key -> what became of it beside the command line
    json_outcomes: dict[str, str] = field(default_factory=dict)
    # the harvested Megatron argument file the flags belong to
    megatron_generation: Optional[str] = None


def parse_config(argv: Optional[Sequence[str]] = None) -> PretrainConfig:
    """CLI flags over a YAML preset -> a validated PretrainConfig (see `parse_arguments`)."""
    return parse_arguments(argv).config


def parse_arguments(argv: Optional[Sequence[str]] = None,
                    late_checks: Sequence[Callable[[PretrainConfig], None]] = ()) -> ParsedArguments:
    """The layers parsed into one validated config with every value's source. Every problem found (unknown flags, bad
    JSON keys or values, refused Megatron flags, an invalid result, and the entry point's `late_checks` of what is on
    disk, skipped for --print-config) is raised in one ConfigError, so one edit round fixes a script."""
    parser = shared_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    problems, argv = _invalid_choices(argv, option_table(parser))
    known, unknown = parser.parse_known_args(argv)
    if unknown:
        problems.append(unknown_flags_message(unknown, parser))
        argv = _without(argv, unknown)
    translation = None
    fitting = equally_fitting_generations(argv, harvested()["flags"], harvested()["sources"])
    generation = fitting[0] if fitting else None
    not_read = NotRead("")  # no JSON: nothing set aside
    if known.zero_config:
        translation = load_deepspeed_config(resolve_zero_config(known.zero_config), collect=True)
        # the blocks the real pair does not read under a Megatron launch are set aside before the JSON is checked
        megatron_launch = is_megatron_launch("config" in options_typed(parser, argv), values_set_by(parser, argv))
        not_read = set_aside_client_blocks(translation, megatron_launch, generation,
                                           bool(known.deepspeed_activation_checkpointing),
                                           bool(known.checkpoint_activations), also_fitting=fitting[1:],
                                           deepspeed=bool(known.deepspeed))
        problems += translation.problems
        try:  # the JSON's own errors, named with its file
            json_only = PretrainConfig.from_flat(_settings(vars(parser.parse_args(translation.argv))))
            json_only.zero.validate()
            json_only.activations.validate()
            # a JSON batch value a flag overrides is still refused
            json_only.training.validate()
        except ConfigError as error:
            problems.append(f"{translation.source}: {error}")
            translation.settings = []
    json_argv = translation.argv if translation is not None else []
    preset_path = resolve_preset(known.config)
    dests_given = set(values_set_by(parser, argv)) | _json_dests_kept(parser, translation, argv, bool(known.deepspeed))
    megatron_launch = is_megatron_launch("config" in options_typed(parser, argv), dests_given)
    if megatron_launch:
        # Megatron's defaults, of the flags' generation, stand where a preset would
        preset_argv = megatron_default_argv(parser, _settings(vars(parser.parse_args([]))), harvested()["flags"],
                                            dests_given, generation)
        preset_name = MEGATRON_DEFAULTS
    else:
        preset = read_preset(preset_path)
        if not isinstance(preset, dict):
            raise ConfigError(f"{preset_path}: a preset must be a mapping of flag names to values")
        preset_argv = preset_to_flags(preset, parser, preset_path)
        preset_name = preset_label(preset_path)
    try:
        parser.parse_args(preset_argv)
    except ConfigError as error:
        raise ConfigError(f"{preset_name}: {error}", flags=error.flags) from None

    namespace = vars(parser.parse_args(preset_argv + json_argv + argv))
    layers = layer_sources(parser, preset_name, preset_argv, translation, argv, bool(known.deepspeed))
    namespace.update(layers.values)
    problems += layers.problems
    sources = layers.sources
    settings = _settings(dict(namespace))
    meanings = {dest: namespace[dest] for dest in MEANING_DESTS}
    typed = options_typed(parser, argv)
    try:
        resolved = resolve_meanings(meanings, settings, sources, typed.get, _harvested_given(namespace))
    except RefusedFlags as error:  # the accepted ones still apply
        problems.append(str(error))
        resolved = error.resolved
    except ConfigError as error:
        problems.append(str(error))
        resolved = Resolved()
    for name, (value, source) in resolved.changes.items():
        settings[name], sources[name] = value, source
    scaler_warning = apply_json_loss_scaling(translation, settings, sources, typed)
    clipping_warning, clipping_note = apply_json_clipping(translation, settings, sources, typed, generation)
    checkpointing_warning = drop_unswitched_checkpointing_flags(
        settings, sources, typed.get, megatron_launch, bool(meanings["deepspeed"]),
        bool(meanings["deepspeed_activation_checkpointing"]))
    not_read_warning, said = not_read.warning(lambda flags: _flag_values(parser, flags), settings, sources)
    folder_problems, folder_notes = apply_folder_layer(parser, settings, sources)
    problems += folder_problems
    problems += check_run_lengths(settings, sources)
    use_sample_based_lengths(settings, sources)
    deepspeed_batch = ({"source": translation.source, **translation.batch}
                       if translation is not None and translation.batch else {})
    dense_notes = []
    if largest_expert_count(settings.get("num_experts")) is None \
            and settings.get("expert_tensor_parallel_size") not in (None, 1):
        # it shapes only the experts' grid; Megatron-LM's dense functional tests give it
        dense_notes.append(f"--expert-tensor-parallel-size {settings['expert_tensor_parallel_size']}: no effect "
                           f"on a dense model (no --num-experts), as in Megatron-LM")
        settings["expert_tensor_parallel_size"] = None
    pattern_problems, pattern_notes = apply_hybrid_pattern(
        settings, sources, every_option_typed(parser, argv).get("hybrid_layer_pattern", []))
    problems += pattern_problems
    dense_notes += pattern_notes
    limited_problem, limited_note = apply_limited_devices(settings, sources)
    problems += [limited_problem] if limited_problem else []
    dense_notes += [limited_note] if limited_note else []
    if is_deepspeed_moe_launch(settings.get("num_experts"), generation, bool(meanings["deepspeed"])) \
            and sources["moe_gating"].kind == DEFAULT:
        settings["moe_gating"] = "deepspeed"
        sources["moe_gating"] = Source(FLAG, "--num-experts", note="a Megatron-DeepSpeed launch "
                                       "(--deepspeed): DeepSpeed-MoE's gating")
    if typed.get("moe_token_dropping") == "--moe-token-dropping" and largest_expert_count(settings.get("num_experts")) \
            and settings.get("moe_gating") != "deepspeed":
        problems.append("--moe-token-dropping with Megatron-Core's router: llm-jp's Megatron-LM fork asserts it off "
                        "(unsupported there); drop tokens with --moe-expert-capacity-factor, or drop the flag")
    unused = layers.unused + not_read.unused(lambda flags: _flag_values(parser, flags))
    differences = difference_lines(unused, settings, sources, translation.source) if translation is not None else ()
    config = PretrainConfig.from_flat(settings, sources, deepspeed_batch, differences)
    if deepspeed_batch:
        unfit = deepspeed_batch_fits_no_size(config.deepspeed_batch)
        if unfit:
            problems.append(unfit)
    try:
        config.validate()
    except ConfigError as error:
        problems.append(str(name_inherited_values(in_the_typed_spelling(error, parser, typed), parser, sources,
                                                  settings.get)))
    problems += alcf_problems(argv, config, generation, megatron_launch, "--ds_fused_adam" in _harvested_given(namespace))
    if not namespace["print_config"]:
        for check in late_checks:
            try:
                check(config)
            except (ConfigError, CheckpointError) as error:
                problems.append(str(error))
    if problems:
        raise ConfigError(one_error(problems))
    notes = list(resolved.notes) + folder_notes + dense_notes
    default_note = megatron_default_note(parser, settings, sources, "config" in typed, harvested()["flags"],
                                         generation)
    if default_note:
        notes.append(default_note)
    format_default_note = file_format_note(parser, settings, sources, "config" in typed, harvested()["flags"],
                                           generation)
    if format_default_note:
        notes.append(format_default_note)
    if translation is not None and translation.info_line(frozenset(said)):
        notes.append(translation.info_line(frozenset(said)))
    notes += layers.said_once(translation.source if translation is not None else "")
    notes += [line for line in (clipping_note, scaler_warning, clipping_warning, checkpointing_warning,
                                not_read_warning) if line]
    if config.training.eval_iters < 0:
        notes.append(f"> --eval-iters {config.training.eval_iters}: no validation or test, as Megatron-LM runs none "
                     f"where --eval-iters <= 0")
    if config.data.fim.fim_data:
        notes.append("> --fim-data: each sample's fill-in-the-middle draws come from a RandomState seeded with (--seed, "
                     "its index), so a resume or any --num-workers reads the same samples; Megatron-LM draws from one "
                     "stream per dataset in reading order, so which samples it permutes differs (docs/data.md)")
    null_note = null_tokenizer_note(config.data.tokenizer_type, config.model.vocab_size, generation,
                                    loading=bool(config.checkpoint.load))
    if null_note and not config.data.newer_null_tokenizer:  # the flags name core_v0.18's reading
        notes.append(null_note)
    if config.model.moe is not None and config.model.moe.deepspeed.use_residual:
        notes.append("> --mlp-type residual: the residual MoE's coefficient Linear(hidden, 2) is drawn "
                     "normal(--init-method-std) with a zero bias, as every weight here; DeepSpeed-MoE keeps torch's "
                     "default uniform draw")
    for line in (config.checkpoint.unwritten_format_note(), config.megatron_format_unwritten(),
                 config.split_unread_note()):
        if line:
            notes.append(line)
    notes += alcf_notes(argv, config)
    flex = config.parallel.flex_note(config.model.moe is not None)
    if flex:
        notes.append(flex)
    window = config.model.attention.window_size
    if window is not None and window[0] >= 0 and window[1] != 0:
        notes.append(f"> --window-size {window[0]},{window[1]}: attention is causal, so a query sees no key after it "
                     f"(the window's right side is 0, as Transformer Engine sets it for a causal mask)")
    if config.checkpoint.save_interval and not config.checkpoint.save:
        notes.append(f"> --save-interval {config.checkpoint.save_interval} without --save: nothing is saved, as in "
                     f"Megatron-LM, which saves only where --save names a folder")
    given = {dest: value for dest, value in meanings.items() if value is not None and value is not False}
    return ParsedArguments(config, tuple(notes), bool(namespace["print_config"]), translation,
                           preset_name, given, harvested=_harvested_given(namespace),
                           json_outcomes=layers.outcomes, megatron_generation=generation)


def apply_folder_layer(parser: argparse.ArgumentParser, settings: dict[str, Any], sources: dict[str, Source]
                       ) -> tuple[list[str], list[str]]:
    """--init-from-hf DIR: the folder's architecture and tokenizer replace the preset's or the defaults; a flag or JSON
    value must equal the folder's. Read with the flags, so a folder that does not fit is refused before any work.
    Returns (problems, start-up lines)."""
    folder = settings.get("init_from_hf")
    if not folder:
        return [], []
    explicit = {name: _as_given(parser, name, settings[name], source) for name, source in sources.items()
                if source.kind in (FLAG, JSON) and name in settings}
    try:
        layer = folder_layer(folder, settings, explicit, lambda name, value: _as_flag(parser, name, value))
    except ConfigError as error:
        return [str(error)], []
    for name, (value, origin, note) in layer.values.items():
        settings[name], sources[name] = value, Source(FOLDER, origin, note=note)
    for name, origin in layer.agreeing.items():
        if not sources[name].agrees_with:
            sources[name] = dataclasses.replace(sources[name], agrees_with=origin)
    return layer.problems, layer.notes


def _as_flag(parser: argparse.ArgumentParser, name: str, value: Any) -> str:
    """`value` of the setting `name` as its flag would set it: `--num-layers 2`, `--swiglu`, `no --swiglu`."""
    action = next((action for action in option_table(parser) if action.dest == name and action.option_strings), None)
    if action is None:
        return f"{name} {show_value(value)}"
    option = action.option_strings[0]
    if isinstance(action, argparse.BooleanOptionalAction):
        return option if value else f"--no-{option[2:]}"
    if isinstance(value, bool) or value is None:
        return option if value else f"no {option}"
    return f"{option} {show_value(value)}"


def _as_given(parser: argparse.ArgumentParser, name: str, value: Any, source: Source) -> str:
    """An explicit setting as the user gave it: `--num-layers 4 on the command line`, or its JSON key."""
    if source.kind == FLAG and not source.note:
        return f"{_typed_value(source.origin.split(' ')[0], value)} on the command line"
    return f"{_as_flag(parser, name, value)} ({source.describe()})"


def _flag_values(parser: argparse.ArgumentParser, flags: Sequence[str]) -> dict[str, tuple[str, Any]]:
    """{setting: (the option, its value)} for the flags a JSON key becomes."""
    typed = options_typed(parser, flags)
    return {dest: (typed[dest], value) for dest, value in values_set_by(parser, list(flags)).items()}


def one_error(problems: list[str]) -> str:
    """One line: the problem itself, or every problem numbered."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems: " + "; ".join(f"({number}) {problem}"
                                                       for number, problem in enumerate(problems, 1))


def _invalid_choices(argv: list[str], table: OptionTable) -> tuple[list[str], list[str]]:
    """Each value outside its flag's choices as argparse words it, and `argv` without it: argparse would stop at the
    first, before the other problems are collected."""
    problems, kept, index = [], [], 0
    while index < len(argv):
        token = argv[index]
        option, _, attached = token.partition("=")
        action = table.action_for(option) if token.startswith("--") else None
        if action is None or action.choices is None or action.nargs is not None:
            kept.append(token)
            index += 1
            continue
        value = attached if attached or "=" in token else (argv[index + 1] if index + 1 < len(argv) else None)
        width = 1 if attached or "=" in token else 2
        try:
            converted = action.type(value) if action.type is not None and value is not None else value
        except (TypeError, ValueError):
            converted = None  # argparse's own message names it
        if value is None or converted is None or converted in action.choices:
            kept.append(token)
            index += 1
            continue
        choices = ", ".join(repr(choice) for choice in action.choices)
        problems.append(f"argument {'/'.join(action.option_strings)}: invalid choice: {value!r} (choose from {choices})")
        index += width
    return problems, kept


def _without(argv: list[str], unknown: list[str]) -> list[str]:
    """`argv` without the tokens argparse did not recognise, so the known flags are still checked."""
    kept, rest = [], list(unknown)
    for token in argv:
        if rest and token == rest[0]:
            rest.pop(0)
        else:
            kept.append(token)
    return kept


@dataclass
class Layers:
    """What `layer_sources` finds: each setting's source and, where the JSON and the command line differ, which side
    won."""
    sources: dict[str, Source]
    values: dict[str, Any] = field(default_factory=dict)  # the JSON's where it wins, else the layer below
    won: dict[str, list[str]] = field(default_factory=dict)  # JSON key -> "X wins over Y, as in ..." (warning)
    independent: dict[str, list[str]] = field(default_factory=dict)  # JSON key -> the flags beside it (info)
    outcomes: dict[str, str] = field(default_factory=dict)  # JSON key -> what became of it, for --print-config
    problems: list[str] = field(default_factory=list)
    unused: list[UnusedJsonValue] = field(default_factory=list)  # optimizer and scheduler values a flag won over

    def said_once(self, source: str) -> list[str]:
        """One warning for the keys where a side won, one info line for the independent settings set on both sides."""
        lines = []
        if self.won:
            lines.append(f"warning: {source} and the command line set {len(self.won)} setting(s) differently; "
                         f"the side the real Megatron-DeepSpeed + DeepSpeed pair uses wins: "
                         + "; ".join(text for texts in self.won.values() for text in texts))
        if self.independent:
            lines.append(f"{source}: DeepSpeed's own settings, independent of the command line's: "
                         + "; ".join(text for texts in self.independent.values() for text in texts))
        return lines


# Megatron-DeepSpeed always hands DeepSpeed a scheduler built from these, so under --deepspeed a JSON scheduler block
# beside any of them is not used.
SCHEDULE_SETTINGS = ("lr", "min_lr", "lr_warmup_iters", "lr_warmup_fraction", "lr_warmup_samples",
                     "lr_warmup_tokens", "lr_warmup_init", "lr_decay_style", "lr_decay_iters", "lr_decay_samples",
                     "lr_decay_tokens", "train_samples")
# Without --deepspeed a schedule flag wins only over what it sets: a warmup or decay length in any unit, and
# --train-samples over the block's iteration lengths.
_SCHEDULE_GROUPS = (("lr_warmup_iters", "lr_warmup_fraction", "lr_warmup_samples", "lr_warmup_tokens"),
                    ("lr_decay_iters", "lr_decay_samples", "lr_decay_tokens"))
BATCH_SETTINGS = ("micro_batch_size", "global_batch_size", "accumulation_steps")


def scheduler_dests_not_used(json_dests: Sequence[str], flag_dests: set[str], deepspeed: bool) -> dict[str, str]:
    """{JSON scheduler dest: the typed flag's dest that wins over it}: every one under --deepspeed, else those a flag
    sets in any unit of the same length."""
    typed = [dest for dest in SCHEDULE_SETTINGS if dest in flag_dests]
    if not typed:
        return {}
    if deepspeed:
        return {dest: typed[0] for dest in json_dests}
    winners = {}
    for dest in json_dests:
        group = next((group for group in _SCHEDULE_GROUPS if dest in group), (dest,))
        rival = next((other for other in group if other in flag_dests), None)
        if rival is None and "train_samples" in flag_dests and dest.endswith("_iters"):
            rival = "train_samples"
        if rival is not None:
            winners[dest] = rival
    return winners


def _json_dests_kept(parser: argparse.ArgumentParser, translation: Optional[DeepSpeedTranslation],
                     argv: list[str], deepspeed: bool) -> set[str]:
    """The JSON's settings that stand beside `argv`: all but a scheduler block's that a schedule flag sets aside."""
    if translation is None:
        return set()
    flag_dests = set(values_set_by(parser, argv))
    kept = set()
    for setting in translation.settings:
        dests = list(values_set_by(parser, list(setting.flags)))
        if setting.key == "scheduler.params":
            dests = [d for d in dests if d not in scheduler_dests_not_used(dests, flag_dests, deepspeed)]
        kept |= set(dests)
    return kept


def layer_sources(parser: argparse.ArgumentParser, preset_name: str, preset_argv: list[str],
                  translation: Optional[DeepSpeedTranslation], argv: list[str], deepspeed: bool = False) -> Layers:
    """Each setting's source (the last layer that set it) and, where the JSON and the command line both set one, the
    side the real pair uses (`values` holds the JSON's where it wins). JSON scheduler and batch values the run does not
    use fall back to the layer below; two JSON keys asking different values of one setting are a problem."""
    base_values = _settings(vars(parser.parse_args(preset_argv)))
    sources = {dest: Source(DEFAULT) for dest in _settings(vars(parser.parse_args([])))}
    for dest in values_set_by(parser, preset_argv):
        sources[dest] = Source(PRESET, preset_name)
    base_sources = dict(sources)
    layers = Layers(sources)
    json_values: dict[str, tuple[Any, str, str]] = {}  # dest -> (value, key, the flags the key became)
    for setting in translation.settings if translation is not None else []:
        where = f"{translation.source}: {setting.key}"
        for dest, value in values_set_by(parser, list(setting.flags)).items():
            if dest in json_values and json_values[dest][0] != value:
                layers.problems.append(f"{json_values[dest][1]} and {setting.key} in {translation.source} ask "
                                       f"for different values ({json_values[dest][2]}; {' '.join(setting.flags)}): "
                                       f"remove one")
            json_values[dest] = (value, setting.key, " ".join(setting.flags))
            sources[dest] = Source(JSON, where)
    typed = options_typed(parser, argv)
    every_typed = every_option_typed(parser, argv)
    flag_values = values_set_by(parser, argv)

    def not_used(dest: str) -> None:  # the JSON's value for `dest` is not used: back to the layer below
        del json_values[dest]
        if dest not in flag_values:
            layers.values[dest], sources[dest] = base_values[dest], base_sources[dest]

    schedule_flags = [typed.get(dest, dest) for dest in SCHEDULE_SETTINGS if dest in flag_values]
    scheduler = [dest for dest, (_, key, _) in json_values.items() if key == "scheduler.params"]
    set_aside = scheduler_dests_not_used(scheduler, set(flag_values), deepspeed)
    whole_block = deepspeed and bool(set_aside)
    for dest, winner in set_aside.items():
        if not whole_block and winner == dest:
            continue  # the setting's own flag meets it in _precedence
        option = typed.get(winner, winner)
        why = f"{NOT_READ_UNDER_DEEPSPEED} beside {option}" if whole_block else f"{option} on the command line wins"
        layers.unused.append(UnusedJsonValue(dest, _first_option(parser, dest), json_values[dest][0], why,
                                             None if whole_block else option))
        not_used(dest)
    if whole_block:
        rule = precedence_of("scheduler.params")
        text = (f"Megatron's schedule from the command line ({', '.join(schedule_flags)}) wins over the whole "
                f"scheduler block in {translation.source}, as in Megatron-DeepSpeed, {rule.why}")
        layers.outcomes["scheduler.params"] = f"not used: {text}"
    if flag_values.get("checkpoint_activations") is False and "checkpoint_activations" in json_values:
        # --no-checkpoint-activations wins; the block's options then configure nothing
        for dest in [d for d, (_, key, _) in json_values.items() if key.startswith("activation_checkpointing.")]:
            layers.outcomes[json_values[dest][1]] = ("not used: --no-checkpoint-activations on the command line "
                                                     "turns checkpointing off")
            not_used(dest)
    for key in {key for dest, (value, key, _) in json_values.items()
                if dest in flag_values and flag_values[dest] != value and precedence_of(key).winner == INDEPENDENT}:
        for dest in [d for d, (_, k, _) in json_values.items() if k == key and d not in flag_values]:
            not_used(dest)  # DeepSpeed's own monitor does not mix with the command line's
    rampup = any((flag_values.get(name) or base_values.get(name)) is not None  # the batch varies by iteration
                 for name in ("rampup_batch_size", "step_batch_size_schedule"))
    for dest in json_batch_settings_not_used({d for d in BATCH_SETTINGS if d in flag_values},
                                             {d for d in BATCH_SETTINGS if d in json_values}, rampup):
        key = json_values[dest][1]
        not_used(dest)
        layers.outcomes[key] = (f"not used here: the other two batch settings determine it, as in "
                                f"Megatron-DeepSpeed, {precedence_of(key).why}")

    for dest, value in flag_values.items():
        option = typed.get(dest, dest)
        source = Source(FLAG, describe_alias(option))
        if dest in json_values:
            json_value, key, json_flags = json_values[dest]
            where = f"{key} in {translation.source}"
            if json_value == value:
                source = Source(FLAG, describe_alias(option), agrees_with=where)
            else:
                json = f"{_json_value(key, json_value, json_flags)} in {translation.source}"
                source = _precedence(layers, key, _typed_value(option, value), json, source, dest, json_value,
                                     translation.source)
        earlier = [other for other in dict.fromkeys(every_typed.get(dest, ())) if other != option]
        if earlier and not source.overrides:  # --print-config names the overridden flags too
            source = dataclasses.replace(source, overrides=f"wins over {', '.join(earlier)} typed before it "
                                                           f"(the last flag for one setting wins)")
        sources[dest] = source
    if whole_block:
        real = f"as in Megatron-DeepSpeed, {precedence_of('scheduler.params').why}"
        for dest in SCHEDULE_SETTINGS:
            if dest in flag_values:
                sources[dest] = Source(FLAG, sources[dest].origin, agrees_with=sources[dest].agrees_with,
                                       overrides=f"wins over the scheduler block in {translation.source}, {real}")
    return layers


def _precedence(layers: Layers, key: str, flag: str, json: str, flag_source: Source, dest: str, json_value: Any,
                json_file: str) -> Source:
    """The winner's source where the flag and the JSON set `dest` differently, recording what it won over and the
    start-up line."""
    rule = precedence_of(key)
    real = f"as in Megatron-DeepSpeed, {rule.why}"
    if rule.winner == JSON_WINS:
        layers.values[dest] = json_value
        layers.won.setdefault(key, []).append(f"{json} wins over {flag}, {real}")
        layers.outcomes[key] = f"wins over {flag} on the command line, {real}"
        return Source(JSON, f"{json_file}: {key}", overrides=f"wins over {flag} on the command line, {real}")
    if rule.winner == INDEPENDENT:
        layers.independent.setdefault(key, []).append(f"{json} beside {flag}, which is the one here, {real}")
        layers.outcomes[key] = f"DeepSpeed's own; {flag} on the command line is the one here, {real}"
        return Source(FLAG, flag_source.origin, overrides=f"{json} is independent of it, {real}")
    if rule.winner == MUST_AGREE:
        layers.problems.append(f"{flag} on the command line and {json} must agree: {rule.why}")
        return flag_source
    if key.startswith(("optimizer.", "scheduler.")):  # said in its own short line
        option = flag.split(" ")[0]
        layers.unused.append(UnusedJsonValue(dest, option, json_value, "the command line wins", option))
    else:
        layers.won.setdefault(key, []).append(f"{json}: {flag} wins, {real}")
    layers.outcomes[key] = f"{flag} on the command line wins, {real}"
    return Source(FLAG, flag_source.origin, overrides=f"wins over {json}, {real}")


def _first_option(parser: argparse.ArgumentParser, dest: str) -> str:
    return next(action.option_strings[0] for action in option_table(parser) if action.dest == dest)


def _json_value(key: str, value: Any, flags: str) -> str:
    """A JSON key as the warning names it: `train_micro_batch_size_per_gpu 4`, or with the flags it
    became where those say more (`fp16.enabled (--fp16 --no-bf16)`)."""
    if isinstance(value, bool) or len(flags.split()) != 2:
        return f"{key} ({flags})"
    return f"{key} {show_value(value)}"


def _typed_value(option: str, value: Any) -> str:
    """How a flag was given: `--fp16`, `--no-bf16`, `--lr 0.0003`."""
    return option if isinstance(value, bool) else f"{option} {show_value(value)}"


def _settings(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items() if name not in _NOT_SETTINGS}


def _harvested_given(values: dict[str, Any]) -> dict[str, Any]:
    """The harvested flags given: their dests are their option strings, present only when given."""
    return {name: value for name, value in values.items() if name.startswith("--")}
