"""One door tells a checkpoint's format (checkpoint/formats.py, issue 82 item 1): the registry recognises each
format's real files, `--load`'s start decision carries the format it found, each format is a package whose resume.py
is the registry's handler, a new read-only format is one package and one registry entry, and training/ names no format
(it imports no format's package: it asks the registry through checkpoint/)."""

from __future__ import annotations

import ast
import importlib
import sys

from checkpoint import formats
from checkpoint.formats import DEEPSPEED, FORMATS, MEGATRON, ZERO_GPT, CheckpointFormat, format_of, locate
from checkpoint.start_decision import decide_start
from tests.readme import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
# each format's package (checkpoint/ours/, torch_dist/, deepspeed/): training/ reaches them only through the registry
# (checkpoint/formats.py, run_start.py, run_saves.py)
# every format's package, the pretrained weights' (a Hugging Face folder, --init-from-hf) included
FORMAT_PACKAGES = tuple(sorted({fmt.handler.rpartition(".")[0] for fmt in FORMATS}
                               | {formats.PRETRAINED_HANDLER.rpartition(".")[0]}))
FORMAT_NAMES = {"is_megatron_checkpoint", "find_deepspeed_checkpoint", "TORCH_DIST", "MEGATRON", "DEEPSPEED",
                "ZERO_GPT", "load_checkpoint", "load_megatron_checkpoint", "load_deepspeed_checkpoint",
                "initialize_from_hf", "load_hf_weights"}


def test_each_real_checkpoint_is_told_by_the_registry():
    megatron = FIXTURES / "megatron_tp1"          # written by Megatron-LM's own pretrain_gpt.py
    deepspeed = FIXTURES / "deepspeed_checkpoints" / "megatron_deepspeed_zero1"  # by Megatron-DeepSpeed's
    ours = FIXTURES / "checkpoint_84ae2c6"        # by this project, at commit 84ae2c6
    assert locate(deepspeed, False)[0] is DEEPSPEED and locate(megatron, False) is None and locate(ours, False) is None
    assert decide_start(str(deepspeed), None).format_name == DEEPSPEED.name
    assert decide_start(str(megatron), None).format_name == MEGATRON.name
    assert decide_start(str(ours), None).format_name == ZERO_GPT.name
    assert format_of(megatron / "iter_0000002") is MEGATRON and format_of(ours / "iter_0000002") is ZERO_GPT


def test_each_format_is_a_package_whose_resume_is_the_handler():
    assert FORMAT_PACKAGES == ("checkpoint.deepspeed", "checkpoint.hf", "checkpoint.ours", "checkpoint.torch_dist")
    for fmt in FORMATS:
        package, _, name = fmt.handler.rpartition(".")
        assert name == "resume" and (ROOT / package.replace(".", "/") / "__init__.py").is_file(), fmt.handler
        assert callable(fmt.module().check_start) and callable(fmt.module().load_resume), fmt.handler
    pretrained = importlib.import_module(formats.PRETRAINED_HANDLER)  # the Hugging Face package's source
    assert (ROOT / "checkpoint" / "hf" / "__init__.py").is_file() and callable(pretrained.initialize_from_hf)


THEIRS = {  # a whole read-only format: its package, as a new one under checkpoint/ would be written
    "__init__.py": '"""Someone else\'s checkpoints, read only."""\n',
    "files.py": "def holds_theirs(path):\n    return (path / \"THEIRS\").exists()\n",
    "resume.py": ("def check_start(config, state, path, log, batch):\n    return batch, {\"iteration\": 7}\n\n\n"
                  "def load_resume(path, model, optimizer, rng, state, model_config, *, load_optimizer, load_rng,"
                  " finetune):\n    return None\n"),
}


def test_a_new_format_is_one_package_and_one_registry_entry(monkeypatch, tmp_path):
    """The package above and the one entry below: a folder it recognises is decided as its, ahead of the formats
    after it; its handler, the package's resume.py, is imported only when a checkpoint of it is met."""
    (tmp_path / "theirs_format").mkdir()
    for name, text in THEIRS.items():
        (tmp_path / "theirs_format" / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        theirs = CheckpointFormat("someone else's", importlib.import_module("theirs_format.files").holds_theirs,
                                  "theirs_format.resume")
        monkeypatch.setattr(formats, "FORMATS", (DEEPSPEED, MEGATRON, theirs, ZERO_GPT))
        folder = tmp_path / "iter_0000007"
        folder.mkdir()
        (folder / "metadata.json").write_text("{}")
        assert decide_start(str(folder), None).format_name == ZERO_GPT.name
        (folder / "THEIRS").write_text("")
        assert decide_start(str(folder), None).format_name == "someone else's"
        assert "theirs_format.resume" not in sys.modules
        decided = formats.format_named(decide_start(str(folder), None).format_name)
        assert decided.module().check_start(None, None, folder, print, "batch") == ("batch", {"iteration": 7})
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == "theirs_format"]:
            del sys.modules[name]


def test_training_names_no_checkpoint_format():
    for path in sorted((ROOT / "training").rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
        assert not [module for module in imported if module.startswith(FORMAT_PACKAGES)], path
        named = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
        named |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        named |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert not named & FORMAT_NAMES, (path, named & FORMAT_NAMES)
