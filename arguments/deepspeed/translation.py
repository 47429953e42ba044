"""A DeepSpeed config JSON, as users write it, turned into this program's flags.

`--zero-config ds.json` (also `--deepspeed_config` / `--deepspeed-config`) reads the whole file and
classifies every key (`arguments/deepspeed/keys.py`):

- honoured keys become flags, each remembered with the key it came from, so `arguments.parser` can say
  where a setting came from and, where a command-line flag sets the same thing, let the side win that
  wins in the real Megatron-DeepSpeed + DeepSpeed pair (arguments/deepspeed/precedence.py);
- keys with no effect on the math are collected for one info line at the start of the run;
- unsupported and unknown keys are collected too, and reported together in one error line, each with
  the reason or the alternative (and "did you mean" for a key DeepSpeed does not have);
- the three batch keys are kept as written, for DeepSpeed's own check of them against the
  data-parallel size (arguments/batch_schedule.py).

A value of the wrong type names the key and the file. `deepspeed_config_to_flags` raises at the first
problem; with `collect=True` the problems are kept in `DeepSpeedTranslation.problems` instead, so
`arguments.parser` can report them in one line with the command line's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from arguments.deepspeed.blocks import classify_legacy_zero
from arguments.deepspeed.keys import SECTION_ALIASES, SECTION_KEYS, SECTIONS, TOP_LEVEL_KEYS, nearest_key
from arguments.deepspeed.verdicts import HONOURED, NO_EFFECT, UNSUPPORTED, Verdict, block
from base.errors import ConfigError
from base.input_files import read_text_file

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "configs" / "zero"


@dataclass(frozen=True)
class JsonSetting:
    key: str                # the dotted key path, as written (or the key an implied flag follows from)
    flags: tuple[str, ...]  # what it becomes on the command line


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass
class DeepSpeedTranslation:
    source: str                                                # the file, for messages
    settings: list[JsonSetting] = field(default_factory=list)  # in the file's order
    verdicts: list[Verdict] = field(default_factory=list)      # every key's, for --print-config
    batch: dict[str, int] = field(default_factory=dict)        # the BATCH_KEYS given, as written
    problems: list[str] = field(default_factory=list)          # with collect=True: bad values, refused keys
    written_as: dict[str, str] = field(default_factory=dict)   # a section by its older name: {"bf16": "bfloat16"}

    @property
    def no_effect(self) -> list[Verdict]:
        return [verdict for verdict in self.verdicts if verdict.kind == NO_EFFECT]

    @property
    def argv(self) -> list[str]:
        return [token for setting in self.settings for token in setting.flags]

    def info_line(self, said_elsewhere: frozenset = frozenset()) -> str:
        """The keys accepted with no effect on the math, in one line (empty when there are none), but for
        those `said_elsewhere` (a warning line names them: arguments/deepspeed/client_objects.py)."""
        listed = "; ".join(f"{verdict.key} ({verdict.why})" for verdict in self.no_effect
                           if verdict.key not in said_elsewhere)
        if not listed:
            return ""
        return f"> {self.source}: accepted with no effect on the math: {listed}"


def deepspeed_config_to_flags(config: Any, source: str, collect: bool = False) -> DeepSpeedTranslation:
    """Classify every key of a parsed DeepSpeed config; raise one ConfigError listing every unsupported
    or unknown key (with `collect`, keep it and every bad value in `problems` and go on with the keys
    that are honoured). A config that enables one of fp16/bf16 also disables the other (they are
    exclusive, and a preset may have turned the other on); one that enables both is an error.

    In DeepSpeed the `activation_checkpointing` block only configures checkpointing; Megatron's
    --checkpoint-activations turns it on. Here a block with any option on (a true flag, or a
    `number_checkpoints` that is not null) also emits --checkpoint-activations, so the JSON takes
    effect on its own; a block with every option off or null leaves checkpointing as it was. (Under a
    Megatron launch that implied flag, and the block where the real pair does not read it, are set
    aside: arguments/deepspeed/client_objects.py.)
    """
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: a DeepSpeed config must be a JSON object")
    verdicts: list[Verdict] = []
    values: dict[str, Any] = {}  # honoured section keys' values, for the implied flags below
    problems: list[str] = []     # bad values, in the file's order
    batch: dict[str, int] = {}

    def classified(key: str, classify, value: Any) -> list[Verdict]:
        try:
            return classify(key, value)
        except ConfigError as error:
            if not collect:
                raise ConfigError(f"{source}: {error}", flags=error.flags) from None
            problems.append(f"{source}: {error}")
            return []

    for key, value in config.items():
        section = SECTION_ALIASES.get(key, key)
        if section == "zero_optimization" and isinstance(value, bool):
            verdicts += classify_legacy_zero(key, value)
        elif section in SECTIONS:
            entries = classified(key, lambda name, value: list(block(name, value).items()), value)
            for sub_key, sub_value in entries:
                path = f"{section}.{sub_key}"
                classify = SECTION_KEYS.get(path)
                found = classified(path, classify, sub_value) if classify else [_unknown(path)]
                verdicts += found
                if found:
                    values[path] = sub_value
        elif key in TOP_LEVEL_KEYS:
            found = classified(key, TOP_LEVEL_KEYS[key], value)
            verdicts += found
            if key in BATCH_KEYS and found:
                batch[key] = int(value)
        else:
            verdicts.append(_unknown(key))

    if refused_line(source, verdicts):
        problems.append(refused_line(source, verdicts))
    if problems and not collect:
        raise ConfigError(problems[0])
    verdicts = _scheduler_sets_the_peak(verdicts)
    translation = DeepSpeedTranslation(str(source), verdicts=verdicts, batch=batch, problems=problems,
                                       written_as={SECTION_ALIASES[key]: key for key in config
                                                   if key in SECTION_ALIASES})
    translation.settings = [JsonSetting(verdict.key, verdict.flags) for verdict in translation.verdicts
                            if verdict.kind == HONOURED and verdict.flags]
    try:
        translation.settings += _implied(values, source)
    except ConfigError as error:
        if not collect:
            raise
        problems.append(str(error))
    return translation


def refused_line(source: str, verdicts: list[Verdict]) -> str:
    """The one problem naming every key refused (empty when none is)."""
    refused = [verdict for verdict in verdicts if verdict.kind == UNSUPPORTED]
    if not refused:
        return ""
    listed = "; ".join(f"{verdict.key} ({verdict.why})" for verdict in refused)
    return f"{source}: {len(refused)} key(s) not supported here, remove or change them: {listed}"


def _scheduler_sets_the_peak(verdicts: list[Verdict]) -> list[Verdict]:
    """DeepSpeed's WarmupLR/WarmupDecayLR set the learning rate from warmup_max_lr whatever the
    optimizer block says; so does the translation (the optimizer's lr then has no effect)."""
    def lr(verdict: Verdict):
        flags = list(verdict.flags)
        return flags[flags.index("--lr") + 1] if verdict.kind == HONOURED and "--lr" in flags else None

    peak = next((lr(v) for v in verdicts if v.key == "scheduler.params" and lr(v) is not None), None)
    result = []
    for verdict in verdicts:
        if verdict.key == "optimizer.params.lr" and peak is not None and lr(verdict) != peak:
            verdict = Verdict(verdict.key, NO_EFFECT, why=f"the scheduler's warmup_max_lr {peak} is the peak "
                                                          "learning rate, as in DeepSpeed")
        result.append(verdict)
    return result


def _unknown(key: str) -> Verdict:
    nearest = nearest_key(key)
    hint = f'did you mean "{nearest}"?' if nearest else "not a key of DeepSpeed's documented configuration"
    return Verdict(key, UNSUPPORTED, why=f"unknown key; {hint}")


def _implied(values: dict[str, Any], source: str) -> list[JsonSetting]:
    fp16, bf16 = values.get("fp16.enabled"), values.get("bf16.enabled")
    if fp16 is True and bf16 is True:
        raise ConfigError(f"{source}: fp16.enabled and bf16.enabled are both true; choose one precision")
    implied = []
    if fp16 is True and bf16 is None:
        implied.append(JsonSetting("fp16.enabled", ("--no-bf16",)))
    if bf16 is True and fp16 is None:
        implied.append(JsonSetting("bf16.enabled", ("--no-fp16",)))
    if any(key.startswith("activation_checkpointing.") and value is not None and value is not False
           for key, value in values.items()):
        implied.append(JsonSetting("activation_checkpointing", ("--checkpoint-activations",)))
    return implied


def load_deepspeed_config(path: Union[str, Path], collect: bool = False) -> DeepSpeedTranslation:
    """Read a DeepSpeed JSON config and classify it (see `deepspeed_config_to_flags`)."""
    path = Path(path)
    text = read_text_file(path, "--zero-config")  # a FIFO or /dev/zero is refused, not read forever
    try:
        config = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a DeepSpeed config") from None
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}", flags=error.flags) from None
    return deepspeed_config_to_flags(config, str(path), collect)


def resolve_zero_config(name_or_path: str) -> Path:
    """A path to a JSON file, or the name of an example in configs/zero (`stage2` -> stage2.json)."""
    path = Path(name_or_path)
    if path.is_file() or path.suffix == ".json" or path.parent != Path("."):
        return path
    example = EXAMPLE_DIR / f"{name_or_path}.json"
    if example.is_file():
        return example
    names = ", ".join(sorted(p.stem for p in EXAMPLE_DIR.glob("*.json")))
    raise ConfigError(f"--zero-config {name_or_path}: no such file, nor an example in configs/zero ({names})")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
    result: dict = {}
    for key, value in pairs:
        if key in result:
            raise ConfigError(f'key "{key}" appears twice')
        result[key] = value
    return result
