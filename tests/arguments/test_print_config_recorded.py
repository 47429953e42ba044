"""Nothing moves (issue 112): `pretrain_gpt.py --print-config` answers exactly as recorded in
tests/fixtures/print_config_sha256.json before the model's settings were reshaped -- its exit status and the sha256
of its stdout and of its stderr -- for every `--config` preset and every replay-corpus launch (tests/replay_corpus,
the listed corpus and Megatron-LM's functional tests harvested whole, each through the one shrink; a refused launch's
one line counts too). The repository's and the launch folder's paths read as <root> and <tmp>, so the texts do not
depend on where the checkout lies.

The whole corpus takes ~1 minute of the 2-core machine: CI checks every preset and every sixth launch of the
recorded ones (a fixed subset); `PRINT_CONFIG_ALL=1` checks every launch. A deliberate change re-records:
`python -m tests.arguments.test_print_config_recorded --record`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import sys
from pathlib import Path

import pytest

import pretrain_gpt
from tests.replay_corpus import CORPUS, HARVESTED
from tests.replay_corpus.shrink import LocalFiles, shrink

ROOT = Path(__file__).parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "print_config_sha256.json"
PRESETS = ROOT / "configs" / "models"
LAUNCHES = {launch.name: launch for launch in (*CORPUS, *HARVESTED)}
EVERY_NTH_LAUNCH = 6  # CI's subset of the recorded launches


def preset_names() -> list[str]:
    return sorted(str(path.relative_to(PRESETS).with_suffix("")) for path in PRESETS.rglob("*.yaml"))


def answer(argv: list[str], folder: Path) -> list:
    """[exit status, sha256 of stdout, sha256 of stderr] of `pretrain_gpt.py ARGV --print-config`."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = pretrain_gpt.main([*argv, "--print-config"])
    texts = [text.replace(str(folder), "<tmp>").replace(str(ROOT), "<root>") for text in (out.getvalue(), err.getvalue())]
    return [status, *(hashlib.sha256(text.encode()).hexdigest() for text in texts)]


def launch_answer(name: str, folder: Path) -> list:
    """The answer of the replay-corpus launch `name`, shrunk as tests/scripts/test_replay_corpus.py shrinks it."""
    files = LocalFiles(str(folder / "data" / "corpus_text_document"), str(folder / "tokenizer"), 512,
                       str(folder / "out"))
    shrunk = shrink(LAUNCHES[name], files)
    for path, text in shrunk.files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text, encoding="utf-8")
    return answer(shrunk.argv, folder)


def answer_of(key: str, folder: Path) -> list:
    kind, name = key.split(":", 1)
    return answer(["--config", name], folder) if kind == "preset" else launch_answer(name, folder)


RECORDED = json.loads(FIXTURE.read_text()) if FIXTURE.is_file() else {}
_LAUNCH_KEYS = [key for key in RECORDED if key.startswith("replay:")]
CHECKED = [key for key in RECORDED if key.startswith("preset:")] + (
    _LAUNCH_KEYS if os.environ.get("PRINT_CONFIG_ALL") == "1" else _LAUNCH_KEYS[::EVERY_NTH_LAUNCH])


@pytest.mark.parametrize("key", CHECKED)
def test_print_config_answers_as_recorded(key, tmp_path):
    recorded, now = RECORDED[key], answer_of(key, tmp_path)
    differ = [part for part, before, after in zip(("exit status", "stdout", "stderr"), recorded, now) if before != after]
    assert differ == [], f"{key}: --print-config's answer changed in: {', '.join(differ)}"


def test_every_preset_and_launch_is_recorded():
    """A new preset or corpus launch is recorded too (`--record`)."""
    assert set(RECORDED) == {f"preset:{name}" for name in preset_names()} | {f"replay:{name}" for name in LAUNCHES}


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python -m tests.arguments.test_print_config_recorded --record")
    keys = [f"preset:{name}" for name in preset_names()] + [f"replay:{name}" for name in sorted(LAUNCHES)]
    answers = {}
    for key in keys:
        with tempfile.TemporaryDirectory() as folder:
            answers[key] = answer_of(key, Path(folder))
    FIXTURE.write_text("{\n" + ",\n".join(f"{json.dumps(key)}: {json.dumps(value)}" for key, value in answers.items())
                       + "\n}\n")
    print(f"{FIXTURE.relative_to(ROOT)}: {len(answers)} answers, {sum(value[0] != 0 for value in answers.values())} "
          "refusals")
