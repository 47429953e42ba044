"""ConfigError carries the flags it is about (issue 35, point 3), and the inherited-value clause of
arguments/config_sources.py reads them instead of a regex over the message.

The walk below builds one invalid config per check that PretrainConfig.validate reaches and asserts
that the error's `flags` are the options its message names, in order; a regex over the message is
fine here, in a test, where the product must not use one. A message may name a flag only as a fix to
type (`--no-bf16`) or as a pointer elsewhere (`--stage3-prefetch-bucket-size`): such flags are
listed per case as prose, and must not be carried, since a clause saying where their value came
from would name the wrong thing.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from pathlib import Path

import pytest

from arguments.config import PretrainConfig, field_sections
from arguments.option_table import option_table
from arguments.parser import build_parser, parse_config
from base.errors import ConfigError
from base.options import replace_settings

REPO = Path(__file__).resolve().parents[2]
# The modules whose raises PretrainConfig.validate reaches (validate, check_finite_numbers, check_bounds,
# the model and its sections, ZeRO, activation and pipeline-split checks, the step schedule's parser).
VALIDATE_MODULES = ("arguments/config.py", "arguments/bounds.py", "arguments/step_batch_schedule.py",
                    "gpt/model_config.py", "gpt/norms.py", "gpt/mlp.py", "gpt/positions.py", "gpt/attention_settings.py",
                    "gpt/mla_settings.py", "gpt/section_rules.py", "gpt/stage_layers.py", "zero/config.py",
                    "zero/optimizer_config.py", "zero/optimizer_algorithms.py", "zero/precision_settings.py",
                    "data/data_config.py", "data/fim_settings.py", "arguments/training_config.py",
                    "arguments/fault_handling.py", "arguments/checkpoint_config.py", "arguments/logging_config.py")
# Raises there that are not about a flag: from_flat's "unknown setting" names a YAML key or field.
NOT_ABOUT_A_FLAG = {("arguments/config.py", "from_flat")}
# How messages abbreviate two flags; the product carries the two real ones.
SHORTHANDS = {"--decoder-first/last-pipeline-num-layers":
              "--decoder-first-pipeline-num-layers --decoder-last-pipeline-num-layers"}

ROPE = {"position_embedding_type": "rope"}
PP2 = {"pipeline_model_parallel_size": 2}
# (settings changed from the tiny preset, flags the message names only as prose)
INVALID = [
    # model (gpt/model_config.py and its sections' files)
    ({"num_layers": 0}, ()), ({"ffn_hidden_size": 0}, ()),
    ({"hidden_size": 100, "num_attention_heads": 3}, ()), ({"seq_length": 256}, ()),
    ({"hidden_dropout": 1.0}, ()), ({"activation": "relu"}, ()), ({"init_method_std": 0.0}, ()),
    ({"vocab_size": -1}, ()), ({"attention_backend": "nope"}, ()),
    ({"normalization": "BatchNorm"}, ()), ({"position_embedding_type": "alibi"}, ()),
    ({**ROPE, "rotary_base": 0.0}, ()), ({**ROPE, "use_rope_scaling": True, "rope_scaling_factor": 0.0}, ()),
    ({**ROPE, "rotary_percent": 0.01}, ()), ({"num_query_groups": 3}, ()),
    ({"num_query_groups": 1, "tensor_model_parallel_size": 2, "qk_layernorm": True,
      "qk_layernorm_over_projection": True}, ()),
    ({"tensor_model_parallel_size": 3}, ()),
    ({"tensor_model_parallel_size": 2, "sequence_parallel": True, "seq_length": 127}, ()),
    # optimizer
    ({"lr_decay_style": "step"}, ()), ({"lr": 6e-5}, ()), ({"decoupled_lr": -1.0}, ()),
    ({"lr_warmup_iters": -1}, ()), ({"lr_decay_samples": 0}, ()), ({"lr_warmup_init": 1.0}, ()),
    ({"override_opt_param_scheduler": True, "use_checkpoint_opt_param_scheduler": True}, ()),
    ({"lr_warmup_fraction": 2.0}, ()), ({"weight_decay": -1.0}, ()), ({"adam_beta2": 1.0}, ()),
    ({"lr": math.nan}, ()),
    # training
    ({"train_iters": 0}, ()), ({"train_iters": None, "train_samples": None}, ()), ({"micro_batch_size": 0}, ()),
    ({"accumulation_steps": 0}, ()), ({"rampup_batch_size": [1, 1]}, ()), ({"rampup_batch_size": [0, 1, 10]}, ()),
    ({"rampup_batch_size": [3, 2, 10]}, ()), ({"rampup_batch_size": [16, 16, 100], "accumulation_steps": 2}, ()),
    ({"distributed_timeout_minutes": 0.0}, ()), ({"heartbeat_timeout_seconds": 1.0}, ()),
    ({"seed": -1}, ()), ({"device": "tpu"}, ()),
    ({"fp16": True, "bf16": True}, ("--no-fp16", "--no-bf16", "--zero-config")),
    ({"max_consecutive_skipped_iterations": -1}, ()), ({"loss_scale": 0.0}, ()),
    ({"min_loss_scale": 2.0, "initial_loss_scale": 1.0}, ()),
    # data
    ({"split": "a,b"}, ()), ({"data_path": ["0.5", "a", "b", "c"]}, ()),
    ({"tokenizer_type": "TikTokenizer"}, ("--tokenizer-file",)), ({"tokenizer_type": "Nope"}, ()),
    ({"tokenizer_type": "NullTokenizer", "tokenizer_file": "t.json"}, ()),
    ({"tokenizer_type": "NullTokenizer"}, ()), ({"data_path": ["corpus"]}, ("--tokenizer-model",)),
    ({"tokenizer_type": "GPT2BPETokenizer"}, ()), ({"tokenizer_type": "HuggingFaceTokenizer"}, ()),
    ({"tokenizer_type": "GPTSentencePieceTokenizer"}, ()), ({"vocab_file": "v.json"}, ()),
    ({"tokenizer_file": "t.json", "vocab_file": "v.json", "merge_file": "m.txt"}, ()), ({"num_workers": -1}, ()),
    ({"tokenizer_type": "NullTokenizer", "data_path": ["corpus"]}, ()),
    # logging
    ({"metrics_file": ""}, ()), ({"peak_tflops": 0.0}, ()),
    # ZeRO and activation checkpointing (zero/config.py)
    ({"stage": 5}, ()), ({"sub_group_size": 0}, ()), ({"offload_param": True, "stage": 1}, ()),
    ({"offload_optimizer": True, "stage": 0}, ()), ({"reduce_bucket_size": 0}, ()),
    ({"stage3_prefetch_bucket_size": -1}, ()),
    ({"overlap_param_gather": True, "stage": 0}, ()),
    ({"contiguous_gradients": False}, ()), ({"checkpoint_num_layers": 0}, ()), ({"number_checkpoints": 0}, ()),
    ({"partition_activations": True}, ()), ({"checkpoint_activations": True, "checkpoint_num_layers": 5}, ()),
    ({"checkpoint_activations": True, "number_checkpoints": 1}, ()),
    # checkpoint
    ({"save_interval": 0}, ()), ({"exit_duration_in_mins": 0.0}, ()), ({"keep_last": 2}, ()),
    ({"finetune": True}, ()), ({"save": __file__}, ()),
    # pipeline stages (arguments/config.py, gpt/stage_layers.py)
    ({"num_layers_per_virtual_pipeline_stage": 2}, ()), ({"decoder_first_pipeline_num_layers": 1}, ()),
    ({**PP2, "stage": 3}, ()),
    ({"pipeline_model_parallel_size": 3}, ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers")),
    ({**PP2, "decoder_first_pipeline_num_layers": 5}, ()),
    ({**PP2, "decoder_first_pipeline_num_layers": 1, "decoder_last_pipeline_num_layers": 1}, ()),
    ({**PP2, "decoder_first_pipeline_num_layers": 2, "num_layers_per_virtual_pipeline_stage": 1}, ()),
    ({**PP2, "num_layers_per_virtual_pipeline_stage": 3}, ()),
    # --step-batch-size-schedule (arguments/step_batch_schedule.py)
    ({"step_batch_size_schedule": "0:16 x:32"}, ()), ({"step_batch_size_schedule": "16"}, ()),
    ({"step_batch_size_schedule": "1000:16"}, ()), ({"step_batch_size_schedule": "0:16 100:32"}, ()),
    ({"step_batch_size_schedule": "0:0"}, ()),
    ({"step_batch_size_schedule": "0:16", "rampup_batch_size": [16, 16, 100]}, ()),
    ({"step_batch_size_schedule": "0:16", "accumulation_steps": 2}, ()),
    # arguments/bounds.py
    ({"train_samples": 10**20}, ()), ({"distributed_timeout_minutes": 1e9}, ()),
    ({"hidden_size": 2**30, "ffn_hidden_size": 2**40, "num_attention_heads": 1}, ()),
]


@pytest.fixture(scope="module")
def valid() -> PretrainConfig:
    return parse_config([])


@pytest.fixture(scope="module")
def options():
    return option_table(build_parser())


def named_flags(message: str, options) -> list[str]:
    """The options a message names, in order, once each (the regex the product no longer has)."""
    for shorthand, flags in SHORTHANDS.items():
        message = message.replace(shorthand, flags)
    named = []
    for flag in re.findall(r"--[a-z0-9][a-z0-9_-]*[a-z0-9]", message):
        if flag not in named and options.action_for(flag) is not None:
            named.append(flag)
    return named


@pytest.mark.parametrize("changes, prose", INVALID, ids=[",".join(changes) for changes, _ in INVALID])
def test_every_check_validate_reaches_carries_the_flags_its_message_names(valid, options, changes, prose):
    sections = field_sections()
    config = valid
    for name, value in changes.items():
        section = sections[name]
        config = dataclasses.replace(config, **{section: replace_settings(getattr(config, section), **{name: value})})
    with pytest.raises(ConfigError) as raised:
        config.validate()
    error = raised.value
    named = named_flags(str(error), options)
    assert all(flag in named for flag in prose), f"the case's prose flags are not in {str(error)!r}"
    assert error.flags, f"no flags on {str(error)!r}"
    assert list(error.flags) == [flag for flag in named if flag not in prose], str(error)
    for flag in error.flags:
        assert options.action_for(flag) is not None, f"{flag} is not an option"


def test_every_raise_in_the_modules_validate_reaches_passes_flags():
    """The walk above covers what a config can trigger; this covers every site, reached or not, so a
    new check that forgets its flags fails here."""
    forgotten = []
    for module in VALIDATE_MODULES:
        tree = ast.parse((REPO / module).read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef) or (module, function.name) in NOT_ABOUT_A_FLAG:
                continue
            for node in ast.walk(function):
                call = node.exc if isinstance(node, ast.Raise) else None
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "ConfigError" \
                        and not any(keyword.arg == "flags" for keyword in call.keywords):
                    forgotten.append(f"{module}:{node.lineno}")
    assert not forgotten


def test_a_value_from_the_deepspeed_json_is_named_where_it_came_from(tmp_path):
    """A JSON-sourced value an error is about gets the inherited-value clause, as a preset's does
    (tests/arguments/test_megatron_flags.py::test_an_error_about_a_presets_value_names_the_preset)."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3}}))
    with pytest.raises(ConfigError) as error:
        parse_config(["--zero-config", str(ds), "--pipeline-model-parallel-size", "2"])
    assert str(error.value).endswith(f"use --zero-stage 1 or 2 (--zero-stage 3 comes from {ds}: "
                                     f"zero_optimization.stage; set it on the command line to change it)")


def test_a_fix_the_message_suggests_is_not_named_as_inherited(tmp_path):
    """Before: the regex read `--no-bf16` out of "add --no-fp16 or --no-bf16" and added a second clause,
    "--no-bf16 True comes from the preset", which says the opposite of the value in force."""
    preset = tmp_path / "bf16.yaml"
    preset.write_text("bf16: true\n")
    with pytest.raises(ConfigError) as error:
        parse_config(["--config", str(preset), "--fp16"])
    assert str(error.value) == (
        f"--fp16 and --bf16 are exclusive: choose one (add --no-fp16 or --no-bf16 to override a preset or "
        f"--zero-config) (--bf16 True comes from the preset {preset}; set it on the command line to change it)")


def test_a_flag_the_message_abbreviates_is_still_named_as_inherited(tmp_path):
    """Before: the regex read `--decoder-first` (no such option) out of
    "--decoder-first/last-pipeline-num-layers", so a preset's value went unnamed."""
    preset = tmp_path / "uneven.yaml"
    preset.write_text("decoder_first_pipeline_num_layers: 1\n")
    with pytest.raises(ConfigError) as error:
        parse_config(["--config", str(preset)])
    assert str(error.value).endswith(f"drop them, or add stages (--decoder-first-pipeline-num-layers 1 comes from "
                                     f"the preset {preset}; set it on the command line to change it)")


def test_flags_are_keyword_only_and_default_to_none():
    """Every ConfigError("...") written before keeps working; a second positional argument (which
    ValueError would silently keep in .args) is refused, so flags are never passed by mistake."""
    assert ConfigError("plain").flags == ()
    assert ConfigError("--zero-stage 5", flags=["--zero-stage"]).flags == ("--zero-stage",)
    with pytest.raises(TypeError):
        ConfigError("--zero-stage 5", ("--zero-stage",))
