"""A user's setting for the commands of the README and docs/ (issue 94: "a fresh clone, tried from a folder that has
`data/` and `checkpoint/` sub-folders"): this clone installed as the README installs it (requirements.txt's
`-e .` line) into a throwaway virtualenv, and a working folder of the user's own holding `data/`, `training/` and
`checkpoint/` folders (the names of three of our packages), with no PYTHONPATH. A `python -m` command run there has
the working folder first on its path, as a user's has: the packages are found through the editable install's `.pth`
line, or not at all. tests/test_docs_commands.py runs the pages' cheap commands there and their CPU training commands
with tiny sizes, tests/test_from_any_folder.py the README's own-data commands and the tools after them.

The virtualenv is made once a worker (tests/conftest.py's `installed_clone`, about 2.5 s: offline, no build
isolation); it sees this interpreter's packages through a `.pth` of its own, so nothing is downloaded.
"""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

from tests.readme import ROOT

USER_FOLDERS = ("data", "training", "checkpoint")  # a user's own folders, named as our packages are


def editable_lines() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.strip().startswith("-e ")]


def clean_env(**extra: str) -> dict:
    """This environment without PYTHONPATH (a user's shell has none), wandb off, and `extra`."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "WANDB_MODE": "disabled", **extra}


def bare_venv(venv: Path) -> Path:
    """A new virtualenv at `venv` that reads this interpreter's site-packages through a .pth of its own, without
    this repository on its path. Its bin/."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = Path(next(venv.glob("lib/python*/site-packages")))
    outer = [entry for entry in site.getsitepackages() + sys.path if entry.endswith(("site-packages", "dist-packages"))]
    (packages / "outer.pth").write_text("\n".join(dict.fromkeys(outer)) + "\n")
    return venv / "bin"


def install(venv: Path) -> Path:
    """requirements.txt's `pip install -e .` into `bare_venv(venv)` (no index, no build isolation: offline). Its
    bin/."""
    assert editable_lines() == ["-e ."], editable_lines()
    bare_venv(venv)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "-e", "."], cwd=ROOT, check=True, capture_output=True, env=clean_env())
    return venv / "bin"


def user_folder(path: Path) -> Path:
    """`path` made a user's working folder: its data/, training/ and checkpoint/ folders (empty: no __init__.py)."""
    for name in USER_FOLDERS:
        (path / name).mkdir(parents=True, exist_ok=True)
    return path


def in_the_clone(word: str) -> str:
    """A command's word as a user in another folder types it: a path naming one of the clone's files (`scripts/x.py`,
    `pretrain_gpt.py`, `tests/fixtures/...`, `docs/x.json`) with the clone's path in front; any other word (a flag,
    a config name, the user's own paths) as written, resolved in the working folder."""
    if word.startswith("-") or os.path.isabs(word) or not (ROOT / word).exists():
        return word
    if "/" in word or (ROOT / word).is_file():  # a bare `data` or `training` is no path of the clone's
        return str(ROOT / word)
    return word
