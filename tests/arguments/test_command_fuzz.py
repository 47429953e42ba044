"""Generated bad inputs to every command beside the training program (issue 27): one line, exit 2,
nothing created.

From a fixed seed: unknown flags and near-miss typos, bad values of every kind (text for numbers,
zero, negative, NaN, 1e999, absurd sizes), grids that cannot exist, paths that name nothing, a
directory, a regular file where a directory is expected, a FIFO made here, /dev/zero, and malformed,
empty, non-UTF-8, absurdly nested or wrongly shaped JSON, YAML and definition files; for run.py,
typos and bad values among the flags after `--` that reach pretrain_gpt.py. The commands:
`python -m zero.plan`, scripts/zero_paper/run.py and report.py, convert_to_hf.py, zero_to_fp32.py,
reshard_checkpoint.py and `python -m data.preprocess` (scripts/tools/preprocess_data.py).

Each input runs through the command's own entry point (`command`/`main` behind base.errors.run_tool,
as `__main__` runs it) in this process, and must end with exit status 2, exactly one line on stderr,
no traceback, and no file or directory created or changed: in the case's directory (stat'ed, never
read, so a FIFO there is safe), in the plan cache, or in the repository's default run directory.
Planning is replaced by a tripwire, so an input that slips through fails fast instead of planning
for minutes.
"""

from __future__ import annotations

import os
import random
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from arguments.parser import build_parser as pretrain_parser
from data import preprocess
from planner import plan as zero_plan
from scripts.tools import convert_to_hf, reshard_checkpoint, zero_to_fp32
from tests.reliability_helpers import run_main

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts" / "zero_paper"))
import experiments  # noqa: E402
import report as zero_paper_report  # noqa: E402
import run as zero_paper_run  # noqa: E402

SEED = 20270127
MINIMUM_CASES = 200
SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32"]
HEADER = " ".join(experiments.COLUMNS)
GOOD_ROW = "dgx2 p zero 1 16 16 48 1600 16 4 4 2 1 0 1 5e8 2e8 5"  # a valid fig2 row (see test_zero_paper_run)


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Path], tuple]  # the case's directory -> (entry point, argv)


# ---- bad files, made in the case's directory ------------------------------------------------------

def fifo(root: Path, name: str = "pipe") -> Path:
    path = root / name
    os.mkfifo(path)
    return path


def regular(root: Path, name: str = "file.txt", content: bytes = b"x\n") -> Path:
    path = root / name
    path.write_bytes(content)
    return path


def directory(root: Path, name: str = "folder") -> Path:
    path = root / name
    path.mkdir()
    return path


def missing(root: Path, name: str = "no-such-file") -> Path:
    return root / name


def device(root: Path) -> Path:
    return Path("/dev/zero")


# Where a file is expected: (label, maker). Every one must be refused without being read.
NOT_A_FILE = [("missing", missing), ("FIFO", fifo), ("/dev/zero", device), ("a directory", directory)]
# Where a directory is expected.
NOT_A_DIRECTORY = [("missing", missing), ("FIFO", fifo), ("/dev/zero", device), ("a regular file", regular)]


def json_contents(rng: random.Random) -> list[tuple[str, bytes]]:
    deep = 100_000
    return [("empty", b""), ("blank", b" \n\t\n"), ("truncated", b'{"runs": ['), ("not JSON", b"runs: []"),
            ("not UTF-8", b'{"runs": "\xff\xfe"}'), ("UTF-16", '{"runs": []}'.encode("utf-16")),
            ("nested 10^5 deep", b"[" * deep + b"]" * deep), ("a list", b"[1, 2]"), ("a number", b"42"),
            ("NaN", b"NaN"), ("random bytes", rng.randbytes(200)), ("random bytes 2", rng.randbytes(17))]


# ---- the generator: one function per command ------------------------------------------------------

def typos(rng: random.Random, options: list[str], count: int) -> list[str]:
    """Near misses of real options that are none of them: a letter dropped, doubled, swapped or
    replaced, or a dash for an underscore."""
    known = set(options)
    found: list[str] = []
    while len(found) < count:
        option = rng.choice(options)
        body = list(option[2:])
        if len(body) < 3:
            continue
        i = rng.randrange(len(body) - 1)
        kind = rng.randrange(5)
        if kind == 0:
            del body[i]
        elif kind == 1:
            body.insert(i, body[i])
        elif kind == 2:
            body[i], body[i + 1] = body[i + 1], body[i]
        elif kind == 3:
            body[i] = rng.choice(string.ascii_lowercase)
        else:
            body = [c if c != "-" else "_" for c in body]
        typo = "--" + "".join(body)
        if typo not in known and typo not in found and typo != "--":
            found.append(typo)
    return found


def pretrain_options() -> list[str]:
    return sorted({option for action in pretrain_parser()._actions for option in action.option_strings
                   if option.startswith("--") and option != "--help"})


def plan_cases(rng: random.Random) -> list[Case]:
    def case(name, make_argv):
        return Case(f"zero.plan {name}", lambda root: (zero_plan.command, make_argv(root)))

    dry = ["dry-run", *SMALL]
    cases = [case("no command", lambda r: []), case("unknown command", lambda r: ["plan"]),
             case("a flag for a command", lambda r: ["--world-size", "4"]),
             case("max-size without --gpu-memory", lambda r: ["max-size", *SMALL])]
    for flag in ["--bogus", "--world-size=4", "--json", "-x", "extra"] + typos(rng, ["--world-size", "--rank"], 2):
        cases.append(case(f"tables {flag}", lambda r, f=flag: ["tables", f]))
    for typo in typos(rng, ["--world-size", "--gpus-per-node", "--gpu-memory", "--rank", "--target"]
                      + pretrain_options(), 14):
        cases.append(case(f"dry-run unknown {typo}", lambda r, t=typo: [*dry, t, "1"]))
    for flag, values in {"--world-size": ["0", "-1", "x", "1.5", "", "1e3"], "--gpus-per-node": ["0", "-8", "eight"],
                         "--rank": ["-1", "x", "8", "1000000"], "--target": ["gpu", "tpu", ""]}.items():
        for value in values:
            cases.append(case(f"dry-run {flag}={value!r}", lambda r, f=flag, v=value: [*dry, "--world-size", "8", f"{f}={v}"]))
    for value in ["", "abc", "-1GB", "0", "0GB", "1e999", "32 gigs", "nan", "inf", "1000000GB", "17TB", "1e30",
                  "32PB", "GB"]:
        cases.append(case(f"max-size --gpu-memory={value!r}", lambda r, v=value: ["max-size", f"--gpu-memory={v}", *SMALL]))
    for draw in range(6):  # grids where TP does not divide the world size (two draws may pick the same grid)
        tp = rng.choice([2, 4])
        world = rng.randrange(1, 200) * tp + rng.randrange(1, tp)
        command = rng.choice(["dry-run", "max-size"])
        cases.append(case(f"{command} world {world} TP {tp} (draw {draw})", lambda r, w=world, t=tp, c=command: [
            c, "--world-size", str(w), "--tensor-model-parallel-size", str(t), "--gpu-memory", "32GB", *SMALL]))
    for layers in [1025, 10**6, 10**9, rng.randrange(1025, 10**5)]:
        cases.append(case(f"dry-run {layers} layers", lambda r, n=layers: [
            "dry-run", "--num-layers", str(n), "--hidden-size", "64", "--num-attention-heads", "4"]))
    for flag, value in [("--num-layers", "x"), ("--hidden-size", "-1"), ("--num-attention-heads", "0"),
                        ("--lr", "nan"), ("--zero-stage", "9"), ("--micro-batch-size", "1.5")]:
        cases.append(case(f"dry-run {flag}={value}", lambda r, f=flag, v=value: [*dry, f"{f}={v}"]))
    for flag in ("--config", "--zero-config", "--tokenizer-file"):
        for label, make in NOT_A_FILE:
            cases.append(case(f"dry-run {flag} {label}", lambda r, f=flag, m=make: [*dry, f, m(r)]))
    for label, make in NOT_A_FILE:
        cases.append(case(f"dry-run --vocab-file {label}", lambda r, m=make: [
            *dry, "--vocab-file", m(r), "--merge-file", regular(r, "merges.txt")]))
    for label, content in json_contents(rng):
        def zero_config(root, c=content):
            return [*dry, "--zero-config", regular(root, "ds.json", c)]
        cases.append(case(f"dry-run --zero-config {label}", zero_config))
    for label, content in [("tabs", b"num_layers:\n\t- 1\n"), ("a list", b"[1, 2]"), ("unknown key", b"bogus: 1\n"),
                           ("not UTF-8", b"num_layers: \xff\n"), ("bad value", b"num_layers: many\n")]:
        cases.append(case(f"dry-run --config {label}", lambda r, c=content: [*dry, "--config", regular(r, "p.yaml", c)]))
    return cases


def run_cases(rng: random.Random) -> list[Case]:
    def case(name, make_argv):
        return Case(f"run.py {name}", lambda root: (zero_paper_run.command, make_argv(root)))

    def runs(root):
        return ["--runs-dir", root / "runs"]

    base = ["fig2", "--profile", "dgx2"]
    cases = []
    for typo in typos(rng, pretrain_options(), 30):  # the issue's `-- --num-layres 3`, generated
        value = rng.choice(["3", "0.1", "x", "--"])
        cases.append(case(f"passthrough {typo} {value}", lambda r, t=typo, v=value: [*base, *runs(r), "--", t, v]))
    cases.append(case("passthrough --num-layres 3", lambda r: [*base, *runs(r), "--", "--num-layres", "3"]))
    for flag, value in [("--seed", "seven"), ("--lr", "nan"), ("--lr", "inf"), ("--zero-stage", "7"),
                        ("--micro-batch-size", "0"), ("--train-iters", "-5"), ("--clip-grad", "-1"),
                        ("--device", "toaster"), ("--split", "a,b"), ("--fp16", "--bf16"),
                        ("--config", "no-such-preset"), ("--tensor-model-parallel-size", "3")]:
        cases.append(case(f"passthrough {flag} {value}", lambda r, f=flag, v=value: [*base, *runs(r), "--", f, v]))
    cases.append(case("passthrough --zero-config FIFO", lambda r: [*base, *runs(r), "--", "--zero-config", fifo(r)]))
    cases.append(case("passthrough --zero-config /dev/zero", lambda r: [*base, *runs(r), "--", "--zero-config", "/dev/zero"]))
    cases.append(case("--dry-run with flags after --", lambda r: [*base, "--dry-run", "--", "--seed", "7"]))
    for argv in (["fig5", "--profile", "dgx2"], ["fig2", "--profile", "tpu"], ["fig2"], [], ["--profile", "dgx2"],
                 [*base, "--points", "no-such-point"], [*base, "--largest-batch"], [*base, "--launcher", "mpirun"],
                 [*base, "--bogus"], [*base, "--submit", "--launcher", "torchrun"], [*base, "--points"],
                 [*base, "--overwrite=yes"]):
        cases.append(case(" ".join(argv) or "no arguments", lambda r, a=argv: [*a, *runs(r)]))
    for label, make in NOT_A_DIRECTORY:
        cases.append(case(f"--definitions {label}", lambda r, m=make: [*base, *runs(r), "--definitions", m(r)]))
    for label, make in [("a regular file", regular), ("/dev/zero", device), ("FIFO", fifo)]:
        cases.append(case(f"--runs-dir {label}", lambda r, m=make: [*base, "--runs-dir", m(r)]))
    cases.append(case("--runs-dir under a regular file", lambda r: [*base, "--runs-dir", regular(r) / "runs"]))

    def definitions_holding(make_fig2):
        def make(root):
            folder = directory(root, "definitions")
            make_fig2(folder)
            return [*base, *runs(root), "--definitions", folder]
        return make

    rows = {"empty": "", "comments only": "# nothing\n", "wrong header": "a b c\n" + GOOD_ROW,
            "short row": HEADER + "\ndgx2 p zero 1 16\n", "text count": HEADER + "\n" + GOOD_ROW.replace(" 48 ", " x "),
            "nan count": HEADER + "\n" + GOOD_ROW.replace(" 48 ", " nan "),
            "inf count": HEADER + "\n" + GOOD_ROW.replace(" 5e8 ", " 1e999 "),
            "fractional count": HEADER + "\n" + GOOD_ROW.replace(" 16 16 ", " 16 1.5 "),
            "zero MP": HEADER + "\n" + GOOD_ROW.replace("1 16 16 48", "1 16 0 48"),
            "zero micro batch": HEADER + "\n" + GOOD_ROW.replace("16 4 4 2", "16 0 4 2"),
            "negative nodes": HEADER + "\n" + GOOD_ROW.replace("zero 1 16", "zero -1 16"),
            "stage 5": HEADER + "\n" + GOOD_ROW.replace("4 4 2 1 0 1", "4 4 5 1 0 1"),
            "unknown profile": HEADER + "\n" + GOOD_ROW.replace("dgx2", "tpu"),
            "no preset of the shape": HEADER + "\n" + GOOD_ROW.replace(" 48 1600 ", " 47 1600 "),
            "repeated point": HEADER + "\n" + GOOD_ROW + "\n" + GOOD_ROW}
    for label, text in rows.items():
        cases.append(case(f"fig2.dat {label}", definitions_holding(lambda f, t=text: (f / "fig2.dat").write_text(t))))
    cases.append(case("fig2.dat not UTF-8", definitions_holding(lambda f: (f / "fig2.dat").write_bytes(b"\xff\xfe" * 9))))
    cases.append(case("fig2.dat a FIFO", definitions_holding(lambda f: fifo(f, "fig2.dat"))))
    cases.append(case("fig2.dat a directory", definitions_holding(lambda f: directory(f, "fig2.dat"))))
    cases.append(case("fig2.dat a link to /dev/zero", definitions_holding(lambda f: (f / "fig2.dat").symlink_to("/dev/zero"))))
    return cases


def report_cases(rng: random.Random) -> list[Case]:
    def case(name, make_argv):
        return Case(f"report.py {name}", lambda root: (zero_paper_report.command, make_argv(root)))

    def out(root):
        return ["--output-dir", root / "report", "--quiet"]

    cases = [case("no arguments", lambda r: []), case("--bogus", lambda r: [*out(r), "--bogus"]),
             case("--figures fig5", lambda r: [*out(r), "--figures", "fig5"]),
             case("--profiles tpu", lambda r: [*out(r), "--profiles", "tpu"]),
             case("--runs with nothing", lambda r: [*out(r), "--runs"]),
             case("--no-cache=1", lambda r: [*out(r), "--no-cache=1"])]
    for typo in typos(rng, ["--output-dir", "--runs", "--figures", "--profiles", "--definitions",
                            "--mini-reproduction", "--no-cache", "--overwrite", "--quiet"], 8):
        cases.append(case(f"unknown {typo}", lambda r, t=typo: [*out(r), t]))
    for label, make in NOT_A_DIRECTORY:
        cases.append(case(f"--runs {label}", lambda r, m=make: [*out(r), "--runs", m(r)]))
        cases.append(case(f"--definitions {label}", lambda r, m=make: [*out(r), "--definitions", m(r)]))
    cases.append(case("a second --runs missing", lambda r: [*out(r), "--runs", directory(r, "runs"), r / "typo"]))
    for label, make in NOT_A_FILE:
        cases.append(case(f"--mini-reproduction {label}", lambda r, m=make: [*out(r), "--mini-reproduction", m(r)]))
    shapes = [("no runs key", b'{"command": "x"}'), ("runs not a list", b'{"runs": 5}'),
              ("a run without layers", b'{"runs": [{"configuration": "C1"}]}'),
              ("one depth", b'{"runs": [{"configuration": "C1", "layers": 4, "measured": [], "planned": []}]}'),
              ("no runs at all", b'{"runs": []}')]
    for label, content in json_contents(rng) + shapes:
        cases.append(case(f"--mini-reproduction {label}", lambda r, c=content: [
            *out(r), "--mini-reproduction", regular(r, "mini.json", c)]))
    cases.append(case("--output-dir a regular file", lambda r: ["--output-dir", regular(r), "--quiet"]))
    cases.append(case("--output-dir under a regular file", lambda r: ["--output-dir", regular(r) / "report"]))
    cases.append(case("--output-dir /dev/zero", lambda r: ["--output-dir", "/dev/zero"]))

    def earlier_report(root):
        folder = directory(root, "report")
        (folder / "report.md").write_text("an earlier report\n")
        return ["--output-dir", folder, "--quiet"]
    cases.append(case("an earlier report without --overwrite", earlier_report))

    def runs_with_fifo_metrics(root):
        point = root / "runs" / "dgx2" / "fig2" / "p"
        point.mkdir(parents=True)
        (point / "launch.json").write_text('{"figure": "fig2", "profile": "dgx2", "point": "p"}')
        fifo(point, "metrics.jsonl")
        return [*out(root), "--runs", root / "runs"]
    cases.append(case("a run's metrics.jsonl a FIFO", runs_with_fifo_metrics))
    return cases


def checkpoint_tool_cases(rng: random.Random) -> list[Case]:
    tools = {"convert_to_hf": (convert_to_hf.main, []), "zero_to_fp32": (zero_to_fp32.main, []),
             "reshard": (reshard_checkpoint.main, ["--tensor-model-parallel-size", "2"])}
    cases = []

    def add(tool, name, make_argv):
        main, extra = tools[tool]
        cases.append(Case(f"{tool} {name}", lambda root: (main, [*make_argv(root), *extra])))

    def with_latest(make_latest):
        def make(root):
            ck = directory(root, "ck")
            make_latest(ck)
            return ck
        return make

    bad_checkpoints = NOT_A_DIRECTORY + [
        ("an empty directory", directory),
        ("latest a FIFO", with_latest(lambda ck: fifo(ck, "latest"))),
        ("latest names nothing", with_latest(lambda ck: (ck / "latest").write_text("iter_0000009\n"))),
        ("latest names outside", with_latest(lambda ck: (ck / "latest").write_text("../../etc\n"))),
        ("metadata.json a FIFO", with_latest(lambda ck: fifo(ck, "metadata.json"))),
        ("metadata.json a directory", with_latest(lambda ck: directory(ck, "metadata.json"))),
        ("an unfinished save", lambda root: directory(root, "iter_0000002.partial")),
    ]
    for tool in tools:
        for label, make in bad_checkpoints:
            add(tool, f"CKPT {label}", lambda r, m=make: [m(r), r / "out"])
        add(tool, "no arguments", lambda r: [])
        for flag in ["--bogus", "--overwrite=1", "-q"] + typos(rng, ["--overwrite", "--verify-checkpoint"], 2):
            add(tool, f"unknown {flag}", lambda r, f=flag: [directory(r, "ck"), r / "out", f])
    for value in ["fp8", "", "float32"]:
        add("convert_to_hf", f"--dtype {value!r}", lambda r, v=value: [directory(r, "ck"), r / "hf", f"--dtype={v}"])
    for value in ["0", "-1", "x", "1.5", ""]:
        cases.append(Case(f"reshard --tensor-model-parallel-size {value!r}", lambda root, v=value: (
            reshard_checkpoint.main, [directory(root, "ck"), root / "out", f"--tensor-model-parallel-size={v}"])))
    cases.append(Case("reshard without --tensor-model-parallel-size", lambda root: (
        reshard_checkpoint.main, [directory(root, "ck"), root / "out"])))
    return cases


def preprocess_cases(rng: random.Random) -> list[Case]:
    def case(name, make_argv):
        return Case(f"preprocess {name}", lambda root: (preprocess.main, make_argv(root)))

    def corpus(root):
        return regular(root, "corpus.jsonl", b'{"text": "hello world"}\n{"text": "again"}\n')

    def out(root):
        return ["--output-prefix", root / "out" / "data"]

    train = ["--train-tokenizer-vocab-size", "300"]
    cases = [case("no arguments", lambda r: []), case("no --input", lambda r: [*out(r), *train]),
             case("no --output-prefix", lambda r: ["--input", corpus(r), *train]),
             case("no tokenizer", lambda r: ["--input", corpus(r), *out(r)]),
             case("two tokenizers", lambda r: ["--input", corpus(r), *out(r), *train, "--tokenizer-file", corpus(r)]),
             case("--vocab-file alone", lambda r: ["--input", corpus(r), *out(r), "--vocab-file", regular(r, "v.json")]),
             case("--json-keys repeated", lambda r: ["--input", corpus(r), *out(r), *train, "--json-keys", "text", "text"]),
             case("--input-format bogus", lambda r: ["--input", corpus(r), *out(r), *train, "--input-format", "csv"]),
             case("hf format on a file", lambda r: ["--input", corpus(r), *out(r), *train, "--input-format", "hf"]),
             case("unknown extension", lambda r: ["--input", regular(r, "corpus.csv"), *out(r), *train]),
             case("an empty directory", lambda r: ["--input", directory(r), *out(r), *train]),
             case("a FIFO inside a directory", lambda r: ["--input", fifo(directory(r), "shard.jsonl").parent, *out(r),
                                                         *train]),
             case("--output-prefix under a file", lambda r: ["--input", corpus(r), "--output-prefix", regular(r) / "o",
                                                            *train])]
    for typo in typos(rng, [a for action in preprocess.build_parser()._actions for a in action.option_strings
                            if a.startswith("--") and a != "--help"], 8):
        cases.append(case(f"unknown {typo}", lambda r, t=typo: ["--input", corpus(r), *out(r), *train, t]))
    for flag, values in {"--workers": ["0", "-3", "x", "1.5"], "--log-interval": ["0", "-1", "many"],
                         "--train-tokenizer-vocab-size": ["0", "-5", "x", "1e3"]}.items():
        for value in values:
            args = [a for a in train if flag != "--train-tokenizer-vocab-size"]
            cases.append(case(f"{flag}={value!r}", lambda r, f=flag, v=value, a=args: [
                "--input", corpus(r), *out(r), *a, f"{f}={v}"]))
    for label, make in NOT_A_FILE[:3]:  # a directory is an input too (of files)
        for input_format in ("auto", "text", "jsonl"):
            cases.append(case(f"--input {label} as {input_format}", lambda r, m=make, f=input_format: [
                "--input", m(r), "--input-format", f, *out(r), *train]))
    for flag in ("--tokenizer-file",):
        for label, make in NOT_A_FILE:
            cases.append(case(f"{flag} {label}", lambda r, f=flag, m=make: ["--input", corpus(r), *out(r), f, m(r)]))
    for label, make in NOT_A_FILE:
        cases.append(case(f"--vocab-file {label}", lambda r, m=make: [
            "--input", corpus(r), *out(r), "--vocab-file", m(r), "--merge-file", regular(r, "merges.txt")]))
        cases.append(case(f"--merge-file {label}", lambda r, m=make: [
            "--input", corpus(r), *out(r), "--vocab-file", regular(r, "vocab.json", b'{"<|endoftext|>": 0}'),
            "--merge-file", m(r)]))
    for label, content in json_contents(rng)[:6]:
        cases.append(case(f"--tokenizer-file {label}", lambda r, c=content: [
            "--input", corpus(r), *out(r), "--tokenizer-file", regular(r, "tokenizer.json", c)]))
    return cases


def all_cases() -> list[Case]:
    rng = random.Random(SEED)
    return (plan_cases(rng) + run_cases(rng) + report_cases(rng) + checkpoint_tool_cases(rng)
            + preprocess_cases(rng))


CASES = all_cases()


# ---- the checks -----------------------------------------------------------------------------------

def tree(root: Path) -> dict[str, tuple]:
    """Relative path -> (type, size, mtime) of everything under `root`, from lstat alone: nothing is
    opened, so a FIFO in the tree is harmless."""
    if not root.exists():
        return {}
    found = {}
    for folder, subdirectories, files in os.walk(root):
        for name in subdirectories + files:
            info = os.lstat(os.path.join(folder, name))
            found[os.path.relpath(os.path.join(folder, name), root)] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


class Tripwire(AssertionError):
    pass


@pytest.fixture
def no_planning(monkeypatch, tmp_path_factory):
    """An input that is wrongly accepted fails at once rather than planning (minutes) or launching."""
    def planned(*args, **kwargs):
        raise Tripwire("an invalid input reached the planner")
    monkeypatch.setattr(zero_plan, "dry_run", planned)
    monkeypatch.setattr(zero_plan, "largest_layers", planned)
    monkeypatch.setattr(zero_paper_report, "Planner", planned)
    monkeypatch.setattr(zero_paper_run, "dry_run_points", planned)
    monkeypatch.setenv("ZERO_GPT_PLAN_CACHE", str(tmp_path_factory.getbasetemp() / "plan-cache"))
    for variable in ("DATA_PATH", "VOCAB_FILE", "MERGE_FILE", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(variable, raising=False)


def test_there_are_enough_cases_and_every_command_has_some():
    assert len(CASES) >= MINIMUM_CASES, len(CASES)
    assert len({case.name for case in CASES}) == len(CASES)
    for prefix in ("zero.plan", "run.py", "report.py", "convert_to_hf", "zero_to_fp32", "reshard", "preprocess"):
        assert sum(case.name.startswith(prefix) for case in CASES) >= 10, prefix


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_bad_input_is_one_line_exit_2_and_creates_nothing(case, tmp_path, no_planning):
    root = tmp_path / "case"
    root.mkdir()
    main, argv = case.make(root)
    watched = [root, Path(os.environ["ZERO_GPT_PLAN_CACHE"]), REPO / "runs"]
    before = {path: tree(path) for path in watched}
    outcome = run_main(main, argv)
    assert outcome.code == 2, (case.name, outcome.code, outcome.err[-2000:], outcome.out[-500:])
    assert "Traceback" not in outcome.err, (case.name, outcome.err)
    assert len(outcome.err_lines) == 1 and ": error: " in outcome.err, (case.name, outcome.err)
    for path in watched:
        assert tree(path) == before[path], (case.name, path)
