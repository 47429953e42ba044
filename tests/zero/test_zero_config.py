"""ZeRO and mixed-precision settings: flags, DeepSpeed-style JSON (--zero-config) and their precedence."""

import json

import pytest

import pretrain_gpt
from arguments.batch_schedule import batch_schedule
from arguments.config import ConfigError, PretrainConfig, field_sections
from arguments.deepspeed.translation import EXAMPLE_DIR, deepspeed_config_to_flags, load_deepspeed_config
from arguments.deepspeed.verdicts import HONOURED
from arguments.parser import parse_arguments, parse_config
from base.options import setting_value
from zero.config import ZeroConfig

EXAMPLES = sorted(EXAMPLE_DIR.glob("stage*.json"))  # the ZeRO paper's C1-C5: tests/planner/test_zero_paper_configs.py


def write_json(tmp_path, config, name="ds.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config) if not isinstance(config, str) else config)
    return path


def test_zero_section_defaults_are_deepspeeds_except_persistence():
    zero = PretrainConfig().zero
    assert zero == ZeroConfig(stage=0, reduce_bucket_size=500_000_000, allgather_bucket_size=500_000_000,
                              overlap_comm=True, contiguous_gradients=True, reduce_scatter=True,
                              stage3_prefetch_bucket_size=50_000_000, stage3_param_persistence_threshold=0,
                              stage3_max_live_parameters=1_000_000_000)
    assert field_sections()["stage"] == "zero" and "zero" in PretrainConfig().to_dict()
    assert parse_config([]).zero == zero and parse_config([]).training.precision == "fp32"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_loads_and_validates(path):
    config = parse_config(["--zero-config", str(path)])
    assert config.zero.stage == int(path.stem[len("stage")])
    assert config.training.precision == ("fp16" if "fp16" in path.stem else "bf16")
    assert parse_config(["--zero-config", path.stem]).to_dict() == config.to_dict()  # by name, too


def test_examples_cover_every_stage_and_dynamic_fp16():
    assert {p.stem for p in EXAMPLES} >= {"stage1", "stage2", "stage3", "stage2_fp16"}
    fp16 = json.loads((EXAMPLE_DIR / "stage2_fp16.json").read_text())["fp16"]
    assert fp16["enabled"] is True and fp16["loss_scale"] == 0
    assert parse_config(["--zero-config", "stage2_fp16"]).training.mixed_precision.loss_scale is None


# Every supported key with a non-default value, and where it must land.
EVERY_KEY = {
    "train_micro_batch_size_per_gpu": 2,
    "train_batch_size": 64,
    "gradient_accumulation_steps": 8,
    "gradient_clipping": 0.5,
    "fp16": {"enabled": True, "loss_scale": 128, "initial_scale_power": 12, "loss_scale_window": 500,
             "hysteresis": 3, "min_loss_scale": 0.25},
    "bf16": {"enabled": False},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 2e6, "allgather_bucket_size": 3000000,
                          "overlap_comm": False, "contiguous_gradients": True, "reduce_scatter": False,
                          "stage3_prefetch_bucket_size": 4e5, "stage3_param_persistence_threshold": 1e5,
                          "stage3_max_live_parameters": 7e7},
    "activation_checkpointing": {"partition_activations": True, "cpu_checkpointing": True,
                                 "contiguous_memory_optimization": True, "number_checkpoints": 6,
                                 "synchronize_checkpoint_boundary": True, "profile": True},
}
EXPECTED = {
    ("training", "micro_batch_size"): 2, ("training", "global_batch_size"): 64,
    ("training", "accumulation_steps"): 8, ("optimizer", "clip_grad"): 0.5,
    ("training", "fp16"): True, ("training", "loss_scale"): 128.0, ("training", "initial_loss_scale"): 4096.0,
    ("training", "loss_scale_window"): 500, ("training", "hysteresis"): 3, ("training", "min_loss_scale"): 0.25,
    ("training", "bf16"): False,
    ("zero", "stage"): 3, ("zero", "reduce_bucket_size"): 2_000_000, ("zero", "allgather_bucket_size"): 3_000_000,
    ("zero", "overlap_comm"): False, ("zero", "contiguous_gradients"): True, ("zero", "reduce_scatter"): False,
    ("zero", "stage3_prefetch_bucket_size"): 400_000, ("zero", "stage3_param_persistence_threshold"): 100_000,
    ("zero", "stage3_max_live_parameters"): 70_000_000,
    ("activations", "checkpoint_activations"): True, ("activations", "partition_activations"): True,
    ("activations", "cpu_checkpointing"): True, ("activations", "contiguous_checkpointing"): True,
    ("activations", "number_checkpoints"): 6, ("activations", "synchronize_checkpoint_boundary"): True,
    ("activations", "profile_checkpointing"): True,
}


def test_every_honoured_zero_key_maps_to_its_setting(tmp_path):
    translation = deepspeed_config_to_flags(EVERY_KEY, "ds.json")
    assert {verdict.kind for verdict in translation.verdicts} == {HONOURED}
    config = parse_config(["--zero-config", str(write_json(tmp_path, EVERY_KEY))])
    for (section, name), value in EXPECTED.items():
        got = setting_value(getattr(config, section), name)
        assert got == value and type(got) is type(value), (section, name, got)
    assert config.training.precision == "fp16"


def test_loss_scale_zero_is_dynamic_and_bf16_config_turns_fp16_off():
    assert deepspeed_config_to_flags({"fp16": {"enabled": True, "loss_scale": 0}}, "x").argv == ["--fp16", "--no-bf16"]
    assert deepspeed_config_to_flags({"bf16": {"enabled": True}}, "x").argv == ["--bf16", "--no-fp16"]
    assert deepspeed_config_to_flags({"fp16": {"enabled": False}}, "x").argv == ["--no-fp16"]


def test_json_wins_over_yaml_and_beside_a_flag_the_real_pairs_side_wins(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("zero_stage: 1\nreduce_bucket_size: 1000\noverlap_comm: false\nbf16: true\n"
                      "hysteresis: 5\n")
    ds = write_json(tmp_path, {"zero_optimization": {"stage": 2, "reduce_bucket_size": 2000},
                               "fp16": {"enabled": True, "hysteresis": 4}})
    config = parse_config(["--config", str(preset), "--zero-config", str(ds)])
    assert (config.zero.stage, config.zero.reduce_bucket_size) == (2, 2000)  # JSON over YAML
    assert config.zero.overlap_comm is False  # YAML where the JSON says nothing
    assert config.training.precision == "fp16" and config.training.mixed_precision.hysteresis == 4
    config = parse_config(["--zero-stage", "2", "--loss-scale-window", "6", "--zero-config", str(ds),
                           "--config", str(preset)])
    # the JSON's fp16 block governs the loss scaler, DeepSpeed's default window (1000) included, and
    # Megatron's --loss-scale-window is ignored as the real pair ignores it (issue 34, point 2;
    # tests/arguments/test_deepspeed_loss_scale.py)
    assert (config.zero.stage, config.zero.reduce_bucket_size, config.training.mixed_precision.loss_scale_window) == (2, 2000, 1000)
    assert config.sources["stage"].describe() == f"--zero-stage (command line); the same as zero_optimization.stage in {ds}"
    assert config.sources["reduce_bucket_size"].describe() == f"{ds}: zero_optimization.reduce_bucket_size"
    assert config.sources["overlap_comm"].describe() == f"preset {preset}"
    # Was an error ("contradicts ... remove one of each pair"); issue 22: DeepSpeed's engine takes the stage
    # and the precision from its JSON, so the JSON wins, said in one warning line.
    parsed = parse_arguments(["--zero-stage", "3", "--hysteresis", "4", "--no-fp16", "--zero-config", str(ds)])
    assert (parsed.config.zero.stage, parsed.config.training.precision) == (2, "fp16")
    # one warning for the overlapping keys; --hysteresis beside the JSON's fp16 block has its own (the
    # scaler flags DeepSpeed's engine never reads, issue 34)
    warning = [note for note in parsed.notes if note.startswith("warning:") and "wins over" in note]
    assert len(warning) == 1 and f"zero_optimization.stage 2 in {ds} wins over --zero-stage 3" in warning[0]
    assert any("--hysteresis" in note and "--deepspeed skips" in note for note in parsed.notes)
    assert f"fp16.enabled (--fp16) in {ds} wins over --no-fp16" in warning[0]


@pytest.mark.parametrize("config, words", [
    ({"optimizer": {"type": "Lamb"}}, "ds.json: 1 key(s) not supported here, remove or change them: optimizer.type "
                                      "('Lamb': the optimizer here is AdamW"),
    ({"zero_optimization": {"offload_param": {"device": "nvme"}}},
     "zero_optimization.offload_param.device (NVMe offload (ZeRO-Infinity) is not implemented"),
    ({"zero_optimization": {"stage3_prefetch_bucket": 5}},
     'zero_optimization.stage3_prefetch_bucket (unknown key; did you mean '
     '"zero_optimization.stage3_prefetch_bucket_size"?)'),
    ({"fp32": {"enabled": True}}, "fp32 (unknown key"),
    ({"zero_optimization": {"overlap_comm": "true"}}, "ds.json: zero_optimization.overlap_comm must be true or false"),
    ({"bf16": {"enabled": 1}}, "ds.json: bf16.enabled must be true or false, got 1"),
    ({"bf16": True}, 'ds.json: "bf16" must be an object'),
    ({"zero_optimization": {"reduce_bucket_size": 1.5e0}},
     "ds.json: zero_optimization.reduce_bucket_size must be a whole number"),
    ({"zero_optimization": {"stage": "auto"}}, 'ds.json: zero_optimization.stage must be a whole number'),
    ({"gradient_clipping": True}, "ds.json: gradient_clipping must be a number, got true"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, "ds.json: fp16.enabled and bf16.enabled are both true"),
    ({"fp16": {"loss_scale": -1}}, "ds.json: fp16.loss_scale must be >= 0"),
    ({"fp16": {"initial_scale_power": 100}}, "ds.json: fp16.initial_scale_power must be a whole number in 0..64"),
    ({"zero_optimization": {"stage": 4}}, "ds.json: argument --zero-stage: invalid choice: 4"),
    ({"zero_optimization": {"contiguous_gradients": False}},
     "ds.json: --no-contiguous-gradients is not supported: gradients are always copied"),
    ({"zero_optimization": {"reduce_bucket_size": 0}}, "ds.json: --reduce-bucket-size must be at least 1"),
    ([1, 2], "ds.json: a DeepSpeed config must be a JSON object"),
    ('{"fp16": {"enabled": true', "ds.json: not valid JSON"),
    ('{"gradient_clipping": 1, "gradient_clipping": 2}', 'ds.json: key "gradient_clipping" appears twice'),
])
def test_bad_json_names_the_key_and_the_file(config, words, tmp_path):
    assert_bad_json_names(tmp_path, config, words)


def assert_bad_json_names(tmp_path, config, words):
    """`--zero-config` with this JSON fails with one line containing `words` (the file as ds.json)."""
    path = write_json(tmp_path, config)
    with pytest.raises(ConfigError) as error:
        parse_config(["--zero-config", str(path)])
    message = str(error.value)
    assert words in message.replace(str(path), "ds.json") and "\n" not in message


def test_missing_json_is_named(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="nope.json: cannot read it"):
        load_deepspeed_config(missing)
    with pytest.raises(ConfigError, match="--zero-config stage9: no such file"):
        parse_config(["--zero-config", "stage9"])


@pytest.mark.parametrize("argv, words", [
    (["--fp16", "--bf16"], "--fp16 and --bf16 are exclusive"),
    (["--no-contiguous-gradients"], "--no-contiguous-gradients is not supported"),
    (["--zero-stage", "4"], "argument --zero-stage: invalid choice"),
    (["--reduce-bucket-size", "1.5"],
     "argument --reduce-bucket-size/--zero-reduce-bucket-size/--ddp-bucket-size: invalid count '1.5'"),
    (["--allgather-bucket-size", "0"], "--allgather-bucket-size must be at least 1"),
    (["--stage3-max-live-parameters", "-1"], "--stage3-max-live-parameters must be >= 0"),
    (["--loss-scale", "0"], "--loss-scale must be a positive number"),
    (["--hysteresis", "0"], "--hysteresis must be at least 1"),
    (["--loss-scale-window", "0"], "--loss-scale-window must be at least 1"),
    (["--min-loss-scale", "8", "--initial-loss-scale", "4"], "--min-loss-scale 8.0 is larger than"),
    (["--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps must be at least 1"),
])
def test_bad_flags_raise_config_error(argv, words):
    with pytest.raises(ConfigError) as error:
        parse_config(argv)
    assert words in str(error.value)


def test_sizes_accept_scientific_notation():
    config = parse_config(["--reduce-bucket-size", "5e8", "--stage3-param-persistence-threshold", "1e5"])
    assert (config.zero.reduce_bucket_size, config.zero.stage3_param_persistence_threshold) == (500_000_000, 100_000)


def test_precision():
    assert [parse_config(argv).training.precision for argv in ([], ["--bf16"], ["--fp16"])] == ["fp32", "bf16", "fp16"]
    assert parse_config(["--fp16", "--loss-scale", "1024", "--report-memory"]).training.mixed_precision.loss_scale == 1024.0
    assert parse_config(["--report-memory"]).logging.report_memory


def test_gradient_accumulation_steps_determine_the_global_batch():
    def steps_and_batch(argv, data_parallel_size=2):
        batch = batch_schedule(parse_config(argv), data_parallel_size)
        return batch.micro_batch_size, batch.accumulation_steps_at(0), batch.global_batch_at(0)

    assert steps_and_batch(["--gradient-accumulation-steps", "4", "--micro-batch-size", "2"]) == (2, 4, 16)
    assert steps_and_batch(["--micro-batch-size", "2", "--global-batch-size", "16"]) == (2, 4, 16)


def test_deepspeeds_two_of_three_batch_settings(tmp_path):
    """train_batch_size and gradient_accumulation_steps given: the micro batch follows (DeepSpeed's rule).
    Beside a batch flag the flags win and the JSON fills in what they leave open: beside a micro batch
    flag, its accumulation steps (this was "give two of the three" until issue 22). Three flags that disagree are still an error naming each."""
    ds = write_json(tmp_path, {"train_batch_size": 16, "gradient_accumulation_steps": 2})
    batch = batch_schedule(parse_config(["--zero-config", str(ds)]), data_parallel_size=2)
    assert (batch.micro_batch_size, batch.accumulation_steps_at(0), batch.global_batch_at(0)) == (4, 2, 16)
    # Beside --batch-size (Megatron's per-rank batch) the JSON's accumulation steps come first and its
    # train_batch_size is DeepSpeed's own view, as in DeepSpeedExamples' Megatron forks.
    batch = batch_schedule(parse_config(["--zero-config", str(ds), "--batch-size", "4"]), data_parallel_size=1)
    assert (batch.micro_batch_size, batch.accumulation_steps_at(0), batch.global_batch_at(0)) == (4, 2, 8)
    assert batch.notes == (f"train_batch_size 16 in {ds}: --global-batch-size 8 follows from the other two batch "
                           f"settings, as in Megatron-DeepSpeed, whose train() overrides DeepSpeed's train_batch_size "
                           f"with Megatron's global batch every iteration (set_train_batch_size)",)
    with pytest.raises(ConfigError) as error:
        batch_schedule(parse_config(["--batch-size", "4", "--global-batch-size", "16", "--gradient-accumulation-steps",
                                     "2"]), data_parallel_size=1)
    assert str(error.value) == (
        "--global-batch-size 16 (--global-batch-size (command line)) is not --micro-batch-size 4 (--batch-size "
        "(DeepSpeed-Megatron's name for --micro-batch-size) (command line)) x --gradient-accumulation-steps 2 "
        "(--gradient-accumulation-steps (command line)) x data-parallel size 1 = 8; give two of the three")


def test_yaml_preset_cannot_name_a_zero_config(tmp_path):
    preset = tmp_path / "bad.yaml"
    preset.write_text("zero_config: stage2\n")
    with pytest.raises(ConfigError, match="bad.yaml: zero_config cannot be set in a preset"):
        parse_config(["--config", str(preset)])


def test_cli_exits_2_with_one_line_for_a_bad_zero_config(tmp_path, capsys, monkeypatch):
    def no_data_work(*args, **kwargs):
        raise AssertionError("data preparation started although the config is invalid")

    monkeypatch.setattr("training.prepare.build_data", no_data_work)
    bad = write_json(tmp_path, {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})
    code = pretrain_gpt.main(["--zero-config", str(bad), "--data-cache-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("pretrain_gpt.py: error: ")
    assert f"{bad}: 1 key(s) not supported here, remove or change them: zero_optimization.offload_optimizer.device " \
           f"(NVMe offload (ZeRO-Infinity) is not implemented" in err


def test_yaml_keys_may_be_flag_names_or_setting_names(tmp_path):
    preset = tmp_path / "mine.yaml"
    preset.write_text("zero-stage: 2\ngradient_accumulation_steps: 3\nfp16: true\n")
    config = parse_config(["--config", str(preset)])
    assert (config.zero.stage, config.training.accumulation_steps, config.training.mixed_precision.fp16) == (2, 3, True)
    preset.write_text("stage: 1\naccumulation_steps: 2\n")
    config = parse_config(["--config", str(preset)])
    assert (config.zero.stage, config.training.accumulation_steps) == (1, 2)
    preset.write_text("no_fp16: true\n")
    with pytest.raises(ConfigError, match="unknown key 'no_fp16'"):
        parse_config(["--config", str(preset)])
