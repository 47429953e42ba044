"""Issue 34, point 2: under --deepspeed, the JSON's fp16 block governs the loss scaler; Megatron's
--loss-scale and its dynamic-scaler flags are not read.

The real pair's code:
- DeepSpeed (github:deepspeedai/DeepSpeed) deepspeed/runtime/constants.py: FP16_LOSS_SCALE_DEFAULT = 0
  ("zero means using dynamic scaling"), FP16_INITIAL_SCALE_POWER_DEFAULT = 16,
  FP16_LOSS_SCALE_WINDOW_DEFAULT = 1000, FP16_HYSTERESIS_DEFAULT = 2, FP16_MIN_LOSS_SCALE_DEFAULT = 1;
  deepspeed/runtime/config.py get_loss_scale / get_dynamic_loss_scale_args read only the fp16 block.
- Megatron-DeepSpeed (github:deepspeedai/Megatron-DeepSpeed) megatron/optimizer/__init__.py
  get_megatron_optimizer: `if args.deepspeed: return optimizer` comes before the
  ConstantGradScaler(args.loss_scale) / DynamicGradScaler(initial_scale=args.initial_loss_scale, ...) it
  builds otherwise, so under --deepspeed those flags are parsed and never read. Its
  examples_deepspeed/azure/run-benchmark-model.sh passes `--loss-scale 15` beside a JSON whose fp16 block
  has no loss_scale: DeepSpeed scales dynamically.
"""

from __future__ import annotations

import json

from arguments.parser import parse_arguments
from zero.loss_scaler import DynamicLossScaler, build_loss_scaler

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2"]


def _launch(tmp_path, fp16: dict, *flags: str):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "fp16": fp16}))
    return parse_arguments([*MODEL, "--deepspeed", "--deepspeed_config", str(path), "--fp16", *flags])


def _scaler(config):
    training = config.training
    return build_loss_scaler(training.mixed_precision.fp16, training.mixed_precision.loss_scale, training.mixed_precision.initial_loss_scale,
                             training.mixed_precision.loss_scale_window, training.mixed_precision.hysteresis, training.mixed_precision.min_loss_scale)


def test_loss_scale_15_beside_a_json_without_loss_scale_scales_dynamically_with_one_warning(tmp_path):
    parsed = _launch(tmp_path, {"enabled": True}, "--loss-scale", "15")
    scaler = _scaler(parsed.config)
    assert isinstance(scaler, DynamicLossScaler)
    assert (scaler.scale, scaler.growth_interval, scaler.hysteresis, scaler.min_scale) == (2.0 ** 16, 1000, 2, 1.0)
    warnings = [note for note in parsed.notes if "--loss-scale" in note]
    assert len(warnings) == 1 and warnings[0].startswith("warning: --loss-scale 15.0 not used")
    assert "fp16.loss_scale" in parsed.config.sources["loss_scale"].describe()


def test_deepspeeds_defaults_replace_megatrons_dynamic_scaler_flags_and_defaults(tmp_path):
    """Megatron's own default initial scale is 2**32 (a Megatron launch gets it without a JSON); DeepSpeed's
    fp16 block starts at 2**initial_scale_power, 2**16 when left out."""
    assert parse_arguments([*MODEL, "--fp16"]).config.training.mixed_precision.initial_loss_scale == 2.0 ** 32
    parsed = _launch(tmp_path, {"enabled": True, "loss_scale_window": 500}, "--hysteresis", "7")
    scaler = _scaler(parsed.config)
    assert (scaler.scale, scaler.growth_interval, scaler.hysteresis) == (2.0 ** 16, 500, 2)
    assert [note for note in parsed.notes if note.startswith("warning: --hysteresis 7 not used")]


def test_a_json_static_loss_scale_still_wins_and_a_flag_agreeing_with_deepspeed_says_nothing(tmp_path):
    assert _scaler(_launch(tmp_path, {"enabled": True, "loss_scale": 128}, "--loss-scale", "15").config).scale == 128
    parsed = _launch(tmp_path, {"enabled": True}, "--loss-scale-window", "1000")
    assert not [note for note in parsed.notes if "not used: the fp16 block" in note]
    # without a JSON, Megatron's flag runs, as in Megatron-LM
    assert parse_arguments([*MODEL, "--fp16", "--loss-scale", "15"]).config.training.mixed_precision.loss_scale == 15.0
