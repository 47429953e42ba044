"""Issue 34, point 1: a Megatron launch (model set by flags, no --config) gets Megatron-LM's defaults for
every setting it leaves out, read from the harvested argument files, expression defaults included; the
global batch is micro batch x data-parallel size when none is given.

Megatron-LM (github:NVIDIA/Megatron-LM, megatron/training/arguments.py, validate_args):
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
and `group.add_argument('--initial-loss-scale', type=float, default=2**32, ...)` (_add_mixed_precision_args),
which the harvest keeps as {"expr": "2 ** 32"}.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from arguments.batch_schedule import batch_schedule
from arguments.megatron.defaults import (
    FILE_FORMAT_DEFAULTS,
    GENERATION_DEFAULT_NOT_TAKEN,
    OURS_STAND,
    SWITCHED_DEFAULTS,
    WARMUP_SETTINGS,
    as_typed,
    megatron_default,
    one_value,
)
from arguments.megatron.harvested_flags import harvested
from arguments.parser import build_parser, parse_arguments
from base.errors import ConfigError
from base.options import setting_values

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2"]


def _flat(config) -> dict:
    return {name: value for section in config.SECTIONS for name, value in setting_values(getattr(config, section)).items()}


def _generation_default(action, flags, generation, warmup_given):
    """The default the launch's generation's own file states for the setting, in any of its spellings (None
    where it states none, a warmup beside the launch's own, or a flag whose meaning there is not ours)."""
    if generation is None or action.dest in GENERATION_DEFAULT_NOT_TAKEN \
            or (action.dest in WARMUP_SETTINGS and warmup_given - {action.dest}):
        return None
    for option in action.option_strings:
        defaults = flags.get(option, {}).get("defaults", {})
        if generation in defaults and not isinstance(defaults[generation], dict):
            return (True, defaults[generation])
    return None


def _from_a_block_megatron_does_not_let_deepspeed_read(source) -> bool:
    """A value taken from the JSON's optimizer block, which no Megatron generation lets DeepSpeed read: each
    hands deepspeed.initialize an optimizer (or param groups) built from its flags, so the flags' defaults
    run (tests/arguments/test_deepspeed_client_objects.py cites the code of each generation)."""
    return source.kind == "json" and ": optimizer." in source.origin


def _left_out_against_megatron(parsed) -> list[str]:
    """Each setting the launch left out whose value is not the harvested Megatron default of its generation
    (the newest Megatron-LM's where that generation's file states none). A value from a JSON block the real
    pair does not read counts as left out."""
    flags, values, sources = harvested()["flags"], _flat(parsed.config), parsed.config.sources
    warmup_given = {dest for dest in WARMUP_SETTINGS if sources[dest].kind in ("flag", "json")}
    wrong = []
    for action in build_parser()._actions:
        if action.dest not in values or action.dest in OURS_STAND or action.dest in SWITCHED_DEFAULTS \
                or action.dest in FILE_FORMAT_DEFAULTS \
                or not action.option_strings or isinstance(action, argparse._StoreConstAction) \
                or not (sources[action.dest].kind in ("default", "preset")
                        or _from_a_block_megatron_does_not_let_deepspeed_read(sources[action.dest])):
            continue
        found, theirs = (_generation_default(action, flags, parsed.megatron_generation, warmup_given)
                         or megatron_default(action.option_strings[0], flags))
        if not found or theirs is None or theirs == "":
            continue
        ours = values[action.dest]
        theirs = one_value(action, theirs)  # --cp-comm-type's ['p2p'] (a type per layer there) is p2p
        if isinstance(theirs, str) and action.type is not None:
            theirs = as_typed(action, theirs)  # their spelling of our value (Megatron-DeepSpeed's layernorm)
        same = (str(ours).replace(" ", "") == str(theirs).replace(" ", "")) if isinstance(theirs, str) \
            else ours == theirs
        if not same:
            wrong.append(f"{action.option_strings[0]} {ours!r} (Megatron-LM: {theirs!r})")
    return wrong


def test_every_setting_a_megatron_launch_leaves_out_is_megatrons_harvested_default():
    assert megatron_default("--initial-loss-scale", harvested()["flags"]) == (True, 2 ** 32)  # an expression
    parsed = parse_arguments(MODEL)
    assert _left_out_against_megatron(parsed) == []
    config = parsed.config
    # the values the tiny preset used to put under such a launch (issue 34, "Why" point 3)
    assert (config.model.mlp.activation, config.optimizer.adam_beta2, config.optimizer.min_lr,
            config.optimizer.lr_warmup_iters, config.training.mixed_precision.initial_loss_scale) == ("gelu", 0.999, 0.0, 0, 2.0 ** 32)
    assert config.data.num_workers == 2 and OURS_STAND == {}  # Megatron's, no longer ours (0) left unsaid
    assert not [note for note in parsed.notes if "leaves these out" in note]
    # a named preset, or the bare main job, still trains the preset
    assert parse_arguments([]).config.optimizer.min_lr == 1e-4
    assert parse_arguments(["--config", "tiny", *MODEL]).config.optimizer.adam_beta2 == 0.95


def test_a_launch_giving_only_the_micro_batch_trains_micro_batch_times_data_parallel():
    """DeepSpeedExamples' Megatron-LM-v1.1.5-ZeRO3 run_gpt_1gpu.sh passes only --batch-size: on 2 ranks
    Megatron runs a global batch of 2 x 2 = 4 (was 32, from the tiny preset)."""
    config = parse_arguments([*MODEL, "--batch-size", "2"]).config
    assert batch_schedule(config, 2, deepspeed_check=False).global_batch_size == 4


def test_a_warmup_fraction_launch_is_not_told_of_a_warmup_in_iterations():
    parsed = parse_arguments([*MODEL, "--lr-warmup-fraction", "0.1"])
    assert parsed.config.optimizer.lr_warmup_iters == 0
    assert not [note for note in parsed.notes if "--lr-warmup-iters" in note]


def _corpus_launches():
    """The launches meant to train; one whose flags are still refused today (the replay corpus test's
    FLAGS_REFUSED_TODAY) is a strict xfail, so the fix that lets it parse must drop it from that list."""
    from tests.replay_corpus import CORPUS
    from tests.scripts.test_replay_corpus import FLAGS_REFUSED_TODAY
    return [pytest.param(launch, id=launch.name, marks=[pytest.mark.xfail(
                reason=FLAGS_REFUSED_TODAY[launch.name], raises=ConfigError, strict=True)]
                if launch.name in FLAGS_REFUSED_TODAY else [])
            for launch in CORPUS if launch.refusal is None]


@pytest.mark.parametrize("launch", _corpus_launches())
def test_every_setting_a_corpus_launch_leaves_out_takes_megatrons_default(launch, tmp_path):
    """Issue 34, point 6 (last sentence), and the acceptance's "the differs-from-Megatron line is empty
    for every corpus launch"."""
    from tests.replay_corpus.shrink import LocalFiles, shrink

    shrunk = shrink(launch, LocalFiles(str(tmp_path / "data" / "corpus_text_document"), str(tmp_path / "tokenizer"),
                                       512, str(tmp_path / "out")))
    for path, text in shrunk.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    parsed = parse_arguments(shrunk.argv)
    assert _left_out_against_megatron(parsed) == []
    assert not [note for note in parsed.notes if "leaves these out" in note]


def _shrunk(name, tmp_path, drop=()):
    """A corpus launch, shrunk, without the flags in `drop` (and their values)."""
    from tests.replay_corpus import CORPUS
    from tests.replay_corpus.shrink import LocalFiles, shrink

    shrunk = shrink(next(launch for launch in CORPUS if launch.name == name),
                    LocalFiles(str(tmp_path / "data" / "corpus_text_document"), str(tmp_path / "tokenizer"), 512,
                               str(tmp_path / "out")))
    for path, text in shrunk.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    argv, skip = [], False
    for token in shrunk.argv:
        if skip:
            skip = False
        elif token in drop:
            skip = True
        else:
            argv.append(token)
    return argv


def test_an_old_generation_launch_gets_its_own_generations_defaults(tmp_path):
    """Issue 34, point 1: "the default of the Megatron generation its flags belong to". DeepSpeedExamples'
    2020 Megatron-LM fork (microsoft/DeepSpeedExamples@89ce0d5a megatron/Megatron-LM/arguments.py) defines
    `--batch-size` (line 105, no later Megatron-LM does) and `--split` default '1000,1,1' (line 260), where
    Megatron-LM v2.6 to 23.04 default to '969, 30, 1'. Its ds_pretrain_gpt2.sh, without its --split, splits
    as that fork did; a launch in today's spelling (--micro-batch-size) gets today's default."""
    argv = _shrunk("deepspeedexamples-ds-pretrain-gpt2", tmp_path, drop=("--split",))
    assert "--batch-size" in argv
    parsed = parse_arguments(argv)
    assert (parsed.megatron_generation, parsed.config.data.split) == ("dse-megatron-lm", "1000,1,1")
    assert not [note for note in parsed.notes if "leaves these out" in note]
    newer = parse_arguments([*MODEL, "--micro-batch-size", "2"])
    assert newer.megatron_generation == "megatron-lm" and newer.config.data.split.replace(" ", "") == "969,30,1"
    # the fork's --warmup default 0.01 (line 143) is its warmup where the launch gives none
    assert parse_arguments([token for token in argv if token not in ("--warmup", ".01")]
                           ).config.optimizer.lr_warmup_fraction == 0.01


def test_a_saving_megatron_launch_without_ckpt_format_says_which_files_it_writes():
    """Megatron-LM's --ckpt-format defaults to torch_dist (megatron/training/arguments.py, harvested); left out here
    --save writes this project's format: a difference in the files, said in its own start-up line."""
    launch = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
              "--max-position-embeddings", "32", "--tokenizer-type", "NullTokenizer", "--vocab-size", "100",
              "--mock-data"]

    def said(argv):
        return [note for note in parse_arguments(argv).notes if note.startswith("> --ckpt-format left out")]

    assert said(launch + ["--save", "/nonexistent/save"]) == [
        "> --ckpt-format left out (Megatron-LM's default: torch_dist): --save writes this project's checkpoints "
        "(verified on load, resumed at any layout); --ckpt-format torch_dist writes Megatron-LM's"]
    assert said(launch + ["--save", "/nonexistent/save", "--ckpt-format", "torch_dist"]) == []
    assert said(launch) == []  # nothing saved, nothing to say
