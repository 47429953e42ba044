"""Where a Megatron launch leaves a setting out: Megatron's own default, read from its argument files.

A launch that sets the model from flags (`--num-layers`, `--hidden-size`, `--num-attention-heads` on
the command line or in the JSON) and names no preset (`--config`) is a Megatron-style script: whatever
it leaves out takes the default of Megatron-LM's argument files (arguments/megatron/flags_harvested.json,
newest source first), expression defaults such as `2 ** 32` included, and the global batch is micro batch
x data-parallel size when neither it nor the accumulation steps are given, as in Megatron-LM. The same
command line then trains what Megatron trains. A preset applies only when it is named, or to the bare
main job that names no model (the README's `python pretrain_gpt.py` trains `tiny`).

Defaults follow the Megatron generation the launch's flags belong to (`launch_generation`): a script that
passes `--batch-size` (which only DeepSpeedExamples' forks read) gets a v1.1.5 fork's `--warmup 0.01`, and
one that also passes the 2020 fork's `--lazy-loader` gets that fork's `--split 1000,1,1`; a setting that
generation lacks takes the newest default.

Where one of our own values must still stand, `megatron_default_note` names it in one line at the start;
under a plain Megatron launch that line is empty.
"""

from __future__ import annotations

import argparse
import ast
import math
import operator
from typing import Any, Iterable, Optional, Sequence

from arguments.config_sources import DEFAULT, FLAG, JSON, MEGATRON_DEFAULTS, PRESET, Source  # noqa: F401
from arguments.option_table import option_table, stores_a_constant

# Megatron-LM's argument files, newest first (its current file leaves some defaults to dataclasses).
DEFAULT_SOURCES = ("megatron-lm", "megatron-lm-core_v0.15.0", "megatron-lm-23.04", "megatron-lm-v2.6")
# (--hybrid-layer-pattern sets the depth in place of --num-layers: Megatron-LM's hybrid launches omit the latter)
MODEL_SETTINGS = ("num_layers", "hidden_size", "num_attention_heads", "hybrid_layer_pattern")
# Megatron-LM's global batch when none is given (arguments.py: `args.global_batch_size =
# args.micro_batch_size * args.data_parallel_size`), said as one accumulation step per rank.
# One warmup length: where a launch gives one, an old generation's default of another (--warmup 0.01) does
# not apply beside it.
WARMUP_SETTINGS = ("lr_warmup_iters", "lr_warmup_fraction", "lr_warmup_samples", "lr_warmup_tokens")
GLOBAL_BATCH_SETTINGS = ("global_batch_size", "accumulation_steps", "rampup_batch_size", "step_batch_size_schedule")
# Megatron's defaults a Megatron launch does not take, each with why (none today: --num-workers takes
# Megatron's 2, and a rank started as a daemonic process, which may not fork workers, loads in-process
# instead: data/sampler.py). A setting added here is also named in the start-up line's test.
OURS_STAND: dict[str, str] = {}
# Megatron defaults of how files are written, not of the math, that a Megatron launch does not take, each with
# why: said in their own start-up line where the launch saves (file_format_note), apart from the line naming
# differences in what it computes.
FILE_FORMAT_DEFAULTS: dict[str, str] = {
    "ckpt_format": "--save writes this project's checkpoints (verified on load, resumed at any layout); "
                   "--ckpt-format torch_dist writes Megatron-LM's"}
# Megatron defaults that hold only under a switch the launch may leave out: Megatron-LM's --num-query-groups
# 1 is read only with --group-query-attention (core_transformer_config_from_args), which
# arguments/megatron/flags.py resolves; without it attention is multi-head, our default.
SWITCHED_DEFAULTS: dict[str, str] = {
    "num_query_groups": "Megatron-LM reads its default (1) only under --group-query-attention"}
# Settings whose default an older generation's file states but whose meaning there is not this setting's:
# the newest default applies. Megatron-DeepSpeed's and its forks' ZeRO flags (--zero-stage 1.0 ...) are parsed
# and never read: DeepSpeed's JSON governs them (arguments/deepspeed/precedence.py); their activation-checkpointing
# flags (--partition-activations ...) are read only under --deepspeed-activation-checkpointing, off by default as
# ours (arguments/megatron/deepspeed_checkpointing_flags.py); the 2020 fork's --vocab-size 30522 sized a tokenizer
# it created, where ours is NullTokenizer's vocabulary.
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
    """A harvested default written as an expression: numbers and arithmetic (`2 ** 32`), or an enum's
    member (`AttnBackend.auto` is our `auto`); anything else is not a value this side can take."""
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
    """(found, Megatron's default for `option`) from the newest source that states one; an expression
    default is evaluated (`2 ** 32` is 4294967296), and one that is not arithmetic is not found."""
    for source in DEFAULT_SOURCES:
        stated = _stated(source, [option], harvested_flags)
        if stated is not None:
            return stated
    return False, None


def _stated(source: str, spellings: Sequence[str], harvested_flags: dict) -> Optional[tuple[bool, Any]]:
    """(found, value) where `source`'s file states a default for one of `spellings`, else None."""
    for spelling in spellings:
        defaults = harvested_flags.get(spelling, {}).get("defaults", {})
        if source in defaults:
            theirs = defaults[source]
            return _evaluate(theirs.get("expr", "")) if isinstance(theirs, dict) else (True, theirs)
    return None


# llm-jp's and swiss-ai's Megatron-LM forks (scripts/tools/harvest_megatron_flags.sh): Megatron-LM's validate_args, with
# its refusals of --batch-size, --warmup and --model-parallel-size.
PRETRAINING_FORKS = ("llm-jp-megatron-lm-v4", "llm-jp-megatron-lm-nii-geniac", "swiss-ai-megatron-lm")
# ALCF's fork of Megatron-DeepSpeed (argonne-lcf/Megatron-DeepSpeed, the AuroraGPT runs): its validate_args refuses
# --batch-size, --warmup and --model-parallel-size as Megatron-DeepSpeed's does; a launch it fits no better than
# Megatron-DeepSpeed's own file is Megatron-DeepSpeed's
ALCF_FORK = "alcf-megatron-deepspeed"
LOLA_FORK = "lola-megatron-deepspeed"  # dice-group/LOLA's Megatron-DeepSpeed fork, its own flags only (fork_flag_classes.py)
PAI_MEGATRON_PATCH = "pai-megatron-patch"  # its own flags only (megatron_patch/arguments.py), all refused

# Flags a generation parses only to refuse them: from Megatron-LM v2.6 on, and in Megatron-DeepSpeed and
# BigScience's fork of it, validate_args asserts `args.batch_size is None` ("--batch-size argument is no
# longer valid, use --micro-batch-size instead"), and the same of --warmup and --model-parallel-size. A launch
# that types one ran where it is read (DeepSpeedExamples' forks), so it counts for none of these generations.
REFUSING_GENERATIONS = ("megatron-lm", "megatron-lm-core_v0.15.0", "megatron-lm-23.04", "megatron-lm-v2.6",
                        "megatron-deepspeed", "bigscience-megatron-deepspeed", *PRETRAINING_FORKS, ALCF_FORK, LOLA_FORK)
REFUSED_WHERE_PARSED = {flag: REFUSING_GENERATIONS for flag in ("--batch-size", "--warmup", "--model-parallel-size")}
# DeepSpeedExamples' forks, newest Megatron-LM first (their harvested files share one commit date): the v1.1.5
# forks before the 2020 fork of an older Megatron-LM, so a tie goes to the newest code, as between Megatron-LM's.
FORKS_NEWEST_FIRST = ("dse-megatron-lm-v1.1.5-zero3", "dse-megatron-lm-v1.1.5-3d", "dse-megatron-lm")
# The pretraining forks of Megatron-LM (arguments/megatron/fork_flag_classes.py) come last: a launch they fit no
# better than Megatron-LM's own files or DeepSpeedExamples' is one of those; one typing a fork's own flag
# (--trigger-path, --use-mpi) fits its fork best and takes its defaults (swiss-ai's --lr-wsd-decay-style 1-sqrt).


def equally_fitting_generations(argv: Iterable[str], harvested_flags: dict, sources: Sequence[dict]) -> list[str]:
    """The Megatron argument file (a harvested source's label) that defines the most of the harvested
    Megatron flags the launch types, Megatron-LM's own files first and newest first where several define as
    many; None where the launch types none. Counting, not requiring all, keeps a flag of another generation
    (an alias accepted here, a tokenizer path a replay adds) from hiding the generation. DeepSpeed's own
    flags (--deepspeed, --deepspeed_config), which scripts of every generation add, say nothing, and a flag
    counts for no generation that parses it only to refuse it (REFUSED_WHERE_PARSED). All the files that
    define as many, in that order (the first is `launch_generation`); none where the launch types none."""
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
    """The Megatron generation of the launch: the first of `equally_fitting_generations`, or None."""
    return next(iter(equally_fitting_generations(argv, harvested_flags, sources)), None)


# The generations whose NullTokenizer reads --vocab-size N as N ids, the last one ending a document (Megatron-LM
# core_v0.18.0 on, megatron/core/tokenizers/text/libraries/null_tokenizer.py @ d98e8a64, --null-tokenizer-eod-id
# beside it); the older ones, and data/tokenizer.py here, as N ids plus an end-of-document id N
# (megatron/training/tokenizer/tokenizer.py _NullTokenizer @ core_v0.16.1). None: a launch that fits no generation.
NULL_TOKENIZER_N_IDS = (None, "megatron-lm")


def null_tokenizer_note(tokenizer_type: Optional[str], vocab_size: int, generation: Optional[str]) -> Optional[str]:
    """The start-up line of a NullTokenizer launch whose generation reads --vocab-size otherwise than here."""
    if tokenizer_type != "NullTokenizer" or generation not in NULL_TOKENIZER_N_IDS or vocab_size < 2:
        return None
    n = vocab_size
    return (f"> --tokenizer-type NullTokenizer --vocab-size {n}: ids 0-{n - 1} and the end-of-document id {n}, {n + 1} "
            f"in all, as Megatron-LM up to core_v0.17; from core_v0.18.0 on it reads {n} ids, the last ({n - 1}) "
            f"ending a document: for that model and those masks pass --vocab-size {n - 1}")


def is_megatron_launch(preset_named: bool, dests_given: Iterable[str]) -> bool:
    """A launch that names no preset and sets the model from flags or its JSON."""
    return not preset_named and any(dest in MODEL_SETTINGS for dest in dests_given)


def _megatron_value(action: argparse.Action, harvested_flags: dict, generation: Optional[str]) -> tuple[bool, Any]:
    if not action.option_strings or stores_a_constant(action):
        return False, None
    # the generation's own file first, in any of the setting's spellings (the v1.1.5 forks' --warmup is
    # --lr-warmup-fraction); a setting it does not state, or states with another meaning, takes the newest
    stated = None
    if generation and action.dest not in GENERATION_DEFAULT_NOT_TAKEN:
        stated = _stated(generation, action.option_strings, harvested_flags)
    found, theirs = stated if stated is not None else megatron_default(action.option_strings[0], harvested_flags)
    # an empty list (--cuda-graph-modules' []) cannot be written as a flag's value: it is the setting's own default
    return found and theirs is not None and theirs != "" and theirs != [], one_value(action, theirs)


def one_value(action: argparse.Action, theirs: Any) -> Any:
    """Megatron's nargs "+" default of one value (--cp-comm-type's ['p2p'], one per layer there) is that value for
    a setting of ours that holds one."""
    if isinstance(theirs, list) and len(theirs) == 1 and action.nargs is None:
        return theirs[0]
    return theirs


def _warmup_aware(generation: Optional[str], dest: str, given: Iterable[str]) -> Optional[str]:
    """The generation to read `dest`'s default from: none (the newest) for a warmup length beside another
    the launch gives, so an old fork's default --warmup 0.01 is not put beside the launch's own warmup."""
    return None if dest in WARMUP_SETTINGS and set(given) & set(WARMUP_SETTINGS) - {dest} else generation


def megatron_default_argv(parser: argparse.ArgumentParser, settings: Iterable[str], harvested_flags: dict,
                          dests_given: Iterable[str], generation: Optional[str] = None) -> list[str]:
    """The flags that put Megatron-LM's default (of the launch's `generation`) under every setting a Megatron
    launch may leave out (the layer a preset fills otherwise), and one accumulation step where no global
    batch is given."""
    settings, given = set(settings), set(dests_given)
    argv: list[str] = []
    for action in option_table(parser):
        if action.dest not in settings or action.dest in OURS_STAND or action.dest in SWITCHED_DEFAULTS \
                or action.dest in FILE_FORMAT_DEFAULTS:
            continue
        if action.dest in given:
            continue  # the launch's own value stands (an old file's default may be a choice not offered here)
        found, theirs = _megatron_value(action, harvested_flags, _warmup_aware(generation, action.dest, given))
        if not found:
            continue
        option = action.option_strings[0]
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(option if theirs else "--no-" + option[2:])
        elif isinstance(theirs, bool):
            continue  # a store_true flag of ours whose default is already Megatron's (False)
        else:
            argv.append(f"{option}={theirs}")
    # Megatron has no --activation: its GeLU is the exact (erf) one unless --openai-gelu asks for tanh's.
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
        return ours.strip() != str(theirs)  # --moe-layer-freq: our text "1" is their int 1 (moe_freq_type)
    if isinstance(ours, bool) or isinstance(theirs, bool) or not isinstance(ours, (int, float)) \
            or not isinstance(theirs, (int, float)):
        return ours != theirs
    return not math.isclose(float(ours), float(theirs), rel_tol=1e-12, abs_tol=0.0)


def as_typed(action: argparse.Action, text: str) -> Any:
    """A string default read through the option's type, as argparse reads a string default; the text
    itself where the type refuses it (a value of theirs that is no value of ours)."""
    try:
        return action.type(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return text


def megatron_default_note(parser: argparse.ArgumentParser, settings: dict[str, Any], sources: dict[str, Source],
                          preset_given: bool, harvested_flags: dict, generation: Optional[str] = None) -> Optional[str]:
    """The start line naming each value a Megatron launch left out that is not Megatron's default here,
    or None when the launch is not Megatron-style or every such value is Megatron's."""
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
            theirs = as_typed(action, theirs)  # their spelling of our value (Megatron-DeepSpeed's layernorm)
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
    """The start line naming each file-format default (FILE_FORMAT_DEFAULTS) a saving Megatron launch left out
    where its Megatron-LM generation's default differs (the newest: --ckpt-format torch_dist; a generation without
    the flag states none); None otherwise."""
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
