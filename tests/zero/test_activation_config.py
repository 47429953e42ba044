"""Activation checkpointing (ZeRO-R) settings: flags, validation, and DeepSpeed's activation_checkpointing block."""

import dataclasses
import json

import pytest

from arguments.config import ConfigError, PretrainConfig, field_sections
from arguments.deepspeed.translation import EXAMPLE_DIR, deepspeed_config_to_flags
from arguments.parser import build_parser, parse_arguments, parse_config
from tests.zero.test_zero_config import assert_bad_json_names, write_json
from zero.config import ActivationCheckpointConfig

FLAGS = {
    "checkpoint_activations": "--checkpoint-activations",
    "checkpoint_num_layers": "--checkpoint-num-layers",
    "partition_activations": "--partition-activations",
    "cpu_checkpointing": "--cpu-checkpointing",
    "contiguous_checkpointing": "--contiguous-checkpointing",
    "number_checkpoints": "--number-checkpoints",
    "synchronize_checkpoint_boundary": "--synchronize-checkpoint-boundary",
    "profile_checkpointing": "--profile-checkpointing",
    "recompute_method": "--recompute-method",
}



def test_defaults_turn_everything_off():
    assert PretrainConfig().activations == ActivationCheckpointConfig(
        checkpoint_activations=False, checkpoint_num_layers=1, partition_activations=False,
        cpu_checkpointing=False, contiguous_checkpointing=False, number_checkpoints=None,
        synchronize_checkpoint_boundary=False, profile_checkpointing=False)
    assert parse_config([]).activations == PretrainConfig().activations
    assert "activations" in PretrainConfig.SECTIONS and "activations" in PretrainConfig().to_dict()


def test_every_field_is_a_flag_in_its_own_group():
    assert {name for name, section in field_sections().items() if section == "activations"} == set(FLAGS)
    group = next(g for g in build_parser()._action_groups if g.title == "activation checkpointing (ZeRO-R)")
    options = {a.dest: a.option_strings[0] for a in group._group_actions}
    assert options == FLAGS


def test_every_flag_sets_its_field():
    config = parse_config(["--checkpoint-activations", "--checkpoint-num-layers", "2", "--partition-activations",
                           "--cpu-checkpointing", "--contiguous-checkpointing", "--number-checkpoints", "3",
                           "--synchronize-checkpoint-boundary", "--profile-checkpointing", "--recompute-method",
                           "block"])
    assert config.activations == ActivationCheckpointConfig(True, 2, True, True, True, 3, True, True, "block")
    assert config.to_dict()["activations"]["number_checkpoints"] == 3
    off = parse_config(["--checkpoint-activations", "--partition-activations", "--no-partition-activations"])
    assert off.activations.checkpoint_activations and not off.activations.partition_activations


def test_cpu_checkpointing_without_partitioning_is_allowed():
    activations = parse_config(["--checkpoint-activations", "--cpu-checkpointing"]).activations
    assert activations.cpu_checkpointing and not activations.partition_activations


def test_yaml_preset_may_set_them(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("checkpoint_activations: true\ncheckpoint-num-layers: 2\npartition_activations: true\n")
    activations = parse_config(["--config", str(preset)]).activations
    assert (activations.checkpoint_activations, activations.checkpoint_num_layers,
            activations.partition_activations) == (True, 2, True)


def test_number_of_checkpoints_and_the_buffer_size():
    activations = ActivationCheckpointConfig(checkpoint_activations=True, checkpoint_num_layers=3)
    assert [activations.num_checkpoints(n) for n in (3, 4, 6, 7, 48)] == [1, 2, 2, 3, 16]
    assert activations.buffer_checkpoints(7) == 3
    activations = dataclasses.replace(activations, number_checkpoints=5)
    assert activations.buffer_checkpoints(7) == 5 and activations.num_checkpoints(7) == 3


@pytest.mark.parametrize("flag", ["--partition-activations", "--cpu-checkpointing", "--contiguous-checkpointing",
                                  "--synchronize-checkpoint-boundary", "--profile-checkpointing"])
def test_options_need_checkpoint_activations(flag):
    with pytest.raises(ConfigError) as error:
        parse_config([flag])
    assert str(error.value).startswith(f"{flag} needs --checkpoint-activations")
    assert "\n" not in str(error.value)
    parse_config([flag, "--checkpoint-activations"])  # and with it, fine


@pytest.mark.parametrize("argv, words", [
    (["--number-checkpoints", "4"], "--number-checkpoints needs --checkpoint-activations"),
    (["--checkpoint-activations", "--checkpoint-num-layers", "0"], "--checkpoint-num-layers must be at least 1"),
    (["--checkpoint-num-layers", "0"], "--checkpoint-num-layers must be at least 1"),
    (["--checkpoint-activations", "--number-checkpoints", "0"], "--number-checkpoints must be at least 1"),
    (["--checkpoint-activations", "--checkpoint-num-layers", "5"],
     "--checkpoint-num-layers 5 is larger than --num-layers 4"),
    (["--checkpoint-activations", "--contiguous-checkpointing", "--number-checkpoints", "3"],
     "--number-checkpoints 3 is fewer than the 4 checkpoints of --num-layers 4 / --checkpoint-num-layers 1"),
    (["--checkpoint-activations", "--num-layers", "5", "--checkpoint-num-layers", "2", "--number-checkpoints", "2"],
     "--number-checkpoints 2 is fewer than the 3 checkpoints of --num-layers 5 / --checkpoint-num-layers 2"),
    (["--checkpoint-num-layers", "x"],
     "argument --checkpoint-num-layers/--recompute-num-layers/--activations-checkpoint-num-layers: invalid int value"),
])
def test_bad_settings_name_the_flags(argv, words):
    with pytest.raises(ConfigError) as error:
        parse_config(argv)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_enough_checkpoints_pass():
    config = parse_config(["--checkpoint-activations", "--num-layers", "5", "--checkpoint-num-layers", "2",
                           "--contiguous-checkpointing", "--number-checkpoints", "3"])
    assert config.activations.buffer_checkpoints(config.model.num_layers) == 3
    # Depth checks apply only with checkpointing on: the group size does nothing otherwise.
    assert parse_config(["--checkpoint-num-layers", "8"]).activations.checkpoint_num_layers == 8


def test_json_block_maps_to_flags_and_turns_checkpointing_on():
    block = {"partition_activations": True, "cpu_checkpointing": False, "contiguous_memory_optimization": True,
             "number_checkpoints": 8, "synchronize_checkpoint_boundary": False, "profile": True}
    assert deepspeed_config_to_flags({"activation_checkpointing": block}, "x").argv == [
        "--partition-activations", "--no-cpu-checkpointing", "--contiguous-checkpointing", "--number-checkpoints",
        "8", "--no-synchronize-checkpoint-boundary", "--profile-checkpointing", "--checkpoint-activations"]


def test_json_block_with_everything_off_leaves_checkpointing_alone():
    block = {"partition_activations": False, "cpu_checkpointing": False, "contiguous_memory_optimization": False,
             "number_checkpoints": None, "synchronize_checkpoint_boundary": False, "profile": False}
    flags = deepspeed_config_to_flags({"activation_checkpointing": block}, "x").argv
    assert "--checkpoint-activations" not in flags and "--number-checkpoints" not in flags
    assert deepspeed_config_to_flags({"activation_checkpointing": {}}, "x").argv == []
    assert not parse_config(["--zero-config", "stage2"]).activations.checkpoint_activations


def test_json_block_reaches_the_config_and_a_flag_beside_it_wins(tmp_path):
    """Until issue 22 a flag that disagreed with the block was an error; Megatron-DeepSpeed passes its flags
    to deepspeed.checkpointing.configure, which lets each overwrite the JSON's value, and its
    --checkpoint-activations decides whether to checkpoint: the flag wins, named in the warning line."""
    path = write_json(tmp_path, {"activation_checkpointing": {"partition_activations": True, "profile": True}})
    activations = parse_config(["--zero-config", str(path)]).activations
    assert (activations.checkpoint_activations, activations.partition_activations,
            activations.profile_checkpointing) == (True, True, True)
    parsed = parse_arguments(["--zero-config", str(path), "--no-profile-checkpointing"])
    assert (parsed.config.activations.profile_checkpointing, parsed.config.activations.partition_activations) == \
        (False, True)
    assert any(f"activation_checkpointing.profile (--profile-checkpointing) in {path}: --no-profile-checkpointing "
               f"wins" in note for note in parsed.notes)
    parsed = parse_arguments(["--zero-config", str(path), "--no-checkpoint-activations"])
    assert not parsed.config.activations.checkpoint_activations
    assert any(f"activation_checkpointing (--checkpoint-activations) in {path}: --no-checkpoint-activations wins"
               in note for note in parsed.notes)
    assert parse_config(["--zero-config", str(path), "--profile-checkpointing"]).activations.profile_checkpointing


@pytest.mark.parametrize("config, words", [
    ({"activation_checkpointing": {"foo": True}}, 'activation_checkpointing.foo (unknown key'),
    ({"activation_checkpointing": {"contiguous_memory_optimisation": True}},
     'activation_checkpointing.contiguous_memory_optimisation (unknown key; did you mean '
     '"activation_checkpointing.contiguous_memory_optimization"?)'),
    ({"activation_checkpointing": True}, 'ds.json: "activation_checkpointing" must be an object'),
    ({"activation_checkpointing": {"partition_activations": "yes"}},
     "ds.json: activation_checkpointing.partition_activations must be true or false"),
    ({"activation_checkpointing": {"number_checkpoints": 2.5}},
     "ds.json: activation_checkpointing.number_checkpoints must be a whole number"),
    ({"activation_checkpointing": {"number_checkpoints": 0}}, "ds.json: --number-checkpoints must be at least 1"),
])
def test_bad_json_block_names_the_key_and_the_file(config, words, tmp_path):
    assert_bad_json_names(tmp_path, config, words)


def test_too_few_json_checkpoints_for_the_model_are_caught(tmp_path):
    path = write_json(tmp_path, {"activation_checkpointing": {"contiguous_memory_optimization": True,
                                                              "number_checkpoints": 2}})
    with pytest.raises(ConfigError, match="--number-checkpoints 2 is fewer than the 4 checkpoints"):
        parse_config(["--zero-config", str(path)])
    # the preset named: a launch that sets the model from flags alone is Megatron's, which reads no block
    # without --deepspeed-activation-checkpointing (tests/arguments/test_deepspeed_checkpointing_block.py)
    assert parse_config(["--config", "tiny", "--zero-config", str(path), "--num-layers", "2"]
                        ).activations.number_checkpoints == 2


def test_example_stage3_pa():
    block = json.loads((EXAMPLE_DIR / "stage3_pa.json").read_text())["activation_checkpointing"]
    assert block["partition_activations"] is True and block["contiguous_memory_optimization"] is True
    config = parse_config(["--zero-config", "stage3_pa"])
    assert (config.zero.stage, config.training.precision) == (3, "bf16")
    activations = config.activations
    assert (activations.checkpoint_activations, activations.partition_activations,
            activations.contiguous_checkpointing, activations.cpu_checkpointing,
            activations.number_checkpoints) == (True, True, True, False, None)
    assert activations.buffer_checkpoints(config.model.num_layers) == config.model.num_layers
