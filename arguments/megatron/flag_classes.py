"""What each harvested flag that is not one of ours does here: the table is data (flag_classes.toml, groups of
flags with their reason); this module reads it and holds the rules that decide an at-value flag's no-op values."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from gpt.moe.settings import largest_expert_count

TABLE = tomllib.loads((Path(__file__).with_name("flag_classes.toml")).read_text())
REASONS: dict[str, str] = TABLE["reasons"]
NO_PIPELINE_SPLIT, NO_MOE, NOT_IN_MOE = REASONS["no_pipeline_split"], REASONS["no_moe"], REASONS["not_in_moe"]
# --spec's values that name Megatron-Core's hybrid stack (mamba_layer_specs re-exports hybrid_layer_specs')
HYBRID_STACK_SPECS = tuple((module, name) for module in ("megatron.core.models.hybrid.hybrid_layer_specs",
                                                         "megatron.core.models.mamba.mamba_layer_specs")
                           for name in ("hybrid_stack_spec", "mamba_stack_spec"))

Settings = Optional[Mapping[str, Any]]


@dataclass(frozen=True)
class AtValue:
    """Accepted with no effect where `accepts(value, settings)` holds, refused elsewhere."""
    accepts: Callable[[Any, Settings], bool]
    no_effect: str      # the reason, at the no-op value
    refused: str        # the reason and what to use, at any other value


def is_deepspeed_moe_launch(num_experts, generation: Optional[str], deepspeed: bool) -> bool:
    """A Megatron-DeepSpeed launch with --num-experts means DeepSpeed-MoE's gating (top-1, capacity factor 1,
    every --expert-interval-th layer), not Megatron-Core's router; our own flags the fork shares do not count."""
    return bool(largest_expert_count(num_experts) and deepspeed and generation is not None
                and "deepspeed" in generation)


# Each rule accepts before the settings are known (settings None): an error about unknown flags comes first.
def _without_moe(value: Any, settings: Settings) -> bool:
    return settings is None or largest_expert_count(settings.get("num_experts")) is None


def _without_pipeline(value: Any, settings: Settings) -> bool:
    return settings is None or settings.get("pipeline_model_parallel_size", 1) == 1


def _router_padding(value: Any, settings: Settings) -> bool:
    """Megatron-Core's TransformerConfig refuses it without FP8 and with the allgather or alltoall_seq dispatcher."""
    return settings is None or (settings.get("fp8") is not None
                                and settings.get("moe_token_dispatcher_type") not in ("allgather", "alltoall_seq"))


def _with_pattern(value: Any, settings: Settings) -> bool:
    return settings is None or settings.get("hybrid_layer_pattern") is not None


def _hybrid_stack_spec(value: Any, settings: Settings) -> bool:
    return tuple(value or ()) in HYBRID_STACK_SPECS and _with_pattern(value, settings)


def _fp32_run(value: Any, settings: Settings) -> bool:
    """--fp32-residual-connection is the identity in an fp32 run."""
    return settings is None or not (settings.get("bf16") or settings.get("fp16"))


RULES: dict[str, Callable[[Any, Settings], bool]] = {
    "without_moe": _without_moe, "without_pipeline": _without_pipeline, "router_padding": _router_padding,
    "with_pattern": _with_pattern, "hybrid_stack_spec": _hybrid_stack_spec, "fp32_run": _fp32_run}


def _equals(*values: Any) -> Callable[[Any, Settings], bool]:
    def accepts(value: Any, settings: Settings) -> bool:
        given = value if isinstance(value, list) else [value]
        return bool(given) and all(item in values for item in given)
    return accepts


def _matches(setting: str) -> Callable[[Any, Settings], bool]:
    """The value the settings already imply, or None (Megatron's "derive it")."""
    def accepts(value: Any, settings: Settings) -> bool:
        return value is None or settings is None or value == settings[setting]
    return accepts


def _rule(row: dict) -> Callable[[Any, Settings], bool]:
    kind = row["accepts"]
    if kind == "equals":
        return _equals(*row["values"])
    if kind == "off":
        return _equals(False, None)
    if kind == "matches":
        return _matches(row["setting"])
    return RULES[kind]


def _reason(text: str) -> str:
    return REASONS[text[1:]] if text.startswith("@") else text


def _groups(kind: str, fork: bool) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((_reason(row["reason"]), tuple(row["flags"].split()))
                 for row in TABLE[kind] if row.get("fork", False) == fork)


NO_EFFECT = _groups("no_effect", fork=False) + _groups("no_effect", fork=True)
REFUSED = _groups("refused", fork=False) + _groups("refused", fork=True)
AT_VALUE: dict[str, AtValue] = {flag: AtValue(_rule(row), _reason(row["no_effect"]), _reason(row["refused"]))
                                for row in TABLE["at_value"] for flag in row["flags"].split()}
FORK_AT_VALUE = frozenset(flag for row in TABLE["at_value"] if row.get("fork") for flag in row["flags"].split())

NO_EFFECT_CLASS, REFUSED_CLASS, AT_VALUE_CLASS = "no-effect", "refused", "at-value"


def _table() -> dict[str, tuple[str, str]]:
    table: dict[str, tuple[str, str]] = {}

    def put(option: str, kind: str, reason: str) -> None:
        if option in table:
            raise ValueError(f"{option} is classified twice ({table[option][0]} and {kind})")
        table[option] = (kind, reason)

    for reason, options in NO_EFFECT:
        for option in options:
            put(option, NO_EFFECT_CLASS, reason)
    for reason, options in REFUSED:
        for option in options:
            put(option, REFUSED_CLASS, reason)
    for option, at_value in AT_VALUE.items():
        put(option, AT_VALUE_CLASS, at_value.no_effect)
    return table


CLASS_OF: dict[str, tuple[str, str]] = _table()
