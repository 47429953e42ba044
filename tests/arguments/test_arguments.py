"""Flags over YAML presets, and the one-line errors that stop a bad run before any work."""

import argparse
import dataclasses

import pytest

import pretrain_gpt
from arguments.batch_schedule import batch_schedule
from arguments.config import ConfigError, PretrainConfig, field_sections
from arguments.megatron.flags import MEANING_DESTS
from arguments.parser import NOT_SETTINGS, build_parser, parse_config, preset_names, shared_parser
from training.metrics import parameter_count


def test_every_setting_is_a_flag_and_every_flag_a_setting_or_a_megatron_meaning():
    dests = {a.dest for a in build_parser()._actions if a.option_strings} - {"help"}
    assert dests - set(NOT_SETTINGS) == set(field_sections())
    assert set(MEANING_DESTS) <= dests


@pytest.mark.smoke
def test_default_is_the_tiny_preset_and_flags_win(tmp_path):
    config = parse_config([])
    assert (config.model.num_layers, config.model.hidden_size) == (4, 128)
    assert PretrainConfig.from_flat({}).to_dict() == config.to_dict()  # dataclass defaults are the tiny preset
    config = parse_config(["--num-layers", "2", "--lr", "3e-4", "--bf16"])
    assert config.model.num_layers == 2 and config.optimizer.lr == 3e-4 and config.training.mixed_precision.bf16
    preset = tmp_path / "mine.yaml"
    preset.write_text("num-layers: 6\nbf16: true\ndata_path: [0.5, a, 0.5, b]\ntokenizer_file: t.json\n")
    config = parse_config(["--config", str(preset), "--no-bf16"])
    assert config.model.num_layers == 6 and not config.training.mixed_precision.bf16
    assert config.data.data_path == ["0.5", "a", "0.5", "b"]


def test_a_preset_key_sets_the_setting_of_that_name_not_a_flag_storing_one_value_in_it(tmp_path):
    """`attention_backend: flash` was read as --use-flash-attn-builder=flash (the last flag with that dest)
    and refused; likewise make_vocab_size_divisible_by (--no-pad-vocab-size), activation (--openai-gelu)
    and accumulate_allreduce_grads_in_fp32 (--grad-reduce-in-bf16)."""
    preset = tmp_path / "mine.yaml"
    preset.write_text("attention_backend: flash\nmake_vocab_size_divisible_by: 64\nactivation: gelu\n"
                      "accumulate_allreduce_grads_in_fp32: true\n")
    config = parse_config(["--config", str(preset)])
    assert (config.model.attention.attention_backend, config.model.make_vocab_size_divisible_by, config.model.mlp.activation) == \
        ("flash", 64, "gelu")
    assert config.training.mixed_precision.accumulate_allreduce_grads_in_fp32 is True


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_parses_and_validates(name):
    config = parse_config(["--config", name])
    config.validate()


def test_the_papers_1_5b_preset():
    config = parse_config(["--config", "gpt2-1.5b"])
    model = dataclasses.replace(config.model, vocab_size=50257)
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (48, 1600, 16)
    assert 1.5e9 < parameter_count(model) < 1.6e9


@pytest.mark.parametrize("name, vocabulary, parameters", [
    # transformers' count of meta-llama/Llama-2-7b-hf and meta-llama/Meta-Llama-3-8B (sum of numel over
    # LlamaForCausalLM's parameters, as its model cards state: 6.74B and 8.03B).
    ("llama2-7b", 32000, 6_738_415_616), ("llama3-8b", 128256, 8_030_261_248)])
def test_the_llama_presets_have_the_published_parameter_counts(name, vocabulary, parameters):
    model = dataclasses.replace(parse_config(["--config", name]).model, vocab_size=vocabulary)  # their tokenizers' (not padded further: both divide by 128)
    assert model.padded_vocab_size() == vocabulary and parameter_count(model) == parameters


@pytest.mark.parametrize("argv, words", [
    (["--hidden-size", "100", "--num-attention-heads", "3"], "--hidden-size 100 is not divisible"),
    (["--seq-length", "256", "--max-position-embeddings", "128"], "--seq-length 256 is larger"),
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--num-layers", "two"], "--num-layers/--encoder-num-layers: invalid int value"),
    (["--lr-decay-style", "step"], "is not one of cosine, linear, constant"),  # with the launch's other problems
    (["--config", "no-such-preset"], "no such preset"),
    (["--data-path", "x"], "--data-path needs the tokenizer"),
    (["--vocab-file", "v.json"], "--vocab-file and --merge-file go together"),
    (["--num-attention-heads", "4", "--hidden-size", "128", "--tensor-model-parallel-size", "8"],
     "--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 8"),
    (["--num-attention-heads", "8", "--hidden-size", "128", "--ffn-hidden-size", "100",
      "--tensor-model-parallel-size", "8"], "--ffn-hidden-size 100 is not divisible"),
])
def test_bad_settings_raise_config_error(argv, words):
    with pytest.raises(ConfigError, match=words.replace("-", r"\-").replace(".", r"\.")):
        parse_config(argv)


def test_unknown_yaml_key_is_named_with_its_file(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("num_layers: 2\nnum_layerz: 3\n")
    with pytest.raises(ConfigError, match="bad.yaml: unknown key 'num_layerz'"):
        parse_config(["--config", str(preset)])
    preset.write_text("num_layers: many\n")
    with pytest.raises(ConfigError, match="bad.yaml: argument --num-layers/--encoder-num-layers: invalid int value"):
        parse_config(["--config", str(preset)])


def test_global_batch_must_split_into_micro_batches():
    training = dataclasses.replace(PretrainConfig().training, micro_batch_size=3, global_batch_size=32)
    config = dataclasses.replace(PretrainConfig(), training=training)
    with pytest.raises(ConfigError, match="--global-batch-size 32 is not divisible by --micro-batch-size 3"):
        batch_schedule(config, data_parallel_size=1)
    config = dataclasses.replace(config, training=dataclasses.replace(training, micro_batch_size=4))
    batch = batch_schedule(config, data_parallel_size=2)
    assert (batch.accumulation_steps_at(0), batch.global_batch_at(0)) == (4, 32)


@pytest.mark.parametrize("argv", [
    ["--hidden-size", "100", "--num-attention-heads", "3"],
    ["--micro-batch-size", "5", "--global-batch-size", "32"],
    ["--bogus"],
])
def test_cli_exits_2_with_one_line_before_any_work(argv, tmp_path, capsys, monkeypatch):
    def no_data_work(*args, **kwargs):
        raise AssertionError("data preparation started although the config is invalid")

    monkeypatch.setattr("training.prepare.build_data", no_data_work)
    code = pretrain_gpt.main(argv + ["--data-cache-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("pretrain_gpt.py: error: ")


def test_parser_is_argparse_with_groups():
    parser = build_parser()
    titles = {group.title for group in parser._action_groups}
    assert {"model", "training", "data and tokenizer", "logging"} <= titles
    assert isinstance(parser, argparse.ArgumentParser)


def test_the_shared_parser_hands_each_parse_its_own_mutable_defaults():
    # one parser serves every parse of a process (arguments/parser.py shared_parser): a default list changed in
    # place by one parse's reader reaches neither the parser nor the next parse
    parser = shared_parser()
    assert parser is shared_parser() and parser.mutable_defaults
    first, second = parser.parse_args([]), parser.parse_args([])
    for action in parser.mutable_defaults:
        assert getattr(first, action.dest) == action.default and getattr(first, action.dest) is not action.default
        assert getattr(first, action.dest) is not getattr(second, action.dest)
    first.data_path.append("changed")
    assert parse_config([]).data.data_path == [] and parser.parse_args([]).data_path == []
