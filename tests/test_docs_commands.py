"""Every command in the shell blocks of README.md and docs/*.md is run or checked, and every relative
link resolves (issue 24: the README moved into docs/ pages; a renamed flag or script must not leave a
page that no longer works).

A command is one of:
- RUN: cheap as written (the planner, the performance model, a printout of launch lines, pretrain_gpt.py's
  --help / --print-config / --dry-run): run as a user of a fresh clone runs it (tests/user_folder.py): the clone
  installed by requirements.txt's `-e .` into a virtualenv, no PYTHONPATH, from a working folder of the user's own
  holding data/, training/ and checkpoint/ folders (which a `python -m` command must not take for our packages),
  the paths of the clone's files given with the clone's path in front; exit status 0.
- TRAINED: a pretrain_gpt.py training command a CPU can run (one process, or `torchrun --nproc_per_node 2` on gloo):
  run as RUN commands are, from such a folder, with its own words (its placeholders handled as without_placeholders
  does, or filled below) and tiny sizes appended (TINY: 2 layers of width 32, sequence 16, 2 iterations of 2 samples,
  no evaluation), exit status 0 and the iterations trained. What it reads is put in the folder first, as the pages
  make it: `--data-path my_data/...` the README's preprocess command's output (run once a worker on a corpus.jsonl
  of 200 documents); the embedded corpus, where no data is named, from a $HOME whose cache holds it at 300 tokens; a
  checkpoint the user brings, by a tiny run of the same command first (MADE_CHECKPOINTS), or DeepSpeed's fixture
  (DEEPSPEED_CASE), or the HF folder the block's convert_to_hf.py command writes (`--init-from-hf ...`); a command
  that continues an earlier one's --save in its block runs after it in the same folder.
- CHECKED: expensive (multi-GPU and multi-node launchers, SLURM, --device cuda, --compile (NOT_TRAINED_HERE),
  benchmarks, work on the user's own files by other tools): not run,
  but pretrain_gpt.py's flags are parsed by its own parser (arguments.parser.parse_arguments), so a
  renamed or removed flag fails; another script must exist and name every flag the command gives in
  its --help (run as a RUN command is, from such a folder).
- SKIPPED: in SKIPPED_COMMANDS below with the reason (the whole test suite), or an `export`, whose
  variables the commands after it in its block get.
Anything else fails `test_every_command_is_classified`, so a new command cannot go untested.
"""

from __future__ import annotations

import functools
import glob
import json
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from tests.readme import DOCS, README, ROOT, doc_pages, headings
from tests.repository_tree import repository_files
from tests.user_folder import clean_env, in_the_clone, user_folder

SHELL_FENCES = ("bash", "sh", "shell", "console")


@dataclass(frozen=True)
class DocCommand:
    page: str                           # README.md or docs/x.md
    line: int                           # where its block starts
    argv: tuple[str, ...]               # the words, environment assignments in front removed
    env: tuple[tuple[str, str], ...]    # `NAME=value` in front, and the block's earlier `export`s

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}:{' '.join(self.argv)[:60]}"


def shell_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number of the opening fence, language, body) of every ```bash/sh/shell/console block."""
    blocks = []
    for match in re.finditer(r"^[ \t]*```([\w-]*)[ \t]*\n(.*?)^[ \t]*```[ \t]*$", text, flags=re.M | re.S):
        if match.group(1) in SHELL_FENCES:
            blocks.append((text.count("\n", 0, match.start()) + 1, match.group(1), match.group(2)))
    return blocks


def block_commands(language: str, body: str) -> list[list[str]]:
    """The commands of one block, as word lists: backslash continuations joined, comments dropped,
    prompts (`$ `) removed; in a console block only prompted lines are commands (the rest is output).
    `a && b` is two commands; `[--flag value]` (an optional part) is taken as given."""
    commands = []
    for line in re.sub(r"\\\n[ \t]*", " ", body).splitlines():
        line = line.strip()
        prompted = line.startswith("$ ")
        if prompted:
            line = line[2:]
        elif language == "console":
            continue
        words = [word.strip("[]") for word in shlex.split(line, comments=True)]
        words = [word for word in words if word]
        while words:
            if "&&" in words:
                at = words.index("&&")
                commands.append(words[:at])
                words = words[at + 1:]
            else:
                commands.append(words)
                words = []
    return [command for command in commands if command]


def doc_commands() -> list[DocCommand]:
    commands = []
    for page in doc_pages():
        for line, language, body in shell_blocks(page.read_text()):
            exported: dict[str, str] = {}
            for words in block_commands(language, body):
                own = {}
                while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                    name, value = words.pop(0).split("=", 1)
                    own[name] = value
                if not words:  # `NAME=value` alone: a shell variable for the lines after it
                    exported.update(own)
                    continue
                if words[0] == "export":
                    exported.update(word.split("=", 1) for word in words[1:])
                commands.append(DocCommand(str(page.relative_to(ROOT)), line, tuple(words),
                                           tuple({**exported, **own}.items())))
    return commands


# ---- classification ------------------------------------------------------------------------------

RUN, TRAINED, CHECKED, SKIPPED = "run", "trained", "checked", "skipped"

SKIPPED_COMMANDS = {
    ("python", "-m", "pytest"): "the whole test suite, which this test is part of; .ci/run runs it",
}

# Scripts whose commands are checked, not run, with why they are too expensive to run here.
EXPENSIVE_SCRIPTS = {
    "scripts/bench/benchmark_zero.py":
        "trains ten systems x stages in fresh process groups for minutes (~8 min at --rounds 3)",
    "scripts/bench/benchmark_moe.py":
        "trains ours and DeepSpeed-MoE at EP 2 in fresh process groups for minutes (~17 min at --rounds 3 --stages "
        "1,2 on the shared 2-core machine)",
    "scripts/bench/benchmark_model.py":
        "rounds of a 124M model's training steps on the CPU, tens of seconds each",
    "scripts/bench/benchmark_host_ops.py":
        "builds and counts 40 models, half of them compiled, and 8 Megatron-LM launches with --megatron-lm (about 25 "
        "minutes on the shared 2-core machine); tests/scripts/test_host_op_counts.py counts 2-layer models",
    "scripts/bench/benchmark_gpu.py":
        "needs a CUDA GPU: rounds of a 1.5B model's training steps (docs/performance.md)",
    "scripts/tools/layout_fuzz.py":
        "trains each draw on 2-8 gloo ranks and on one rank (about 15 s a draw on 2 cores); "
        "tests/scripts/test_layout_fuzz.py runs 3 draws, and 8 in the slow tier",
    "scripts/bench/gpu_side_by_side.py":
        "needs a CUDA GPU: 17 training launches of 124M-1.5B models (--budget-s 450 by default); "
        "tests/scripts/test_gpu_side_by_side.py runs it on the CPU at 2 layers",
    "scripts/bench/benchmark_index.py": "writes a 2 GB synthetic corpus, then builds its indices in rounds",
    "scripts/zero_paper/mini_reproduction.py": "trains C1-C5 as 4 gloo processes (about 11 minutes)",
    "scripts/zero_paper/calibrate_cpu.py": "trains six small GPTs (about 1.5 minutes)",
    "scripts/bench/search_vs_measured.py":
        "trains 16 layouts on 4 gloo ranks in 3 rounds (about 30 minutes on a loaded box)",
    "scripts/bench/probe_cpu_ranks.py": "times GEMMs, copies and gloo collectives on 4 ranks at once (about 20 s)",
    "scripts/zero_paper/report.py": "about 200 dry runs on a cold plan cache (about 25 minutes)",
    "scripts/zero_paper/compare.py": "about 150 dry runs of 1B-200B models on a cold plan cache (about 5 minutes)",
    "scripts/tools/zero_to_fp32.py":
        "reads the user's checkpoint `ckpt`; tests/test_from_any_folder.py runs it from a user's folder on the "
        "checkpoint the README's command saved there",
    "scripts/tools/reshard_checkpoint.py":
        "reads the user's checkpoint `ckpt`; tests/test_from_any_folder.py runs it from a user's folder on the "
        "checkpoint the README's command saved there",
    "scripts/tools/convert_to_hf.py":
        "reads the user's checkpoint `ckpt`; tests/test_from_any_folder.py runs it as zero-gpt-convert from a user's "
        "folder on the checkpoint the README's command saved there",
    "scripts/tools/deepspeed_checkpoint_fixtures.py":
        "trains DeepSpeed's runs (requirements-bench.txt) on gloo ranks for minutes (about 5 on the shared 2-core "
        "machine)",
    "scripts/bench/fp8_curves.py":
        "trains a 4-layer GPT 300 iterations in bf16 and each FP8 recipe (46 min at --jobs 5 on the shared 2-core "
        "machine; tests/scripts/test_fp8_curves.py runs it 2 iterations)",
    "data.preprocess": "reads the user's corpus.jsonl; tests/test_from_any_folder.py runs the README's command on a "
                       "corpus it writes, from a user's folder (tests/training/test_first_hour.py too, and this "
                       "module for the data its TRAINED commands read); docs/data.md's second needs Llama 3's "
                       "tokenizer folder",
    "training.generate": "reads the user's checkpoint; tests/test_from_any_folder.py runs docs/checkpoints.md's first "
                         "command from a user's folder on the checkpoint the README's command saved there, and "
                         "tests/training/test_generate.py runs it on checkpoints it writes and on Megatron-LM's, "
                         "and under torchrun at TP 2",
    "training.plot": "reads the user's metrics.jsonl; tests/test_from_any_folder.py runs the command a training run "
                     "prints from a user's folder, tests/training/test_plot.py on the metrics it wrote",
}

# Module commands run as written unless listed here (the planner and the performance model are cheap).
RUNNABLE_MODULES = ("zero.plan", "zero.perf_model")

LAUNCHERS = ("scripts/launch_single_node.sh", "scripts/launch_multi_node.sh")

# What a page says a run command prints (its trailing comment), checked in the output.
STATED_OUTPUT = {
    "python -m zero.perf_model --hardware dgx2-v100 --config zero_paper/100b-125x8192": "37.4 TFLOP/s per GPU",
    # docs/planning.md: "35.57 GiB of 74.51 GiB ... 38.94 GiB of headroom"
    "python -m zero.plan dry-run --config gpt2-1.5b --world-size 8 --gpus-per-node 8 --gpu-memory 80GB": "headroom 38.94 GiB",
    # docs/planning.md: the Figure 6 table's last row, layers, parameters and per-GPU total
    "python -m zero.plan max-size --config zero_paper/100b-125x8192": "| C5 | P_os+g + P_a+cpu | 225 | 181.6B | 29.77 GiB |",
    # docs/planning.md: Mixtral 8x7B at EP 8 and the DeepSeek-V3-shaped model: the totals with the worst-case routing
    # (55.49 and 60.27 GiB before RMSNorm kept only its input and the experts' gated activation only gate and up:
    # an expert's saved row 122,880 -> 94,208 bytes for Mixtral, 30,720 -> 26,624 for the DeepSeek-V3 shape; 54.71
    # and 56.17 before the blocks' RMSNorms kept autograd's fp32 copy again without --recompute-modules layernorm,
    # in the recomputed block beside the checkpoints; 54.83 and 56.39 before the grouped matmul stopped keeping the
    # experts' weights stacked and the combine its weighted rows; 54.32 and 55.41 before the norms kept their rsqrt
    # and ZeRO 1 reduce-scattered in its gradient buffer; 54.70 for the DeepSeek-V3 shape before its first stage held
    # two pipeline sends, not sixteen, and its parameter gradients were read where they arrive)
    "python -m zero.plan dry-run --world-size 64 --gpus-per-node 8 --gpu-memory 80GB --host-memory 2TB":
        "total with the worst-case routing                                                                            54.07 GiB",
    "python -m zero.plan dry-run --world-size 1024 --gpus-per-node 8 --gpu-memory 80GB --host-memory 2TB":
        "total with the worst-case routing                                                                             53.93 GiB",
}


# pretrain_gpt.py commands that would train on a CPU but stay CHECKED: a word they hold, and why.
NOT_TRAINED_HERE = {
    "cuda": "needs a CUDA GPU (--device cuda)",
    "--compile": "--compile: inductor compiles the blocks on the CPU, about 27 s of CPU (100 s wall at load 5) for "
                 "docs/fp8.md's 2-layer model; tests/gpt/test_fp8_compile.py compiles FP8 blocks",
}


@dataclass(frozen=True)
class Verdict:
    kind: str                       # RUN, TRAINED, CHECKED or SKIPPED
    reason: str
    program: str = ""               # the script or module path checked or run
    pretrain: tuple[str, ...] = ()  # CHECKED: pretrain_gpt.py's flags, for its parser
    flags: tuple[str, ...] = ()     # CHECKED: another program's words, each --flag to be in its --help


def python_target(argv: tuple[str, ...]) -> Optional[tuple[str, tuple[str, ...]]]:
    """(script path or module name, its arguments) for `python X.py ...` or `python -m M ...`."""
    if len(argv) < 2 or argv[0] not in ("python", "python3"):
        return None
    if argv[1] == "-m" and len(argv) > 2:
        return argv[2], argv[3:]
    return argv[1], argv[2:]


def without_placeholders(args: tuple[str, ...]) -> list[str]:
    """The flags a command gives pretrain_gpt.py, its placeholders dropped: `...` stands for "your
    other flags", and a flag that takes a value and is given `...` (`--data-path ...`) is the user's
    to fill in; a switch before `...` (`--bf16 ...`) is kept."""
    from arguments.parser import build_parser

    switches = {option for action in build_parser()._actions if action.nargs == 0 for option in action.option_strings}
    kept: list[str] = []
    for word in args:
        if word == "...":
            if kept and kept[-1].startswith("--") and kept[-1] not in switches:
                kept.pop()
            continue
        kept.append(word)
    return kept


def is_pretrain(word: str) -> bool:
    return word == "pretrain_gpt.py" or word.endswith("/pretrain_gpt.py")


def trained_or_checked(how: str, args: tuple[str, ...]) -> Verdict:
    """A pretrain_gpt.py training command: TRAINED with tiny sizes, or CHECKED where NOT_TRAINED_HERE says why not."""
    for word, reason in NOT_TRAINED_HERE.items():
        if word in args:
            return Verdict(CHECKED, reason, program="pretrain_gpt.py", pretrain=args)
    return Verdict(TRAINED, f"trains, {how}, with tiny sizes", program="pretrain_gpt.py", pretrain=args)


def classify(command: DocCommand) -> Optional[Verdict]:
    argv = command.argv
    for prefix, reason in SKIPPED_COMMANDS.items():
        if argv[:len(prefix)] == prefix:
            return Verdict(SKIPPED, reason)
    if argv[0] == "export":
        return Verdict(SKIPPED, "sets variables that the commands after it in its block are run or checked with")
    if argv[:3] == ("pip", "install", "-r") and len(argv) == 4:
        return Verdict(CHECKED, "installs packages from the registry (.ci/run does); the requirements file must exist",
                       program=argv[3])
    if argv[0] == "torchrun":
        at = next((i for i, word in enumerate(argv) if is_pretrain(word)), None)
        if at is None and "-m" in argv and argv[argv.index("-m") + 1:][:1] == ("training.generate",):
            at = argv.index("-m") + 1
            return Verdict(CHECKED, f"a multi-process generation; {EXPENSIVE_SCRIPTS[argv[at]]}", program=argv[at],
                           flags=argv[at + 1:])
        if at is None:
            return None
        if argv[1:at] == ("--nproc_per_node", "2"):
            return trained_or_checked("two gloo processes on the CPU", argv[at + 1:])
        return Verdict(CHECKED, "a multi-process training launch", program="pretrain_gpt.py",
                       pretrain=argv[at + 1:])
    if argv[0] in LAUNCHERS:
        reason = ("a multi-node launch" if "multi_node" in argv[0] else
                  "a multi-GPU launch, one process a visible GPU (without GPUs 2 gloo processes, as docs/zero.md's "
                  "`torchrun --nproc_per_node 2` command, which is TRAINED, launches them)")
        return Verdict(CHECKED, reason, program=argv[0], pretrain=argv[1:])
    if argv[0] == "sbatch":
        at = next((i for i, word in enumerate(argv) if word.endswith(".sbatch")), None)
        if at is None:
            return None
        return Verdict(CHECKED, "a SLURM job on GPU nodes", program=argv[at], pretrain=argv[at + 1:])
    target = python_target(argv)
    if target is None:
        return None
    program, args = target
    if is_pretrain(program):
        if {"--help", "--print-config", "--dry-run"} & set(args):
            return Verdict(RUN, "prints and exits without training", program=program)
        return trained_or_checked("one process on the CPU", args)
    if "--help" in args:
        return Verdict(RUN, "--help", program=program)
    if program in RUNNABLE_MODULES:
        return Verdict(RUN, "the planner or the performance model on the meta device", program=program)
    if program == "scripts/zero_paper/run.py":
        if "--submit" in args:
            return Verdict(CHECKED, "submits SLURM jobs", program=program, flags=args)
        if "--dry-run" in args:
            return Verdict(CHECKED, "plans every point of a figure (dry runs of 8B-170B models, minutes on a cold cache)",
                           program=program, flags=args)
        return Verdict(RUN, "prints one launch line per point", program=program)
    if program in EXPENSIVE_SCRIPTS:
        return Verdict(CHECKED, EXPENSIVE_SCRIPTS[program], program=program, flags=args)
    return None


COMMANDS = doc_commands()
VERDICTS = {command: classify(command) for command in COMMANDS}
RUNS = [command for command, verdict in VERDICTS.items() if verdict is not None and verdict.kind == RUN]
CHECKS = [command for command, verdict in VERDICTS.items() if verdict is not None and verdict.kind == CHECKED]


def test_every_command_is_classified():
    assert len(COMMANDS) > 20  # the extraction found the pages' commands
    unclassified = [command.id for command, verdict in VERDICTS.items() if verdict is None]
    assert unclassified == [], ("commands neither run, checked nor skipped with a reason; add a rule in "
                                f"tests/test_docs_commands.py: {unclassified}")
    counts = {kind: sum(verdict.kind == kind for verdict in VERDICTS.values())
              for kind in (RUN, TRAINED, CHECKED, SKIPPED)}
    print(f"docs commands: {counts}")


def test_commands_are_extracted_as_a_shell_reads_them():
    body = ("# a comment line\n"
            "$ python -m zero.plan dry-run --world-size 8 \\\n"
            "    --zero-stage 1     # a trailing comment\n"
            "pip install -r requirements.txt && python -m pytest\n"
            "python scripts/tools/convert_to_hf.py ckpt out [--dtype bf16]\n")
    assert block_commands("bash", body) == [
        ["python", "-m", "zero.plan", "dry-run", "--world-size", "8", "--zero-stage", "1"],
        ["pip", "install", "-r", "requirements.txt"], ["python", "-m", "pytest"],
        ["python", "scripts/tools/convert_to_hf.py", "ckpt", "out", "--dtype", "bf16"]]
    assert block_commands("console", "$ python pretrain_gpt.py --help\nusage: pretrain_gpt.py ...\n") == [
        ["python", "pretrain_gpt.py", "--help"]]
    unknown = DocCommand("docs/x.md", 1, ("python", "scripts/a_new_tool.py", "--rounds", "3"), ())
    assert classify(unknown) is None  # a new command fails the test until a rule says what to do with it


def test_the_readme_holds_the_commands_ci_runs():
    """.ci/run runs the README's test command; the README keeps it, and the training command, verbatim."""
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    test_command = ci[ci.index("# The README's test command.") + 1]
    assert test_command == "pip install -r requirements.txt && python -m pytest"
    blocks = [body.strip() for _, _, body in shell_blocks(README.read_text())]
    assert test_command in blocks
    assert "pip install -r requirements.txt && python pretrain_gpt.py" in blocks


@functools.lru_cache(maxsize=None)
def help_text(program: str, bin_dir: Path, cwd: Path) -> str:
    """A script's or module's --help output, run by the installed clone's python from the user's folder `cwd`."""
    launch = ["-m", program] if not program.endswith(".py") else [in_the_clone(program)]
    result = subprocess.run([str(bin_dir / "python"), *launch, "--help"], cwd=cwd, capture_output=True, text=True,
                            timeout=120, env=clean_env())
    assert result.returncode == 0, f"{program} --help: exit {result.returncode}: {result.stderr[-2000:]}"
    return result.stdout


@pytest.fixture(scope="module")
def help_folder(tmp_path_factory) -> Path:
    """The user's folder the checked commands' --help runs from (nothing is written there)."""
    return user_folder(tmp_path_factory.mktemp("user"))


@pytest.mark.slow
@pytest.mark.parametrize("command", CHECKS, ids=[command.id for command in CHECKS])
def test_an_expensive_command_is_checked_without_running(command: DocCommand, installed_clone, help_folder):
    from arguments.parser import parse_arguments

    verdict = VERDICTS[command]
    path = verdict.program
    if path.endswith((".py", ".sh", ".sbatch", ".txt")):
        assert (ROOT / path).is_file(), f"{command.id}: {path} does not exist"
    else:
        assert (ROOT / (path.replace(".", "/") + ".py")).is_file(), f"{command.id}: module {path} does not exist"
    if verdict.pretrain or path.endswith(("pretrain_gpt.py", ".sh", ".sbatch")):
        parse_arguments(without_placeholders(verdict.pretrain))  # a renamed or removed flag, a bad value: ConfigError
    flags = [word.split("=", 1)[0] for word in verdict.flags if word.startswith("--") and word != "--"]
    if flags:
        text = help_text(path, installed_clone, help_folder)
        missing = [flag for flag in flags if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)]
        assert missing == [], f"{command.id}: {path} --help does not name {missing}"


def substituted(command: DocCommand, bin_dir: Path, tmp_path: Path) -> list[str]:
    """The command as a user of the installed clone runs it from another folder: `python` is the virtualenv's,
    globs are expanded in the clone, and the clone's files are named with its path (tests/user_folder.py
    in_the_clone); outputs that would land in the checkout go to tmp_path instead: `--output` of the performance
    model's calibration (it would rewrite the committed configs/hardware/calibrations/ file), and run.py's launch
    files (its default --runs-dir is the repository's runs/)."""
    argv = list(command.argv)
    argv[0] = str(bin_dir / "python")
    if "--output" in argv and "zero.perf_model" in argv:
        at = argv.index("--output") + 1
        argv[at] = str(tmp_path / Path(argv[at]).name)
    if "scripts/zero_paper/run.py" in argv:
        at = argv.index("--") if "--" in argv else len(argv)
        argv[at:at] = ["--runs-dir", str(tmp_path / "runs")]
    expanded = []
    for word in argv:
        if "*" in word:
            matches = sorted(glob.glob(word, root_dir=ROOT))
            assert matches, f"{command.id}: {word} matches nothing"
            expanded += [str(ROOT / match) for match in matches]
        else:
            expanded.append(in_the_clone(word))
    return expanded


@pytest.mark.slow
@pytest.mark.parametrize("command", RUNS, ids=[command.id for command in RUNS])
def test_a_cheap_command_runs_as_written(command: DocCommand, installed_clone, tmp_path):
    env = clean_env(**dict(command.env), ZERO_GPT_PLAN_CACHE=str(tmp_path / "plans"))
    before = repository_files()
    result = subprocess.run(substituted(command, installed_clone, tmp_path), cwd=user_folder(tmp_path / "user"),
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{command.id}: exit {result.returncode}\n{result.stderr[-3000:]}"
    assert result.stdout.strip(), f"{command.id}: printed nothing"
    for prefix, stated in STATED_OUTPUT.items():
        if " ".join(command.argv).startswith(prefix):
            assert stated in result.stdout, f"{command.id}: the page says it prints {stated!r}"
    after = repository_files()
    assert after == before, f"{command.id} wrote into the repository: {sorted(set(after) - set(before))}"


# ---- trained: pretrain_gpt.py's training commands, with tiny sizes ----------------------------------------------------

# Appended to a trained command (the last of a repeated flag wins): a 2-layer model of width 32, 2 iterations a run of
# 2 samples of 16 tokens, no evaluation. The command's own flags (its features) stay; only its sizes are replaced.
RUN_SIZES = ("--micro-batch-size", "1", "--global-batch-size", "2", "--eval-iters", "0", "--log-interval", "1")
TINY = ("--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
        "--max-position-embeddings", "16", *RUN_SIZES)
ITERATIONS_A_RUN = 2
# Where a command names no data or tokenizer it trains on the embedded corpus with its trained tokenizer; 300 tokens
# is the vocabulary conftest's corpus_cache_300 is prepared at, which the runs' $HOME/.cache/zero-gpt links to.
EMBEDDED = ("--tokenizer-vocab-size", "300")
DATA_FLAGS = ("--data-path", "--mock-data", "--tokenizer-file", "--vocab-file", "--init-from-hf")

FIXTURES = ROOT / "tests" / "fixtures"
# docs/checkpoints.md's `--load ckpt_ds`: Megatron-DeepSpeed's GPTModel at ZeRO 3 with its universal form; the
# command's `...` (the run's model and data flags) is the flags the fixture's run is continued with, its data copied
# beside, its sizes the fixture's (the command's own model flags are its): one iteration past the save
DEEPSPEED_CASE = "megatron_deepspeed_zero3"
# docs/checkpoints.md's `--init-from-hf ...`: the folder the block's convert_to_hf.py command writes from the user's
# `ckpt`, here a checkpoint of ours from an earlier commit (2 layers, width 32, 300 tokens); the folder is the model,
# so only RUN_SIZES are appended
OUR_CHECKPOINT = FIXTURES / "checkpoint_84ae2c6"
# A `--load` folder a command continues that the user brings, made first by a tiny run of the same command in the
# same folder (its --load dropped, this --save and these flags): docs/checkpoints.md's Megatron-LM run, written in
# Megatron-LM's torch_dist layout by --ckpt-format torch_dist (Megatron-LM's fixtures were written with
# NullTokenizer, which refuses the command's --vocab-file)
MADE_CHECKPOINTS = {"megatron_ckpt": ("--ckpt-format", "torch_dist")}


def flag_value(args, flag: str) -> Optional[str]:
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None


def trained_sequences() -> list[list[DocCommand]]:
    """The trained commands as runs in one folder each: a command of the same words as an earlier one (on another
    page) is not run again, and one whose --load is the --save of an earlier one of its block runs after it there."""
    sequences: list[list[DocCommand]] = []
    seen: set = set()
    for command, verdict in VERDICTS.items():
        if verdict is None or verdict.kind != TRAINED or (command.argv, command.env) in seen:
            continue
        seen.add((command.argv, command.env))
        load = flag_value(command.argv, "--load")
        earlier = [sequence for sequence in sequences if (sequence[-1].page, sequence[-1].line) == (
            command.page, command.line) and load is not None and load == flag_value(sequence[-1].argv, "--save")]
        if earlier:
            earlier[0].append(command)
        else:
            sequences.append([command])
    return sequences


TRAININGS = trained_sequences()


def training_id(commands: list[DocCommand]) -> str:
    """Where the commands are (and any of the same words elsewhere, not run again), and the last one's words."""
    places = [f"{command.page}:{command.line}" for command in COMMANDS if VERDICTS[command].kind == TRAINED and any(
        (command.argv, command.env) == (run.argv, run.env) for run in commands)]
    words = " ".join(commands[-1].argv)
    words = words if len(words) < 70 else f"{words[:40]}...{words[-25:]}"
    return f"{' = '.join(dict.fromkeys(places))}:{words}"


@pytest.fixture(scope="module")
def training_home(tmp_path_factory, corpus_cache_300) -> Path:
    """The trained commands' $HOME: its .cache/zero-gpt (the default --data-cache-dir) is the worker's embedded corpus
    at 300 tokens, prepared once, so no run trains a tokenizer and nothing is written to the real home."""
    home = tmp_path_factory.mktemp("home")
    (home / ".cache").mkdir()
    (home / ".cache" / "zero-gpt").symlink_to(corpus_cache_300)
    return home


def run_in(folder: Path, argv: list[str], env: dict) -> str:
    result = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(argv)}: exit {result.returncode}\n{result.stderr[-3000:]}"
    return result.stdout


def page_command(page: str, program: str) -> DocCommand:
    """The first command of `page` that runs `program`."""
    return next(command for command in COMMANDS if command.page == page and program in command.argv)


@pytest.fixture(scope="module")
def user_data(tmp_path_factory, installed_clone, training_home) -> Path:
    """The user's my_data/ (my_text_document.{bin,idx} and my_tokenizer/), made by the README's preprocess command from
    a corpus.jsonl of 200 of the embedded corpus's documents, in a user's folder, once a worker (about 1 s)."""
    from data.corpus import default_corpus_documents

    folder = user_folder(tmp_path_factory.mktemp("user-data"))
    preprocess = page_command("README.md", "data.preprocess")
    assert "--input" in preprocess.argv and "corpus.jsonl" in preprocess.argv, preprocess.argv
    with open(folder / "corpus.jsonl", "w") as corpus:
        corpus.writelines(json.dumps({"text": text}) + "\n" for text in default_corpus_documents()[:200])
    run_in(folder, [str(installed_clone / "python"), *preprocess.argv[1:], "--workers", "1",
                    "--train-tokenizer-vocab-size", "300"], clean_env(HOME=str(training_home)))
    return folder / "my_data"


def bring_user_files(args: list[str], folder: Path, user_data: Path) -> None:
    """Put in `folder` the data and tokenizer files a command names: the README's preprocessed my_data/, or its
    files under the names the command gives (`--data-path my-corpus_text_document`, `--vocab-file gpt2-vocab.json`,
    `--merge-file gpt2-merges.txt`: the preprocessed corpus's tokenizer is GPT-2's byte-level BPE)."""
    data_path = flag_value(args, "--data-path")
    if data_path is None:
        return
    if data_path.startswith("my_data/"):
        if not (folder / "my_data").exists():
            shutil.copytree(user_data, folder / "my_data")
        return
    for suffix in (".bin", ".idx"):
        if not (folder / (data_path + suffix)).exists():
            shutil.copy(user_data / f"my_text_document{suffix}", folder / (data_path + suffix))
    for flag, name in (("--vocab-file", "vocab.json"), ("--merge-file", "merges.txt")):
        if flag_value(args, flag) and not (folder / flag_value(args, flag)).exists():
            shutil.copy(user_data / "my_tokenizer" / name, folder / flag_value(args, flag))


def trained_argv(command: DocCommand, folder: Path, bin_dir: Path, user_data: Path, env: dict,
                 run: int = 0, runs: int = 1) -> list[str]:
    """The command as the user of the installed clone runs it in `folder` (run `run` of `runs` there, each
    ITERATIONS_A_RUN iterations further on: --exit-interval stops all but the last), what it reads put there first,
    its placeholders filled or dropped (without_placeholders), tiny sizes appended. torchrun is `python -m
    torch.distributed.run` (its console script's module) of the virtualenv's python."""
    argv = list(command.argv)
    at = next(i for i, word in enumerate(argv) if is_pretrain(word))
    head = [str(bin_dir / "python"), *(["-m", "torch.distributed.run"] if argv[0] == "torchrun" else []),
            *argv[1:at], in_the_clone(argv[at])]
    args = argv[at + 1:]
    sizes = [*TINY, "--train-iters", str(ITERATIONS_A_RUN * runs)]
    if run < runs - 1:
        sizes += ["--exit-interval", str(ITERATIONS_A_RUN * (run + 1))]
    bring_user_files(args, folder, user_data)
    if flag_value(args, "--load") == "ckpt_ds":
        shutil.copytree(FIXTURES / "deepspeed_checkpoints" / DEEPSPEED_CASE, folder / "ckpt_ds")
        shutil.copytree(FIXTURES / "deepspeed_checkpoints" / "data", folder / "ds_data")
        record = json.loads((FIXTURES / "deepspeed_checkpoints" / "losses.json").read_text())
        fill = [*record["cases"][DEEPSPEED_CASE]["our_flags"], "--data-path", "ds_data/tokens"]
        args = [word for placeholder in args for word in (fill if placeholder == "..." else [placeholder])]
        sizes = []
    if args[:2] == ["--init-from-hf", "..."]:
        convert = page_command(command.page, "scripts/tools/convert_to_hf.py")
        assert convert.argv[2:4] == ("ckpt", "gpt2_hf"), convert.argv
        shutil.copytree(OUR_CHECKPOINT, folder / "ckpt")
        run_in(folder, [str(bin_dir / "python"), in_the_clone(convert.argv[1]), *convert.argv[2:]], env)
        args = ["--init-from-hf", convert.argv[3], *args[2:]]
        sizes = [*RUN_SIZES, "--train-iters", str(ITERATIONS_A_RUN)]
    if not any(flag in args for flag in DATA_FLAGS):
        sizes += EMBEDDED
    return head + without_placeholders(tuple(args)) + sizes


def made_checkpoint(command: DocCommand) -> Optional[DocCommand]:
    """The tiny run that makes the checkpoint `command` continues where the user brings it (MADE_CHECKPOINTS)."""
    load = flag_value(command.argv, "--load")
    if load not in MADE_CHECKPOINTS:
        return None
    argv = list(command.argv)
    for flag in ("--load", "--save"):
        if flag in argv:
            del argv[argv.index(flag):argv.index(flag) + 2]
    return DocCommand(command.page, command.line, (*argv, "--save", load, *MADE_CHECKPOINTS[load]), command.env)


@pytest.mark.slow
class TestTrainedCommands:
    """A class, so that pytest-xdist's --dist loadscope may hand these runs to the other worker than the module's."""

    @pytest.mark.parametrize("commands", TRAININGS, ids=[training_id(commands) for commands in TRAININGS])
    def test_a_training_command_trains_with_tiny_sizes(self, commands, installed_clone, training_home, user_data,
                                                       tmp_path):
        folder = user_folder(tmp_path / "user")
        env = clean_env(**dict(commands[0].env), HOME=str(training_home), ZERO_GPT_PLAN_CACHE=str(tmp_path / "plans"))
        before = repository_files()
        runs = [made for made in [made_checkpoint(commands[0])] if made is not None] + list(commands)
        for run, command in enumerate(runs):
            out = run_in(folder, trained_argv(command, folder, installed_clone, user_data, env, run, len(runs)), env)
            first = ITERATIONS_A_RUN * run + 1 if flag_value(command.argv, "--load") != "ckpt_ds" else 3
            assert re.search(rf"> trained \d+ iterations? \(iterations? {first}\b", out), (
                f"{command.id}: did not train from iteration {first}\n{out[-3000:]}")
        assert repository_files() == before, f"{commands[0].id} wrote into the repository"


# ---- links ---------------------------------------------------------------------------------------

def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where a `[x](y)` is a link."""
    text = re.sub(r"^[ \t]*```.*?^[ \t]*```[ \t]*$", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def relative_links(page: Path) -> list[str]:
    targets = re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", prose(page.read_text()))
    return [target for target in targets if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def test_every_relative_link_resolves():
    broken = []
    for page in doc_pages():
        for target in relative_links(page):
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md":
                anchors = {slug(title) for _, _, title in headings(resolved.read_text())}
                if anchor not in anchors:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no heading with that anchor)")
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in relative_links(README)}
    assert [page.name for page in sorted(DOCS.glob("*.md")) if page.resolve() not in linked] == []
