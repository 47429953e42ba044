"""Megatron's own defaults for what a Megatron-style launch leaves out. A launch that sets the model from flags and
names no preset takes, for every setting it omits, the default of the Megatron argument file its flags belong to (newest
first), so the same command line trains what Megatron trains; `megatron_default_note` names any value of ours that still
stands."""

from __future__ import annotations

import argparse
import ast
import math
import operator
from typing import Any, Iterable, Optional, Sequence

from arguments.config_sources import DEFAULT, FLAG, JSON, MEGATRON_DEFAULTS, PRESET, Source  # noqa: F401
from arguments.option_table import option_table, stores_a_constant

# Megatron-LM's argument files, newest first.
DEFAULT_SOURCES = ("megatron-lm", "megatron-lm-core_v0.15.0", "megatron-lm-23.04", "megatron-lm-v2.6")
# --hybrid-layer-pattern sets the depth in place of --num-layers
MODEL_SETTINGS = ("num_layers", "hidden_size", "num_attention_heads", "hybrid_layer_pattern")
WARMUP_SETTINGS = ("lr_warmup_iters", "lr_warmup_fraction", "lr_warmup_samples", "lr_warmup_tokens")
GLOBAL_BATCH_SETTINGS = ("global_batch_size", "accumulation_steps", "rampup_batch_size", "step_batch_size_schedule")
# Megatron's defaults a Megatron launch does not take, each with why (none today).
OURS_STAND: dict[str, str] = {}
# Megatron's file-format defaults a Megatron launch does not take, said in their own start-up line where it saves.
FILE_FORMAT_DEFAULTS: dict[str, str] = {
    "ckpt_format": "--save writes this project's checkpoints (verified on load, resumed at any layout); "
                   "--ckpt-format torch_dist writes Megatron-LM's"}
# Megatron's defaults that hold only under a switch the launch may leave out.
SWITCHED_DEFAULTS: dict[str, str] = {
    "num_query_groups": "Megatron-LM reads its default (1) only under --group-query-attention"}
# Defaults an older generation's file states with another meaning than this setting's: the newest default applies.
_ENGINE = "DeepSpeed's engine takes it from the JSON; the fork's flag is parsed and not read"
_SWITCHED = "the fork's flag is read only under --deepspeed-activation-checkpointing"
GENERATION_DEFAULT_NOT_TAKEN = {
    **{name: _ENGINE for name in ("stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
                                  "reduce_scatter", "contiguous_gradients", "checkpoint_num_layers")},
    **{name: _SWITCHED for name in ("partition_activations", "cpu_checkpointing", "contiguous_checkpointing",
                                    "synchronize_checkpoint_boundary", "profile_checkpointing")},
    "vocab_size": "the 2020 fork's --vocab-size sized the tokenizer it built; here it is NullTokenizer's",
    "num_experts": "Megatron-DeepSpeed's --num-experts [1] is one expert, the dense MLP: Megatron-LM's None here",
}
_OPERATORS = {ast.Pow: operator.pow, ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub,
              ast.Div: operator.truediv, ast.USub: operator.neg}


def _evaluate(expression: str) -> tuple[bool, Any]:
    """A harvested default written as an expression: arithmetic (`2 ** 32`) or an enum's member (`AttnBackend.auto` is
    `auto`); anything else is not taken."""
    try:
        tree = ast.parse(expression, mode="eval").body
    except SyntaxError:
        return False, None

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(expression)

    if isinstance(tree, ast.Attribute) and isinstance(tree.value, ast.Name):
        return True, tree.attr
    try:
        return True, value(tree)
    except (ValueError, ArithmeticError):
        return False, None


def megatron_default(option: str, harvested_flags: dict) -> tuple[bool, Any]:
    """(found, Megatron's default for `option`) from the newest source that states one."""
    for source in DEFAULT_SOURCES:
        stated = _stated(source, [option], harvested_flags)
        if stated is not None:
            return stated
    return False, None


def _stated(source: str, spellings: Sequence[str], harvested_flags: dict) -> Optional[tuple[bool, Any]]:
    for spelling in spellings:
        defaults = harvested_flags.get(spelling, {}).get("defaults", {})
        if source in defaults:
            theirs = defaults[source]
            return _evaluate(theirs.get("expr", "")) if isinstance(theirs, dict) else (True, theirs)
    return None


# Megatron-LM forks whose validate_args refuses --batch-size, --warmup and --model-parallel-size.
PRETRAINING_FORKS = ("llm-jp-megatron-lm-v4", "llm-jp-megatron-lm-nii-geniac", "swiss-ai-megatron-lm")
# ALCF's Megatron-DeepSpeed fork (AuroraGPT), refusing them as Megatron-DeepSpeed does
ALCF_FORK = "alcf-megatron-deepspeed"
LOLA_FORK = "lola-megatron-deepspeed"  # its own flags only
PAI_MEGATRON_PATCH = "pai-megatron-patch"  # its own flags only, all refused

# Flags a generation parses only to refuse: a launch typing one ran where it is read.
REFUSING_GENERATIONS = ("megatron-lm", "megatron-lm-core_v0.15.0", "megatron-lm-23.04", "megatron-lm-v2.6",
                        "megatron-deepspeed", "bigscience-megatron-deepspeed", *PRETRAINING_FORKS, ALCF_FORK, LOLA_FORK)
REFUSED_WHERE_PARSED = {flag: REFUSING_GENERATIONS for flag in ("--batch-size", "--warmup", "--model-parallel-size")}
# DeepSpeedExamples' forks, newest Megatron-LM first, so a tie goes to the newest code.
FORKS_NEWEST_FIRST = ("dse-megatron-lm-v1.1.5-zero3", "dse-megatron-lm-v1.1.5-3d", "dse-megatron-lm")


def equally_fitting_generations(argv: Iterable[str], harvested_flags: dict, sources: Sequence[dict]) -> list[str]:
    """The Megatron argument files (harvested sources' labels) that define the most of the harvested flags the launch
    types, in preference order (the first is `launch_generation`); [] where it types none. Counting, not requiring all,
    keeps one flag of another generation from hiding the launch's; DeepSpeed's own flags and flags a generation parses
    only to refuse count for none."""
    forks = [source["label"] for source in sorted(sources, key=lambda source: source["date"], reverse=True)
             if not source["label"].startswith("deepspeed") and source["label"] not in DEFAULT_SOURCES]
    forks.sort(key=lambda label: (FORKS_NEWEST_FIRST.index(label) if label in FORKS_NEWEST_FIRST
                                  else len(FORKS_NEWEST_FIRST) if label in (*PRETRAINING_FORKS, PAI_MEGATRON_PATCH,
                                                                            ALCF_FORK, LOLA_FORK)
                                  else -1))
    preference = [label for label in DEFAULT_SOURCES if any(s["label"] == label for s in sources)] + forks
    defined = {label: 0 for label in preference}
    for token in argv:
        option = token.split("=", 1)[0]
        if option.startswith("--") and option in harvested_flags:
            for label in harvested_flags[option].get("sources", ()):
                if label in defined and label not in REFUSED_WHERE_PARSED.get(option, ()):
                    defined[label] += 1
    most = max(defined.values(), default=0)
    return [label for label in preference if defined[label] == most] if most else []


def launch_generation(argv: Iterable[str], harvested_flags: dict, sources: Sequence[dict]) -> Optional[str]:
    return next(iter(equally_fitting_generations(argv, harvested_flags, sources)), None)


# Generations whose NullTokenizer may read --vocab-size N as N ids, the last ending a document (core_v0.18.0 on);
# the older ones, and ours, as N ids plus the end-of-document id N. None: a launch that fits no generation. The
# flags do not tell core_v0.16/0.17 from later launches (but for --null-tokenizer-eod-id and -pad-id), so a fresh
# launch without those keeps the older reading.
NULL_TOKENIZER_N_IDS = (None, "megatron-lm")


def null_tokenizer_note(tokenizer_type: Optional[str], vocab_size: int, generation: Optional[str],
                        loading: bool = False) -> Optional[str]:
    """The start-up line of a NullTokenizer launch whose generation may read --vocab-size otherwise than here:
    the reading taken, and the other one (`loading`: a --load, whose checkpoint may name its own)."""
    if tokenizer_type != "NullTokenizer" or generation not in NULL_TOKENIZER_N_IDS or vocab_size < 2:
        return None
    n = vocab_size
    load = ("; a --load takes the reading of the release that wrote its checkpoint where the checkpoint says it "
            "(core_v0.18 on)") if loading else ""
    return (f"> --tokenizer-type NullTokenizer --vocab-size {n}: ids 0-{n - 1} and the end-of-document id {n}, {n + 1} "
            f"in all, as Megatron-LM up to core_v0.17 reads it (the flags do not tell the release); from "
            f"core_v0.18.0 on it reads {n} ids, the last ({n - 1}) ending a document: for that model and those masks "
            f"pass --vocab-size {n - 1}{load}")


def is_megatron_launch(preset_named: bool, dests_given: Iterable[str]) -> bool:
    return not preset_named and any(dest in MODEL_SETTINGS for dest in dests_given)


def _megatron_value(action: argparse.Action, harvested_flags: dict, generation: Optional[str]) -> tuple[bool, Any]:
    if not action.option_strings or stores_a_constant(action):
        return False, None
    # the generation's own file first, in any spelling (the v1.1.5 forks' --warmup is --lr-warmup-fraction)
    stated = None
    if generation and action.dest not in GENERATION_DEFAULT_NOT_TAKEN:
        stated = _stated(generation, action.option_strings, harvested_flags)
    found, theirs = stated if stated is not None else megatron_default(action.option_strings[0], harvested_flags)
    # an empty list cannot be a flag's value: it is our own default
    return found and theirs is not None and theirs != "" and theirs != [], one_value(action, theirs)


def one_value(action: argparse.Action, theirs: Any) -> Any:
    """Megatron's nargs "+" default of one value (--cp-comm-type's ['p2p']) is that value for a setting of ours that
    holds one."""
    if isinstance(theirs, list) and len(theirs) == 1 and action.nargs is None:
        return theirs[0]
    return theirs


def _warmup_aware(generation: Optional[str], dest: str, given: Iterable[str]) -> Optional[str]:
    """The generation to read `dest`'s default from: the newest for a warmup length beside another the launch gives, so
    an old fork's --warmup 0.01 does not join the launch's own."""
    return None if dest in WARMUP_SETTINGS and set(given) & set(WARMUP_SETTINGS) - {dest} else generation


def megatron_default_argv(parser: argparse.ArgumentParser, settings: Iterable[str], harvested_flags: dict,
                          dests_given: Iterable[str], generation: Optional[str] = None) -> list[str]:
    """Flags putting Megatron's default (of `generation`) under every setting the launch leaves out, where a preset
    would stand, and one accumulation step where no global batch is given."""
    settings, given = set(settings), set(dests_given)
    argv: list[str] = []
    for action in option_table(parser):
        if action.dest not in settings or action.dest in OURS_STAND or action.dest in SWITCHED_DEFAULTS \
                or action.dest in FILE_FORMAT_DEFAULTS:
            continue
        if action.dest in given:
            continue  # the launch's own value stands
        found, theirs = _megatron_value(action, harvested_flags, _warmup_aware(generation, action.dest, given))
        if not found:
            continue
        option = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(option if theirs else "--no-" + option[2:])
        elif isinstance(theirs, bool):
            continue  # a store_true flag whose default is already Megatron's
        else:
            argv.append(f"{option}={theirs}")
    # Megatron's GeLU is the exact (erf) one unless --openai-gelu
    argv.append("--activation=gelu")
    if not given & set(GLOBAL_BATCH_SETTINGS):
        argv.append("--gradient-accumulation-steps=1")
    return argv


def _differs(ours: Any, theirs: Any) -> bool:
    if ours in (None, "") and theirs in (None, ""):
        return False
    if isinstance(ours, str) and isinstance(theirs, str):
        return ours.replace(" ", "") != theirs.replace(" ", "")  # "969,30,1" is "969, 30, 1"
    if isinstance(ours, str) and isinstance(theirs, int) and not isinstance(theirs, bool):
        return ours.strip() != str(theirs)  # --moe-layer-freq: our text "1" is their int 1
    if isinstance(ours, bool) or isinstance(theirs, bool) or not isinstance(ours, (int, float)) \
            or not isinstance(theirs, (int, float)):
        return ours != theirs
    return not math.isclose(float(ours), float(theirs), rel_tol=1e-12, abs_tol=0.0)


def as_typed(action: argparse.Action, text: str) -> Any:
    """A string default read through the option's type, as argparse does; the text itself where the type refuses it."""
    try:
        return action.type(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return text


def megatron_default_note(parser: argparse.ArgumentParser, settings: dict[str, Any], sources: dict[str, Source],
                          preset_given: bool, harvested_flags: dict, generation: Optional[str] = None) -> Optional[str]:
    """The start-up line naming each omitted value that is not Megatron's default here; None for a launch that is not
    Megatron-style or where every value is Megatron's."""
    if not is_megatron_launch(preset_given, [n for n in MODEL_SETTINGS if sources[n].kind in (FLAG, JSON)]):
        return None
    differences = []
    for action in option_table(parser):
        if action.dest not in settings or action.dest in OURS_STAND or action.dest in SWITCHED_DEFAULTS \
                or action.dest in FILE_FORMAT_DEFAULTS or sources[action.dest].kind not in (DEFAULT, PRESET):
            continue
        given = {d for d in WARMUP_SETTINGS if sources[d].kind in (FLAG, JSON)}
        found, theirs = _megatron_value(action, harvested_flags, _warmup_aware(generation, action.dest, given))
        if found and isinstance(theirs, str) and action.type is not None:
            theirs = as_typed(action, theirs)  # their spelling of our value
        if found and _differs(settings[action.dest], theirs):
            where = "ours" if sources[action.dest].kind == DEFAULT else sources[action.dest].describe()
            differences.append(f"{action.option_strings[0]} {settings[action.dest]} ({where}; Megatron-LM: {theirs})")
    if sources["activation"].kind in (DEFAULT, PRESET) and settings["activation"] != "gelu":
        differences.append(f"--activation {settings['activation']} ({sources['activation'].describe()}; "
                           f"Megatron-LM: the exact GeLU, --activation gelu, unless --openai-gelu)")
    if not differences:
        return None
    return ("> this launch sets the model from flags and leaves these out; they come from here, not from "
            "Megatron-LM's defaults (pass them to choose): " + ", ".join(differences))


def file_format_note(parser: argparse.ArgumentParser, settings: dict[str, Any], sources: dict[str, Source],
                     preset_given: bool, harvested_flags: dict, generation: Optional[str] = None) -> Optional[str]:
    """The start-up line naming each file-format default a saving Megatron launch left out whose Megatron default
    differs; None otherwise."""
    if not settings.get("save") or \
            not is_megatron_launch(preset_given, [n for n in MODEL_SETTINGS if sources[n].kind in (FLAG, JSON)]):
        return None
    differences = []
    for action in option_table(parser):
        if action.dest not in FILE_FORMAT_DEFAULTS or sources[action.dest].kind not in (DEFAULT, PRESET):
            continue
        found, theirs = _megatron_value(action, harvested_flags, generation)
        if found and theirs not in (None, "") and _differs(settings[action.dest], theirs):
            differences.append(f"{action.option_strings[0]} left out (Megatron-LM's default: {theirs}): "
                               f"{FILE_FORMAT_DEFAULTS[action.dest]}")
    return "> " + "; ".join(differences) if differences else None
