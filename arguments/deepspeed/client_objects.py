"""Under a Megatron launch, the JSON blocks DeepSpeed never reads because Megatron hands it its own objects: the
optimizer (and, with DeepSpeed since v0.14.5, the scheduler) built from flags, and the activation_checkpointing block
outside the 2020 fork's --deepspeed-activation-checkpointing. These blocks set nothing; each differing value is named in
one line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from arguments.config_sources import Source, show_value
from arguments.deepspeed.differences import NOT_READ_UNDER_DEEPSPEED, UnusedJsonValue
from arguments.deepspeed.translation import DeepSpeedTranslation, JsonSetting, refused_line
from arguments.deepspeed.verdicts import NO_EFFECT, UNSUPPORTED, Verdict

# Generations whose engine step passes no lr_kwargs, with a DeepSpeed before v0.14.5 that took the JSON's scheduler
# first.
JSON_SCHEDULER_GENERATIONS = ("dse-megatron-lm", "dse-megatron-lm-v1.1.5-zero3", "dse-megatron-lm-v1.1.5-3d")

_OPTIMIZER_WHY = ("not read: Megatron hands deepspeed.initialize its own Adam built from --lr, --weight-decay, "
                  "--adam-beta1/2, --adam-eps, and DeepSpeed then ignores the JSON's optimizer")
# The 2020 fork's own Adam fills the param groups, so their values win over the JSON's optimizer either way.
_PARAM_GROUPS_WHY = ("not read: the fork passes deepspeed.initialize its own Adam (until October 2020) or the "
                     "param groups that Adam already filled (since), from --lr, --weight-decay (betas 0.9, 0.999, "
                     "eps 1e-8), and the groups' values win over the JSON's, which are only the defaults of "
                     "DeepSpeed's optimizer")
PARAM_GROUP_GENERATIONS = ("dse-megatron-lm",)
# Generations whose --deepspeed-activation-checkpointing hands deepspeed.checkpointing.configure the JSON, no flag
# overwriting it.
JSON_CHECKPOINTING_GENERATIONS = ("dse-megatron-lm",)
CHECKPOINTING_BLOCK = "activation_checkpointing"
CLIENT_BLOCKS = ("optimizer.", "scheduler.")
_SWITCH_WHY = ("not read as a switch: the block only configures DeepSpeed's checkpoint function, and Megatron "
               "checkpoints only under --checkpoint-activations")
_UNFLAGGED_WHY = ("not read: Megatron configures DeepSpeed's activation checkpointing only under "
                  "--deepspeed-activation-checkpointing, which this launch does not pass")
_FLAGS_OVERWRITE_WHY = ("not read: under --deepspeed-activation-checkpointing Megatron-DeepSpeed (and its v1.1.5 "
                        "forks) hand deepspeed.checkpointing.configure their own --partition-activations, "
                        "--contigious-checkpointing, --checkpoint-in-cpu, --synchronize-each-layer, "
                        "--profile-backward (false unless given), which overwrite every key of the block")
_UNUSED_WHY = ("not read in effect: the fork hands it to deepspeed.checkpointing.configure, but nothing calls "
               "DeepSpeed's checkpoint function without --checkpoint-activations")
_NUM_LAYERS_WHY = ("not read: the fork hands deepspeed.checkpointing.configure num_checkpoints=--num-layers, "
                   "which overwrites the block's")
_SCHEDULER_WHY = ("not read: Megatron-DeepSpeed hands deepspeed.initialize its own scheduler built from the "
                  "schedule flags, which DeepSpeed (since v0.14.5) uses instead of the JSON's")


@dataclass
class NotRead:
    """The JSON settings a Megatron launch sets aside, each with the flags it would have become."""
    source: str
    settings: list[JsonSetting] = field(default_factory=list)
    generation: Optional[str] = None
    reasons: dict[str, str] = field(default_factory=dict)  # key -> why, where the generation alone does not say

    def warning(self, flag_values: Callable[[Sequence[str]], dict[str, tuple[str, Any]]], settings: dict[str, Any],
                sources: dict[str, Source]) -> tuple[Optional[str], set[str]]:
        """(the line naming each set-aside key whose value differs from what runs, or None; those keys).
        `flag_values(flags)` is {setting: (option, value)}."""
        named, by_why = set(), {}  # why -> ([key], [what runs]): keys sharing a why, said once
        for setting in self.settings:
            asked = flag_values(setting.flags)
            differ = {dest: pair for dest, pair in asked.items() if settings[dest] != pair[1]}
            if not differ:
                continue
            named.add(setting.key)
            if setting.key.startswith(CLIENT_BLOCKS):
                continue  # said a value a line (`unused`)
            written = ", ".join(f"{option} {show_value(value)}" for option, value in asked.values())
            runs = ", ".join(f"{option} {show_value(settings[dest])} ({sources[dest].describe()})"
                             for dest, (option, _) in differ.items())
            keys, used = by_why.setdefault(self.reasons.get(setting.key) or _why(setting.key, self.generation),
                                           ([], []))
            keys.append(f"{setting.key} ({written})")
            used.append(runs)
        clauses = [f"{' and '.join(keys)} {'is' if len(keys) == 1 else 'are'} {why}; the run uses {', '.join(used)}"
                   for why, (keys, used) in by_why.items()]
        if not clauses:
            return None, named
        return (f"warning: {len(named)} value(s) in {self.source} not read, as in the real Megatron-DeepSpeed + "
                f"DeepSpeed pair: " + "; ".join(clauses)), named


    def unused(self, flag_values: Callable[[Sequence[str]], dict[str, tuple[str, Any]]]) -> list[UnusedJsonValue]:
        """The optimizer and scheduler values set aside, for a short line each."""
        return [UnusedJsonValue(dest, option, value, NOT_READ_UNDER_DEEPSPEED)
                for setting in self.settings if setting.key.startswith(CLIENT_BLOCKS)
                for dest, (option, value) in flag_values(setting.flags).items()]


def set_aside_client_blocks(translation: Optional[DeepSpeedTranslation], megatron_launch: bool,
                            generation: Optional[str], deepspeed_activation_checkpointing: bool = False,
                            checkpoint_activations: bool = False, also_fitting: Sequence[str] = (),
                            deepspeed: bool = True) -> NotRead:
    """Under a Megatron launch, move out of `translation`, as not read: the optimizer block's settings (and the
    scheduler's, outside JSON_SCHEDULER_GENERATIONS), both only under `deepspeed`, and the checkpointing keys
    `checkpointing_block_reasons` names. `also_fitting`: generations the flags fit as well as `generation`."""
    if translation is None or not megatron_launch:
        return NotRead(translation.source if translation is not None else "")
    prefixes = () if not deepspeed else ("optimizer.",) if generation in JSON_SCHEDULER_GENERATIONS \
        else ("optimizer.", "scheduler.")
    keys = [s.key for s in translation.settings] + [v.key for v in translation.verdicts]
    flags = (deepspeed_activation_checkpointing, checkpoint_activations)
    reasons = checkpointing_block_reasons(keys, generation, *flags)
    reasons.update(_ties_named(keys, generation, also_fitting, flags, reasons))

    def set_aside(key: str) -> bool:
        return key.startswith(prefixes) or key in reasons

    not_read = NotRead(translation.source, [s for s in translation.settings if set_aside(s.key)], generation, reasons)
    translation.settings = [s for s in translation.settings if not set_aside(s.key)]
    refused_before = refused_line(translation.source, translation.verdicts)
    translation.verdicts = [_not_read(verdict, prefixes, generation, reasons) if verdict.key.startswith(prefixes)
                            else _checkpointing_not_read(verdict, reasons) for verdict in translation.verdicts]
    refused_now = refused_line(translation.source, translation.verdicts)
    if refused_now != refused_before:
        translation.problems = [refused_now if problem == refused_before else problem
                                for problem in translation.problems if problem != refused_before or refused_now]
    return not_read


def _ties_named(keys: Sequence[str], generation: Optional[str], also_fitting: Sequence[str],
                flags: tuple[bool, bool], reasons: dict[str, str]) -> dict[str, str]:
    """{key: why} for set-aside keys that an equally fitting fork would have read, named where the tie rule's choice
    changes what runs."""
    named = {}
    fork = next((label for label in also_fitting if label in JSON_SCHEDULER_GENERATIONS), None)
    if fork is not None and generation not in JSON_SCHEDULER_GENERATIONS:
        named.update({key: _SCHEDULER_WHY + _tie(fork, "ran the JSON's scheduler (its DeepSpeed, before v0.14.5, "
                                                       "took it first)")
                      for key in keys if key.startswith("scheduler.")})
    fork = next((label for label in also_fitting if label in JSON_CHECKPOINTING_GENERATIONS), None)
    if fork is not None and generation not in JSON_CHECKPOINTING_GENERATIONS:
        read_there = checkpointing_block_reasons(keys, fork, *flags)
        named.update({key: why + _tie(fork, "read it") for key, why in reasons.items()
                      if key.startswith(CHECKPOINTING_BLOCK) and key not in read_there})
    return named


def checkpointing_block_reasons(keys: Sequence[str], generation: Optional[str],
                                deepspeed_activation_checkpointing: bool,
                                checkpoint_activations: bool) -> dict[str, str]:
    """{key: why it is not read} for the activation_checkpointing keys a Megatron launch of `generation` does not read:
    all, except where the 2020 fork hands the JSON to deepspeed.checkpointing.configure under --checkpoint-activations
    (then only number_checkpoints is overwritten)."""
    json_read = deepspeed_activation_checkpointing and generation in JSON_CHECKPOINTING_GENERATIONS
    reasons = {}
    for key in keys:
        if json_read and checkpoint_activations:
            if key == CHECKPOINTING_BLOCK + ".number_checkpoints":
                reasons[key] = _NUM_LAYERS_WHY
        elif key == CHECKPOINTING_BLOCK:
            reasons[key] = _SWITCH_WHY
        elif key.startswith(CHECKPOINTING_BLOCK + "."):
            reasons[key] = (_UNUSED_WHY if json_read else _FLAGS_OVERWRITE_WHY if deepspeed_activation_checkpointing
                            else _UNFLAGGED_WHY)
    return reasons


def _checkpointing_not_read(verdict: Verdict, reasons: dict[str, str]) -> Verdict:
    """A block key not read has no effect; an unknown key (a typo) stays refused."""
    if verdict.key not in reasons or verdict.kind == UNSUPPORTED:
        return verdict
    return Verdict(verdict.key, NO_EFFECT, why=reasons[verdict.key])


def _why(key: str, generation: Optional[str]) -> str:
    if key.startswith("scheduler."):
        return _SCHEDULER_WHY
    return _PARAM_GROUPS_WHY if generation in PARAM_GROUP_GENERATIONS else _OPTIMIZER_WHY


def _tie(fork: str, did: str) -> str:
    return (f" (the launch's flags fit {fork} as well, which {did}: of equal fits the newest generation is taken, "
            f"and a flag only {fork} defines chooses it)")


def _not_read(verdict: Verdict, prefixes: tuple[str, ...], generation: Optional[str],
              reasons: Optional[dict[str, str]] = None) -> Verdict:
    """The verdict of a key the real pair does not read. A refused scheduler key or optimizer param is not refused any
    more (a client object skips reading them); a refused optimizer type stays refused, as the engine reads it beside a
    client optimizer too."""
    if not verdict.key.startswith(prefixes) or (verdict.kind == UNSUPPORTED
                                                and not verdict.key.startswith(("optimizer.params.", "scheduler."))):
        return verdict
    if verdict.kind == NO_EFFECT and verdict.why.startswith("not read"):
        return verdict
    return Verdict(verdict.key, NO_EFFECT, why=(reasons or {}).get(verdict.key) or _why(verdict.key, generation))
