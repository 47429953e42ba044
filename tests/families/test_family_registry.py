"""One folder per Hugging Face family (families/, issue 82 item 3): the registry finds every folder but the shared
one, no module outside families/ imports a single family's folder (only the registry and the shared modules), and a
family written as a new folder is read, and exported, with nothing else changed."""

from __future__ import annotations

import ast
import dataclasses
import json
import shutil
import sys

import pytest

import families
from base.options import setting_names
from families import registry
from tests.readme import ROOT

FAMILIES_DIR = ROOT / "families"
ALLOWED = {"families", "families.registry"} | {f"families.{name}" for name in registry.SHARED}


def family_folders() -> set[str]:
    return {path.name for path in FAMILIES_DIR.iterdir() if (path / "__init__.py").is_file()} - registry.SHARED


@pytest.mark.smoke
def test_every_family_folder_is_registered_in_its_claim_order():
    found = registry.registered()
    assert {family.name for family in found} == family_folders()
    assert len(found) == 20
    assert [family.claim_order for family in found] == sorted(family.claim_order for family in found)
    # every table comes from it: each model_type read here is one folder's
    assert set(registry.architectures()) == {model_type for family in found for model_type in family.model_types}
    assert registry.llama_families() == ("apertus", "mixtral", "qwen2_moe", "llama")
    assert list(registry.family_weights()) == \
        ["nemotron_h", "qwen3_next", "gpt_oss", "deepseek_v3", "olmoe", "glm4_moe", "qwen3_moe",
         "granitemoeshared"]
    assert registry.fallback_family().name == "gpt2"


def _imported(path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_no_module_outside_families_imports_a_family_folder():
    """The registry and the shared modules are the doors: a family's folder is nobody else's import."""
    folders = family_folders()
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT)
        if relative.parts[0] in ("families", ".venv") or "replay_corpus" in relative.parts:
            continue
        for name in _imported(path):
            parts = name.split(".")
            if parts[0] == "families" and len(parts) > 1 and parts[1] in folders:
                offenders.append(f"{relative}: {name}")
    assert offenders == []


def test_a_family_folder_imports_no_other_family():
    """What two families share lives in families/common/, so a folder stands (and goes) alone."""
    folders = family_folders()
    offenders = [f"{path.relative_to(ROOT)}: {name}" for folder in sorted(folders)
                 for path in sorted((FAMILIES_DIR / folder).rglob("*.py")) for name in _imported(path)
                 if name.split(".")[0] == "families" and len(name.split(".")) > 1
                 and name.split(".")[1] in folders - {folder}]
    assert offenders == []


NEW = "tiny_qwen3"  # a copy of families/qwen3/ under another name and model_type


@pytest.fixture
def new_family_folder(tmp_path, monkeypatch):
    """families/qwen3/ copied as families/<NEW>/ in a folder of its own on the package's path, and nothing else."""
    folder = tmp_path / NEW
    shutil.copytree(FAMILIES_DIR / "qwen3", folder, ignore=shutil.ignore_patterns("__pycache__"))
    for path in folder.glob("*.py"):
        text = path.read_text().replace("families.qwen3 ", f"families.{NEW} ").replace('"qwen3"', f'"{NEW}"')
        path.write_text(text.replace("claim_order=120", "claim_order=125"))
    monkeypatch.setattr(families, "__path__", [*families.__path__, str(tmp_path)])
    registry.registered.cache_clear()
    yield folder
    registry.registered.cache_clear()
    for name in [name for name in sys.modules if name.startswith(f"families.{NEW}")]:
        del sys.modules[name]


def test_a_new_family_folder_is_found_read_and_exported_with_nothing_else_changed(new_family_folder, tmp_path):
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import architecture_settings
    from gpt.model_config import ModelConfig

    assert NEW in {family.name for family in registry.registered()} and NEW in registry.dense_families()
    fields = {"vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}
    settings = {}
    for model_type in ("qwen3", NEW):
        hf_dir = tmp_path / f"hf_{model_type}"
        hf_dir.mkdir()
        (hf_dir / "config.json").write_text(json.dumps({"model_type": model_type, **fields}))
        config = read_hf_config(hf_dir)
        assert config.family == model_type
        settings[model_type] = {name: given.value for name, given in architecture_settings(config).items()}
    assert settings[NEW].pop("hf_model_type") == NEW and settings["qwen3"].pop("hf_model_type") == "qwen3"
    assert settings[NEW] == settings["qwen3"]
    model = dataclasses.replace(ModelConfig.of(**{name: value for name, value in settings[NEW].items()
                                                  if name in setting_names(ModelConfig)}), hf_model_type=NEW)
    assert registry.export_family(model, older_classes_hold=False) is registry.dense_families()[NEW]
