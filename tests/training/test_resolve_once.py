"""Issue 50 item 3: the configuration is frozen, resolved once, and nothing assigns into it after.

`PretrainConfig` and every section are frozen dataclasses: the user's config is what parsing made, and
what the device, the grid and the tokenizer make of it (the attention kernel, the precision, the batch,
the vocabulary) lives in the resolved copy training/run_settings.py returns. The attention kernel
fallback is part of that resolution: a live run and the dry run build their model from it, and the
user's config still says what was asked."""

import dataclasses

import pytest
import torch

import planner.dry_run
import pretrain_gpt
import training.prepare
from arguments.config import PretrainConfig
from arguments.parser import parse_config
from parallel.state import ParallelState
from training.run_settings import resolve_run_settings
from training.start_checks import check_before_claim

FALLBACK = "> --attention-backend fused: the fused kernels need CUDA"


def frozen(instance) -> bool:
    return type(instance).__dataclass_params__.frozen


def test_assigning_into_the_config_or_any_section_raises():
    config = parse_config(["--num-layers", "2"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.model = dataclasses.replace(config.model, num_layers=3)
    for section in PretrainConfig.SECTIONS:
        values = getattr(config, section)
        name = dataclasses.fields(values)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(values, name, getattr(values, name))
    assert config.model.num_layers == 2


def test_the_attention_fallback_is_in_the_resolved_settings_and_the_users_config_keeps_what_was_asked():
    """The fused kernels need CUDA: on a CPU the resolved model runs `auto` and says so in the settings'
    notes (logged once at the start); the config passed in still asks for `fused`. On CUDA, flash in
    fp32 falls back the same way (gpt/attention_backend.py's rule)."""
    config = parse_config(["--attention-backend", "fused"])
    settings = resolve_run_settings(config, 300, 1, 1, "cpu")
    assert settings.config.model.attention.attention_backend == "auto"
    assert [note for note in settings.notes if note.startswith(FALLBACK)]
    assert config.model.attention.attention_backend == "fused"
    flash = parse_config(["--use-flash-attn", "--attention-dropout", "0"])
    on_cuda = resolve_run_settings(flash, 300, 1, 1, "cuda")
    assert on_cuda.config.model.attention.attention_backend == "auto"
    assert [note for note in on_cuda.notes if note.startswith("> --use-flash-attn: the flash kernel on CUDA")]
    assert resolve_run_settings(flash, 300, 1, 1, "cpu").config.model.attention.attention_backend == "flash"


def test_the_checks_before_the_claim_leave_the_config_as_it_was():
    """training/start_checks.py used to write the fallback into the user's config
    (`config.model = dataclasses.replace(...)`); now it reads it only."""
    config = parse_config(["--attention-backend", "fused"])
    before = dataclasses.replace(config)
    check_before_claim(config, ParallelState(device=torch.device("cpu")), lambda line: None)
    assert config == before and config.model.attention.attention_backend == "fused"


def test_a_live_run_builds_its_model_from_the_resolved_settings_with_frozen_configs(tmp_path, monkeypatch, capsys):
    """A tiny run trains two iterations: its config stays frozen and unchanged, and the model it builds
    runs the fallback kernel because the resolved settings say so."""
    seen = {}
    real_run, real_build = pretrain_gpt.run, training.prepare.build

    def run(config, state, *rest):
        seen["config"] = config
        return real_run(config, state, *rest)

    def build(settings, state, **kwargs):
        seen["settings"] = settings
        built = real_build(settings, state, **kwargs)
        seen["kernels"] = {block.attention.kernel.attention_backend for block in built.model.blocks}
        return built

    monkeypatch.setattr(pretrain_gpt, "run", run)
    monkeypatch.setattr(training.prepare, "build", build)
    argv = ["--device", "cpu", "--attention-backend", "fused", "--train-iters", "2", "--eval-iters", "0",
            "--log-interval", "1", "--metrics-file", str(tmp_path / "m.jsonl")]
    assert pretrain_gpt.main(argv) == 0
    config, settings = seen["config"], seen["settings"]
    assert all(frozen(instance) for instance in (config, settings.config, *(getattr(config, section)
                                                                           for section in config.SECTIONS)))
    assert config.model.attention.attention_backend == "fused" and config == parse_config(argv)
    assert settings.config.model.attention.attention_backend == "auto" and seen["kernels"] == {"auto"}
    assert [line for line in capsys.readouterr().out.splitlines() if line.startswith(FALLBACK)]


def test_the_dry_run_resolves_as_the_live_run_does(monkeypatch, capsys):
    """`--dry-run` plans the model the live run builds: the same resolution, the kernel fallback included,
    from the frozen config parsing made."""
    seen = []
    real = planner.dry_run.resolve_run_settings

    def resolve(config, *args, **kwargs):
        settings = real(config, *args, **kwargs)
        seen.append((config, settings))
        return settings

    monkeypatch.setattr(planner.dry_run, "resolve_run_settings", resolve)
    assert pretrain_gpt.main(["--dry-run", "--device", "cpu", "--attention-backend", "fused"]) == 0
    [(config, settings)] = seen
    assert frozen(config) and frozen(config.model) and config.model.attention.attention_backend == "fused"
    assert settings.config.model.attention.attention_backend == "auto"
    assert "rank 0" in capsys.readouterr().out.lower()
