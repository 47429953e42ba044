"""Issue 34, point 2 (every precedence row re-checked): under --deepspeed the JSON's gradient_clipping is the
clip, DeepSpeed's default where the key is left out; Megatron's --clip-grad is not read.

The real pair's code:
- Megatron-DeepSpeed (github:deepspeedai/Megatron-DeepSpeed 4efb479d) megatron/optimizer/__init__.py
  get_megatron_optimizer, lines 115-116: `if args.deepspeed: return optimizer`, before the
  Float16OptimizerWithFloat16Params / FP32Optimizer(optimizer, args.clip_grad, ...) of lines 157 and 168,
  the only readers of args.clip_grad; megatron/training.py setup_model_and_optimizer (lines 606-623) passes
  that bare optimizer to deepspeed.initialize(optimizer=optimizer, config=args.deepspeed_config_dict).
  The older fork DeepSpeedExamples@89ce0d5a megatron/Megatron-LM-v1.1.5-ZeRO3/megatron/training.py
  backward_step (lines 305-318) clips with args.clip_grad only under `if not args.deepspeed`.
- DeepSpeed (github:deepspeedai/DeepSpeed edaa7221) deepspeed/runtime/config.py get_gradient_clipping
  (line 257): get_scalar_param(param_dict, GRADIENT_CLIPPING, GRADIENT_CLIPPING_DEFAULT);
  runtime/constants.py line 261 GRADIENT_CLIPPING_DEFAULT = 1.0 (commit 44216655, PR #8068, in v0.19.3; 0.0
  before); runtime/engine.py builds the ZeRO / FP16 / BF16 optimizers with clip_grad=self.gradient_clipping()
  (lines 2405, 2489, 2543) and clips fp32 gradients when gradient_clipping() > 0.0 (line 3327);
  _configure_optimizer (line 2026) uses the client optimizer, so the JSON optimizer block's max_grad_norm is
  never read.
"""

from __future__ import annotations

import json

from arguments.deepspeed.clipping import DEEPSPEED_GRADIENT_CLIPPING_DEFAULT
from arguments.parser import parse_arguments

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2"]


def _launch(tmp_path, ds_json: dict, *flags: str):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, **ds_json}))
    return parse_arguments([*MODEL, "--deepspeed", "--deepspeed_config", str(path), *flags])


def _clip_warnings(parsed):
    return [note for note in parsed.notes if "gradient_clipping" in note and note.startswith("warning:")]


def test_clip_grad_beside_a_json_without_gradient_clipping_is_not_used_with_one_warning(tmp_path):
    parsed = _launch(tmp_path, {}, "--clip-grad", "0.3")
    assert parsed.config.optimizer.clip_grad == DEEPSPEED_GRADIENT_CLIPPING_DEFAULT == 1.0
    warnings = _clip_warnings(parsed)
    assert len(warnings) == 1 and warnings[0].startswith("warning: --clip-grad 0.3 not used")
    shown = parsed.config.sources["clip_grad"].describe()  # --print-config's row names both sides
    assert "gradient_clipping" in shown and "--clip-grad 0.3 on the command line not used" in shown
    # without a JSON, Megatron's flag runs, as in Megatron-LM
    assert parse_arguments([*MODEL, "--clip-grad", "0.3"]).config.optimizer.clip_grad == 0.3


def test_the_jsons_gradient_clipping_governs_and_a_flag_agreeing_says_nothing(tmp_path):
    assert _launch(tmp_path, {"gradient_clipping": 0.0}, "--clip-grad", "1.0").config.optimizer.clip_grad == 0.0
    parsed = _launch(tmp_path, {"gradient_clipping": 0.5}, "--clip-grad", "0.5")
    assert parsed.config.optimizer.clip_grad == 0.5 and not _clip_warnings(parsed)
    assert _launch(tmp_path, {"gradient_clipping": 0.5}).config.optimizer.clip_grad == 0.5


def test_the_optimizer_blocks_max_grad_norm_has_no_effect(tmp_path):
    """Megatron-DeepSpeed always passes a client optimizer: the JSON's optimizer block is not read."""
    parsed = _launch(tmp_path, {"optimizer": {"type": "Adam", "params": {"lr": 1e-4, "max_grad_norm": 0.2}}})
    assert parsed.config.optimizer.clip_grad == DEEPSPEED_GRADIENT_CLIPPING_DEFAULT


def test_the_2020_forks_max_grad_norm_is_accepted_and_named_as_not_read(tmp_path):
    """Corpus entry deepspeedexamples-ds-pretrain-gpt2: its ds_config.json (microsoft/DeepSpeedExamples
    69785c7c, deleted by 5426d18a on 2020-05-14) has "max_grad_norm": 1.0 in its optimizer block. DeepSpeed
    reads it only in _configure_basic_optimizer, where v0.1.0 (github:microsoft/DeepSpeed v0.1.0,
    deepspeed/pt/deepspeed_light.py lines 466-472) set it to 0.0 under fp16 and v0.2.0 on (deepspeed_light.py
    lines 504-509; runtime/engine.py in v0.3.x-v0.5.x) raise a ValueError. But the fork of that JSON's lifetime
    never got there: Megatron-LM/pretrain_gpt2.py (69785c7c lines 161-168, unchanged in 5426d18a) passes
    deepspeed.initialize(optimizer=optimizer), and DeepSpeed's _configure_optimizer (v0.2.0 lines 474-477)
    uses a client optimizer without building the JSON's. The fork's param-groups path that would have raised
    (model_parameters=param_groups) came in a79272cc, October 2020, after the JSON was gone. So the real pair
    trains this launch: it is accepted, its key named as not read, and nothing that ran is ignored (the fork's
    --clip-grad is not read under --deepspeed either: 69785c7c pretrain_gpt2.py get_optimizer lines 111-113
    return the bare Adam, and backward_step clips only `if not args.deepspeed`, lines 331-340)."""
    from arguments.print_config import format_config
    from tests.arguments.test_megatron_launch_defaults import _shrunk

    parsed = parse_arguments(_shrunk("deepspeedexamples-ds-pretrain-gpt2", tmp_path))
    row = next(line for line in format_config(parsed).splitlines()
               if line.split()[:1] == ["optimizer.params.max_grad_norm"])
    assert "not read" in row and "never with the optimizer's max_grad_norm" in row
    assert "since v0.2.0 an error where it builds the JSON's optimizer" in row
    # the fork's DeepSpeed (before v0.19.3) did not clip without gradient_clipping
    # (tests/arguments/test_deepspeed_clipping_generations.py)
    assert parsed.config.optimizer.clip_grad == 0.0
