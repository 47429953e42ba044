"""A DeepSpeed config JSON (--zero-config) turned into this program's flags. Every key is classified
(arguments/deepspeed/keys.py): honoured keys become flags that remember their key, keys with no effect join one info
line, and refused or unknown keys are reported together, each with the alternative."""

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
    key: str  # the dotted key, as written (or the key an implied flag follows from)
    flags: tuple[str, ...]


BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


@dataclass
class DeepSpeedTranslation:
    source: str
    settings: list[JsonSetting] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    batch: dict[str, int] = field(default_factory=dict)  # the BATCH_KEYS given, as written
    problems: list[str] = field(default_factory=list)  # with collect=True: bad values, refused keys
    written_as: dict[str, str] = field(default_factory=dict)  # a section by its older name: {"bf16": "bfloat16"}

    @property
    def no_effect(self) -> list[Verdict]:
        return [verdict for verdict in self.verdicts if verdict.kind == NO_EFFECT]

    @property
    def argv(self) -> list[str]:
        return [token for setting in self.settings for token in setting.flags]

    def info_line(self, said_elsewhere: frozenset = frozenset()) -> str:
        """The keys accepted with no effect on the math in one line ("" when none), but for those `said_elsewhere` in a
        warning line."""
        listed = "; ".join(f"{verdict.key} ({verdict.why})" for verdict in self.no_effect
                           if verdict.key not in said_elsewhere)
        if not listed:
            return ""
        return f"> {self.source}: accepted with no effect on the math: {listed}"


def deepspeed_config_to_flags(config: Any, source: str, collect: bool = False) -> DeepSpeedTranslation:
    """Classify every key of a parsed DeepSpeed config; raise one ConfigError listing every refused or unknown key (with
    `collect`, keep them and every bad value in `problems`). Enabling one of fp16/bf16 disables the other. An
    activation_checkpointing block with any option on also emits --checkpoint-activations, so the JSON takes effect on
    its own."""
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: a DeepSpeed config must be a JSON object")
    verdicts: list[Verdict] = []
    values: dict[str, Any] = {}  # for the implied flags below
    problems: list[str] = []
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
    """The one problem naming every refused key ("" when none is)."""
    refused = [verdict for verdict in verdicts if verdict.kind == UNSUPPORTED]
    if not refused:
        return ""
    listed = "; ".join(f"{verdict.key} ({verdict.why})" for verdict in refused)
    return f"{source}: {len(refused)} key(s) not supported here, remove or change them: {listed}"


def _scheduler_sets_the_peak(verdicts: list[Verdict]) -> list[Verdict]:
    """DeepSpeed's WarmupLR/WarmupDecayLR take the peak rate from warmup_max_lr, so the optimizer block's lr then has no
    effect."""
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
    text = read_text_file(path, "--zero-config")
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
