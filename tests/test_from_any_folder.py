"""Issue 94 item 2: the commands work from any folder, even one holding data/, training/ and checkpoint/
folders of the user's own. Before, `python -m data.preprocess` there failed with an ImportError: the
editable install's finder was asked after the working directory, whose data/ became the package (and before
issue 34, with no install, outside the repository root at all). The repository is installed by
requirements.txt's `-e` line, into a throwaway virtualenv that sees this interpreter's packages; the
README's commands then run there with tiny sizes."""

import importlib
import json
import os
import re
import shlex
import site
import subprocess
import sys
from pathlib import Path

import pytest

from data.corpus import default_corpus_documents
from tests.readme import ROOT, doc_section, readme_section
from tests.repository_tree import repository_files

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2"]
# pyproject.toml's [project.scripts] (tomllib is Python 3.11's; the project supports 3.10)
SCRIPTS = dict(re.findall(r'^(zero-gpt-[\w-]+) = "([\w.:]+)"$', (ROOT / "pyproject.toml").read_text(), flags=re.M))


def test_every_console_command_names_a_function_that_exists():
    assert len(SCRIPTS) >= 5  # the regex found the table (training.generate's command may join it)
    for name, target in SCRIPTS.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), f"{name} = {target}"


def editable_lines() -> list[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.strip().startswith("-e ")]


def install(venv: Path) -> Path:
    """requirements.txt's `pip install -e .` into a new virtualenv at `venv` (no index, no build isolation:
    offline); the virtualenv reads this interpreter's site-packages through a .pth of its own. Its bin/."""
    assert editable_lines() == ["-e ."], editable_lines()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = Path(next(venv.glob("lib/python*/site-packages")))
    outer = [entry for entry in site.getsitepackages() + sys.path if entry.endswith(("site-packages", "dist-packages"))]
    (packages / "outer.pth").write_text("\n".join(dict.fromkeys(outer)) + "\n")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "-e", "."], cwd=ROOT, check=True, capture_output=True, env=clean_env())
    return venv / "bin"


def clean_env() -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "WANDB_MODE": "disabled"}


def start(argv: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> str:
    """The command's output once it has succeeded."""
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, f"{' '.join(process.args)}: exit {process.returncode}\n{err[-3000:]}"
    return out


def run(argv: list[str], cwd: Path) -> str:
    return finish(start(argv, cwd))


def bash_commands(text: str) -> list[list[str]]:
    """The commands of a page's ```bash blocks, one word list each (continuation lines joined)."""
    joined = re.sub(r"\\\n\s*", " ", "".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S)))
    return [shlex.split(line) for line in joined.splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.slow
def test_the_readmes_commands_run_from_a_folder_holding_data_training_and_checkpoint(tmp_path):
    before = repository_files()
    bin_dir = install(tmp_path / "venv")
    assert sorted(path.name for path in bin_dir.glob("zero-gpt-*")) == sorted(SCRIPTS)
    user = tmp_path / "user"
    for name in ("data", "training", "checkpoint"):
        (user / name).mkdir(parents=True)
    with open(user / "data" / "corpus.jsonl", "w") as corpus:
        corpus.writelines(json.dumps({"text": text}) + "\n" for text in default_corpus_documents()[:200])
    python = str(bin_dir / "python")
    page = doc_section("docs/planning.md", "Planning a run: will it fit, and what will it send")
    assert ["python", "-m", "zero.plan", "tables"] in bash_commands(page)  # the paper's tables: a second, no dry run
    plan = start([python, "-m", "zero.plan", "tables"], user)  # beside the others: nothing of theirs is read
    preprocess, train = bash_commands(readme_section("Train on your own data"))
    assert preprocess[:3] == ["python", "-m", "data.preprocess"] and train[:2] == ["python", "pretrain_gpt.py"]
    run([python, *preprocess[1:], "--input", "data/corpus.jsonl", "--workers", "1",
         "--train-tokenizer-vocab-size", "300"], user)
    run([str(bin_dir / "zero-gpt-train"), *train[2:], *SMALL, "--train-iters", "2", "--eval-iters", "0",
         "--device", "cpu", "--save", "checkpoint/run"], user)
    run([str(bin_dir / "zero-gpt-convert"), "checkpoint/run", "hf"], user)
    assert "Table 1" in finish(plan)
    assert (user / "hf" / "model.safetensors").is_file() and (user / "my_data" / "my_text_document.idx").is_file()
    assert repository_files() == before
