"""Issue 34 (round 3): DeepSpeed's gradient_clipping default follows the launch's generation.

DeepSpeed (github:deepspeedai/DeepSpeed) GRADIENT_CLIPPING_DEFAULT, read by runtime/config.py
get_gradient_clipping when the JSON leaves the key out: `0.` in v0.1.0 and v0.2.0
(deepspeed/pt/deepspeed_constants.py line 130), v0.14.5 (deepspeed/runtime/constants.py line 215) and v0.19.2
(line 254); `1.0` from commit 44216655 "Default gradient_clipping to 1.0 (#8068)", 2026-06-23, whose first
release is v0.19.3 (`git tag --contains`). DeepSpeedExamples' Megatron-LM forks (github:microsoft/DeepSpeedExamples,
last touched 89ce0d5a, 2022-06-15) ran with the DeepSpeed of their time, so a fork launch whose JSON sets no
gradient_clipping did not clip (and its --clip-grad is read only `if not args.deepspeed`: backward_step in
megatron/Megatron-LM-v1.1.5-ZeRO3/megatron/training.py lines 305-318, Megatron-LM/pretrain_gpt2.py 69785c7c
lines 331-340). Megatron-DeepSpeed launches run with today's DeepSpeed (1.0).
"""

from __future__ import annotations

import json

from arguments.parser import parse_arguments
from tests.arguments.test_megatron_launch_defaults import _shrunk

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2"]


def _json(tmp_path, **keys) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, **keys}))
    return str(path)


def _clipping_lines(parsed) -> list[str]:
    return [note for note in parsed.notes if "gradient_clipping" in note and "accepted with no effect" not in note]


def test_the_2020_forks_corpus_launch_does_not_clip_and_its_clip_grad_is_named_as_not_used(tmp_path):
    """Corpus deepspeedexamples-ds-pretrain-gpt2: its ds_config.json has no gradient_clipping and its script
    passes --clip-grad 1.0, which the fork does not read under --deepspeed."""
    parsed = parse_arguments(_shrunk("deepspeedexamples-ds-pretrain-gpt2", tmp_path))
    assert parsed.megatron_generation == "dse-megatron-lm"
    assert parsed.config.optimizer.clip_grad == 0.0
    lines = _clipping_lines(parsed)
    assert len(lines) == 1 and lines[0].startswith("warning: --clip-grad 1.0 not used")
    assert "does not clip" in lines[0] and "before v0.19.3" in lines[0]


def test_a_v115_fork_launch_whose_json_sets_no_gradient_clipping_does_not_clip_and_says_so(tmp_path):
    """--batch-size only DeepSpeedExamples' forks accept (tests/arguments/test_deepspeed_client_objects.py)."""
    parsed = parse_arguments([*MODEL, "--batch-size", "2", "--deepspeed", "--deepspeed_config", _json(tmp_path)])
    assert parsed.megatron_generation.startswith("dse-megatron-lm-v1.1.5")
    assert parsed.config.optimizer.clip_grad == 0.0
    lines = _clipping_lines(parsed)
    assert len(lines) == 1 and lines[0].startswith("> ") and "gradients are not clipped" in lines[0]
    assert "clip_grad" in parsed.config.sources and "0 (no clipping)" in parsed.config.sources["clip_grad"].describe()
    # the JSON's own value still governs the fork
    clipped = parse_arguments([*MODEL, "--batch-size", "2", "--deepspeed", "--deepspeed_config",
                               _json(tmp_path, gradient_clipping=0.5)])
    assert clipped.config.optimizer.clip_grad == 0.5 and not _clipping_lines(clipped)


def test_a_megatron_deepspeed_launch_takes_todays_default_without_a_line(tmp_path):
    parsed = parse_arguments([*MODEL, "--micro-batch-size", "2", "--deepspeed", "--deepspeed_config",
                              _json(tmp_path)])
    assert not (parsed.megatron_generation or "").startswith("dse-")
    assert parsed.config.optimizer.clip_grad == 1.0 and not _clipping_lines(parsed)
