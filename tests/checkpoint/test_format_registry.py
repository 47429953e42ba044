"""One door tells a checkpoint's format (checkpoint/formats.py, issue 82 item 1): the registry recognises each
format's real files, `--load`'s start decision carries the format it found, a new read-only format is one entry,
and training/ names no format (it imports no format's module: it asks the registry through checkpoint/)."""

from __future__ import annotations

import ast
from dataclasses import replace

import pytest

from checkpoint import formats
from checkpoint.formats import DEEPSPEED, MEGATRON, ZERO_GPT, format_of, locate
from checkpoint.start_decision import decide_start
from tests.readme import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
# a module of one format: training/ reaches these only through the registry (checkpoint/formats.py, run_start.py,
# run_saves.py)
FORMAT_MODULE_PREFIXES = ("checkpoint.megatron_", "checkpoint.deepspeed_", "checkpoint.dcp_", "checkpoint.sharded",
                          "checkpoint.zero_gpt_")
FORMAT_NAMES = {"is_megatron_checkpoint", "find_deepspeed_checkpoint", "TORCH_DIST", "MEGATRON", "DEEPSPEED",
                "ZERO_GPT", "load_checkpoint", "load_megatron_checkpoint", "load_deepspeed_checkpoint"}


def test_each_real_checkpoint_is_told_by_the_registry():
    megatron = FIXTURES / "megatron_tp1"          # written by Megatron-LM's own pretrain_gpt.py
    deepspeed = FIXTURES / "deepspeed_checkpoints" / "megatron_deepspeed_zero1"  # by Megatron-DeepSpeed's
    ours = FIXTURES / "checkpoint_84ae2c6"        # by this project, at commit 84ae2c6
    assert locate(deepspeed, False)[0] is DEEPSPEED and locate(megatron, False) is None and locate(ours, False) is None
    assert decide_start(str(deepspeed), None).format_name == DEEPSPEED.name
    assert decide_start(str(megatron), None).format_name == MEGATRON.name
    assert decide_start(str(ours), None).format_name == ZERO_GPT.name
    assert format_of(megatron / "iter_0000002") is MEGATRON and format_of(ours / "iter_0000002") is ZERO_GPT


def test_a_new_format_is_one_registry_entry(monkeypatch, tmp_path):
    """A folder the new entry recognises is decided as its, ahead of the formats after it; its handler module is
    imported only when a checkpoint of it is met."""
    folder = tmp_path / "iter_0000007"
    folder.mkdir()
    (folder / "metadata.json").write_text("{}")
    other = replace(ZERO_GPT, name="someone else's", holds=lambda path: (path / "THEIRS").exists(),
                    handler="a.module.not.imported.by.detection")
    monkeypatch.setattr(formats, "FORMATS", (DEEPSPEED, MEGATRON, other, ZERO_GPT))
    assert decide_start(str(folder), None).format_name == ZERO_GPT.name
    (folder / "THEIRS").write_text("")
    assert decide_start(str(folder), None).format_name == "someone else's"
    with pytest.raises(ModuleNotFoundError):
        other.module()


def test_training_names_no_checkpoint_format():
    for path in sorted((ROOT / "training").glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
        assert not [module for module in imported if module.startswith(FORMAT_MODULE_PREFIXES)], path
        named = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        named |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        named |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert not named & FORMAT_NAMES, (path, named & FORMAT_NAMES)
