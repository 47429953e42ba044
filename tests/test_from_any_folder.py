"""Issue 94 item 2: the commands work from any folder, even one holding data/, training/ and checkpoint/
folders of the user's own. Before, `python -m data.preprocess` there failed with an ImportError: the
editable install's finder was asked after the working directory, whose data/ became the package (and before
issue 34, with no install, outside the repository root at all). The repository is installed by
requirements.txt's `-e` line, into a throwaway virtualenv that sees this interpreter's packages (tests/user_folder.py,
shared with tests/test_docs_commands.py, which runs every cheap command of the pages from such a folder); the
README's own-data commands then run there with tiny sizes, and the checkpoint they make is consolidated, resharded,
converted and generated from, and its metrics plotted, as docs/checkpoints.md and docs/configuration.md write those
commands."""

import importlib
import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from data.corpus import default_corpus_documents
from tests.readme import ROOT, doc_section, readme_section
from tests.repository_tree import repository_files
from tests.user_folder import clean_env, user_folder

SMALL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2"]
# pyproject.toml's [project.scripts] (tomllib is Python 3.11's; the project supports 3.10)
SCRIPTS = dict(re.findall(r'^(zero-gpt-[\w-]+) = "([\w.:]+)"$', (ROOT / "pyproject.toml").read_text(), flags=re.M))


def test_every_console_command_names_a_function_that_exists():
    assert len(SCRIPTS) >= 5  # the regex found the table (training.generate's command may join it)
    for name, target in SCRIPTS.items():
        module, _, function = target.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), f"{name} = {target}"


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
    return [shlex.split(line, comments=True) for line in joined.splitlines()
            if line.strip() and not line.startswith("#")]


@pytest.mark.slow
def test_the_readmes_commands_run_from_a_folder_holding_data_training_and_checkpoint(tmp_path, installed_clone):
    before = repository_files()
    bin_dir = installed_clone
    assert sorted(path.name for path in bin_dir.glob("zero-gpt-*")) == sorted(SCRIPTS)
    user = user_folder(tmp_path / "user")
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
    trained = run([str(bin_dir / "zero-gpt-train"), *train[2:], *SMALL, "--train-iters", "2", "--eval-iters", "0",
                   "--device", "cpu", "--save", "checkpoint/run"], user)
    converting = start([str(bin_dir / "zero-gpt-convert"), "checkpoint/run", "hf"], user)
    tools = bash_commands(doc_section("docs/checkpoints.md", "Tools: one fp32 file, another TP size, Hugging Face"))
    fp32, reshard = tools[0], tools[1]
    assert fp32[:3] == ["python", "scripts/tools/zero_to_fp32.py", "ckpt"]
    assert reshard[:3] == ["python", "scripts/tools/reshard_checkpoint.py", "ckpt"]
    assert reshard[-2:] == ["--tensor-model-parallel-size", "4"]
    run([python, str(ROOT / fp32[1]), "checkpoint/run", *fp32[3:]], user)
    run([python, str(ROOT / reshard[1]), "checkpoint/run", *reshard[3:-1], "2"], user)  # the tiny model's 2 heads
    generate = bash_commands(doc_section("docs/checkpoints.md", "Generating text from a checkpoint"))[0]
    assert generate[:5] == ["python", "-m", "training.generate", "--load", "ckpt"]
    at = generate.index("--num-tokens-to-generate") + 1  # 40 positions past the prompt: the tiny model has 16
    generated = run([python, *generate[1:4], "checkpoint/run", *generate[5:at], "4", *generate[at + 1:]], user)
    assert "generated ids:" in generated
    plot = [line.split(": ", 1)[1] for line in trained.splitlines() if "python -m training.plot" in line]
    assert len(plot) == 1, trained[-2000:]  # the command the run prints, as docs/configuration.md writes it
    plot_argv = shlex.split(plot[0])
    assert plot_argv[:3] == ["python", "-m", "training.plot"], plot[0]
    run([python, *plot_argv[1:]], user)
    finish(converting)
    assert "Table 1" in finish(plan)
    assert (user / "hf" / "model.safetensors").is_file() and (user / "my_data" / "my_text_document.idx").is_file()
    assert list(user.glob("runs/*/curves.png"))
    assert (user / "model_fp32.safetensors").is_file() and (user / "ckpt_tp4" / "latest").is_file()
    assert repository_files() == before  # the README's commands ran in the user's folder (its runs/ above)
