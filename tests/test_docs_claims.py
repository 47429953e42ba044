"""The pages' claims about flags and DeepSpeed JSON keys hold in the code (README.md and docs/*.md).
tests/test_docs_commands.py runs the pages' commands; this test reads what the pages *say*:
- a flag or JSON key a page calls refused, unsupported or not implemented must be refused by
  `arguments.parser.parse_arguments` (with the entry point's late checks): a ConfigError naming it;
- a flag a page says works must parse and reach a setting whose source is that flag as typed (an alias shows as
  "--norm-epsilon (Megatron-LM's name for --layernorm-epsilon)");
- a flag a page says is accepted with no effect must parse and be named in the one line said at the start.

How claims are found (`page_claims`):
- tables: a row whose first cell holds backticked flags (or, under a "DeepSpeed JSON" header, keys) and whose
  verdict cell (the last) starts with "refused" or "unsupported" is a refusal of each; "1: accepted. More: refused"
  is both; "accepted", "no effect" or "nothing to do" says accepted with no effect; any other verdict of a flag
  table ("Megatron-LM" or "DeepSpeed-Megatron" | "here") says the flag works;
- sentences: backticked flags in parentheses right after "refused", "not implemented", "unsupported" or "not
  supported", and backticked flags right before "is refused" / "are refused" (also "are being implemented; until
  then they are refused").

A placeholder (N, F, DIR, FILE, ...) stands for a value: VALUES gives one this code accepts for the flag, so a
refusal is the flag's own and not a bad value's."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from arguments.config import ConfigError
from arguments.parser import parse_arguments

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

REFUSAL_WORDS = r"(?:refused|not implemented|unsupported|not supported)"
BACKTICKED = re.compile(r"`([^`]+)`")
FLAG_TABLE_HEADERS = {"Megatron-LM", "DeepSpeed-Megatron"}
JSON_VALUES = {"communication_data_type": "fp16"}  # a key the page calls refused when set: set to this
JSON_TABLE_HEADER = "DeepSpeed JSON"
NO_EFFECT = re.compile(r"^(accepted\b|nothing to do|no effect)", re.IGNORECASE)
REFUSED = re.compile(r"^(refused|unsupported)\b", re.IGNORECASE)
ONE_VALUE_ACCEPTED = re.compile(r"^(\w+): accepted\. More: refused")
# Prose: flags in parentheses right after a refusal word, and flags right before "is/are refused".
REFUSED_IN_PARENTHESES = re.compile(REFUSAL_WORDS + r"\s*\(([^()]*)\)")
FLAG_LIST = r"(?:`--[^`]+`(?:,\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+))*`--[^`]+`"
REFUSED_AFTER_LIST = re.compile(r"(" + FLAG_LIST + r")\s+(?:is|are)\s+(?:being implemented; until then they are\s+)?"
                                r"refused")


@dataclass(frozen=True)
class Claim:
    page: str
    line: int
    verdict: str  # "refused", "works", "no effect"
    item: str     # as the page writes it: "--num-experts 8", "--rampup-batch-size START INCREMENT SAMPLES"
    json: bool = False
    row: tuple[str, ...] = ()  # the other flags of its table row: one thing under several names

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.item!r} ({self.verdict})"


# ---- finding the claims ----------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _flags_in(cell: str) -> list[str]:
    return [item for item in BACKTICKED.findall(cell) if item.startswith("--")]


def table_claims(page: str, lines: list[str]) -> list[Claim]:
    claims, header = [], None
    for number, line in enumerate(lines, 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            continue
        if set(line) <= set("|-: "):
            continue
        verdict_cell, first = cells[-1], cells[0]
        if header[0] == JSON_TABLE_HEADER:
            if REFUSED.match(verdict_cell):
                claims += [Claim(page, number, "refused", key, json=True) for key in _json_keys(first)]
            continue
        flags = [flag for cell in cells[:-1] for flag in _flags_in(cell)]
        if not flags:
            continue
        value = ONE_VALUE_ACCEPTED.match(verdict_cell)
        if value:
            for flag in flags:
                claims.append(Claim(page, number, "works", _with_value(flag, value.group(1))))
                claims.append(Claim(page, number, "refused", _with_value(flag, str(int(value.group(1)) + 1))))
        elif REFUSED.match(verdict_cell):
            names = tuple(flag.split()[0] for flag in flags)
            claims += [Claim(page, number, "refused", flag, row=names) for flag in flags]
        elif NO_EFFECT.match(verdict_cell):
            claims += [Claim(page, number, "no effect", flag) for flag in flags]
        elif header[0] in FLAG_TABLE_HEADERS and header[-1] == "here":
            claims += [Claim(page, number, "works", flag) for flag in _flags_in(first)]
    return claims


def _json_keys(cell: str) -> list[str]:
    """A JSON cell's keys as `key: value` texts: `scheduler` `OneCycle`, `LRRangeTest` is one key per
    type; `zero_optimization.{a > 1, b}` one per member (`> 1`: the next value; a bare member: true)."""
    keys, parent = [], None
    for item in BACKTICKED.findall(cell):
        braces = re.fullmatch(r"([\w.]+)\.\{(.*)\}", item)
        if braces:
            for member in braces.group(2).split(","):
                name, _, bound = member.strip().partition(" > ")
                keys.append(f"{braces.group(1)}.{name}: {int(bound) + 1 if bound else 'true'}")
        elif item[:1].isupper() and parent is not None:  # a type of the key before it
            if keys and keys[-1] == parent:
                keys.pop()
            keys.append(f'{parent}.type: "{item}"')
        else:
            keys.append(item)
            parent = item
    return keys


def _with_value(flag: str, value: str) -> str:
    name, *placeholder = flag.split()
    return f"{name} {value}" if placeholder else flag


def sentence_claims(page: str, lines: list[str]) -> list[Claim]:
    """Refusals in prose (table rows are table_claims'): paragraphs joined, so a claim may span lines."""
    claims = []
    paragraph: list[tuple[int, str]] = []
    for number, line in enumerate([*lines, ""], 1):
        if line.strip() and not line.startswith(("|", "```", "    ")):
            paragraph.append((number, line))
            continue
        text = " ".join(part for _, part in paragraph)
        starts = [0]
        for _, part in paragraph:
            starts.append(starts[-1] + len(part) + 1)
        for pattern in (REFUSED_IN_PARENTHESES, REFUSED_AFTER_LIST):
            for match in pattern.finditer(text):
                at = next(paragraph[i][0] for i in range(len(paragraph)) if starts[i + 1] > match.start(1))
                claims += [Claim(page, at, "refused", flag) for flag in _flags_in(match.group(1))]
        paragraph = []
    return claims


def page_claims(page: str, text: str) -> list[Claim]:
    lines = text.splitlines()
    return table_claims(page, lines) + sentence_claims(page, lines)


def all_claims() -> list[Claim]:
    return [claim for page in PAGES for claim in page_claims(str(page.relative_to(ROOT)), page.read_text())]


# ---- checking one claim ------------------------------------------------------------------------------

# A value for each placeholder a page writes, for a flag the page names bare, and what else a flag
# needs beside it to parse (the prerequisite its own row or message names).
PLACEHOLDERS = {"N": "2", "F": "0.1", "DIR": "{tmp}/dir", "FILE": "{tmp}/kill-switch",
                "START": "8", "INCREMENT": "8", "SAMPLES": "64", '"THRESHOLD:BATCH': "0:16 1M:32", '..."': ""}
FLAG_VALUES = {"--lr-warmup-init": "0.0001", "--data-impl": "mmap"}
CHECKPOINTING = ["--checkpoint-activations"]
CONTEXT = {
    "--lr-warmup-samples": ["--train-samples", "640"], "--lr-decay-samples": ["--train-samples", "640"],
    "--lr-warmup-tokens": ["--train-tokens", "65536"], "--lr-decay-tokens": ["--train-tokens", "65536"],
    "--tokenizer-type GPT2BPETokenizer": ["--vocab-file", "{tmp}/vocab.json", "--merge-file", "{tmp}/merges.txt"],
    "--tokenizer-type HuggingFaceTokenizer --tokenizer-model M": [],
    "--tokenizer-type NullTokenizer --vocab-size N": ["--data-path", "{tmp}/corpus_text_document"],
    "--distribute-saved-activations": CHECKPOINTING, "--distribute-checkpointed-activations": CHECKPOINTING,
    "--checkpoint-in-cpu": CHECKPOINTING, "--contigious-checkpointing": CHECKPOINTING,
    "--synchronize-each-layer": CHECKPOINTING,
    "--train-data": ["--tokenizer-type", "NullTokenizer", "--vocab-size", "128"],
    "--train-data-path": ["--tokenizer-type", "NullTokenizer", "--vocab-size", "128"],
    "--overlap-param-gather": ["--zero-stage", "1"], "--cpu-optimizer": ["--zero-stage", "1"],
    "--exit-signal-handler": ["--save", "{tmp}/save"],
    "--hierarchical-context-parallel-sizes": ["--context-parallel-size", "4"],  # the sizes multiply to it
}


def claim_argv(claim: Claim, tmp: Path) -> list[str]:
    if claim.json:
        key, _, value = claim.item.partition(":")
        document: dict = {}
        *parents, leaf = key.strip().split(".")
        node = document
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = json.loads(value) if value.strip() else JSON_VALUES.get(key.strip(), {})
        path = tmp / "ds.json"
        path.write_text(json.dumps(document))
        return ["--zero-config", str(path)]
    text = re.sub(r"\{([^},]+),[^}]*\}", r"\1", claim.item).replace("\\|", "|")  # {e4m3,hybrid} -> e4m3
    text = re.sub(r"(\w+)\|\S+", r"\1", text)                                     # e4m3|hybrid -> e4m3
    argv = [PLACEHOLDERS.get(word, word).format(tmp=tmp) for word in text.split()]
    argv = [word for word in argv if word]
    if len(argv) == 1 and argv[0] in FLAG_VALUES:
        argv.append(FLAG_VALUES[argv[0]])
    if claim.item == "--tokenizer-type HuggingFaceTokenizer --tokenizer-model M":
        argv[-1] = _tokenizer_json(tmp)
    if "GPT2BPETokenizer" in argv:
        (tmp / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
        (tmp / "merges.txt").write_text("#version: 0.2\na b\n")
    context = CONTEXT.get(claim.item, CONTEXT.get(argv[0], []))
    return [word.format(tmp=tmp) for word in context] + argv


def _tokenizer_json(tmp: Path) -> str:
    from tokenizers import Tokenizer, models

    path = tmp / "tokenizer.json"
    Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "ab": 2}, merges=[("a", "b")])).save(str(path))
    return str(path)


def _sample_value(flag: str, tmp: Path) -> str:
    """A value for a flag the page names without one: a path under tmp for a path, else a small number."""
    if "config" in flag:
        return "stage1"  # an example JSON of configs/zero
    return str(tmp / flag.strip("-")) if re.search(r"path|dir|file|data", flag) else "2"


def _parse(argv: list[str], tmp: Path, late_checks: bool = True):
    """parse_arguments with the entry point's late checks; a flag named without the value it needs
    gets a sample one (the first choice, where it has choices), so that a refusal is the flag's own
    and not argparse's complaint about a missing value."""
    from pretrain_gpt import LATE_CHECKS  # the entry point's checks of what the flags name

    argv = list(argv)
    for _ in range(2 * len(argv) + 2):
        try:
            return parse_arguments(argv, late_checks=LATE_CHECKS if late_checks else ())
        except ConfigError as error:
            message = str(error)
            missing = re.search(r"argument ([^:]+): expected (?:one|at least one) argument", message)
            choice = re.search(r"argument ([^:]+): invalid choice: '([^']*)' \(choose from '([^']+)'", message)
            if missing:
                options = missing.group(1).split("/")
                at = next(i for i, word in enumerate(argv) if word in options)
                argv.insert(at + 1, _sample_value(argv[at], tmp))
            elif choice and choice.group(2) in argv and choice.group(2) not in claim_words(argv):
                argv[argv.index(choice.group(2))] = choice.group(3)
            else:
                raise
    raise AssertionError(f"no values satisfy {argv}")


def claim_words(argv: list[str]) -> set[str]:
    """The words a page wrote (a sample value is never one of them: they are paths or "2")."""
    return {word for word in argv if not word.startswith("/") and word not in ("2", "stage1")}


def check_claim(claim: Claim, tmp: Path) -> Optional[str]:
    """None when the code does what the page says, else why not."""
    argv = claim_argv(claim, tmp)
    name = claim.item.partition(":")[0].strip() if claim.json else claim.item.split()[0]
    try:
        parsed = _parse(argv, tmp)
    except ConfigError as error:
        message = str(error)
        if claim.verdict != "refused":
            return f"{claim}: {' '.join(argv)} is refused: {message}"
        names = {name, *claim.row}  # --fp8-e4m3 may be refused as the --fp8-format e4m3 it is
        if not any(named in message for named in names) or re.search(r"argument \S+: (expected|invalid)", message):
            return f"{claim}: {' '.join(argv)} is refused, but not for itself: {message}"
        return None
    if claim.verdict == "refused":
        return f"{claim}: {' '.join(argv)} parses; the page says it is refused"
    if claim.verdict == "no effect":
        said = " ".join(parsed.notes)
        if not any(name.startswith(word) for word in re.findall(r"--[\w-]+", said)):
            return f"{claim}: parses, but the start lines do not name it: {said!r}"
        return None
    origins = [source.origin for source in parsed.config.sources.values() if source.kind == "flag"]
    if not any(origin == name or origin.startswith(name + " ") for origin in origins):
        return f"{claim}: parses, but no setting comes from it (flag sources: {sorted(set(origins))})"
    return None


# ---- the tests ---------------------------------------------------------------------------------------

CLAIMS = all_claims()


def test_claims_are_found_in_every_kind_of_place():
    verdicts = {(claim.page, claim.verdict, claim.json) for claim in CLAIMS}
    page = "docs/coming-from-megatron-deepspeed.md"
    assert {(page, "refused", False), (page, "works", False), (page, "no effect", False),
            (page, "refused", True)} <= verdicts
    items = {claim.item for claim in CLAIMS if claim.verdict == "refused"}
    assert {"--apply-residual-connection-post-layernorm", "--dataloader-inter-document-masking", "--lr nan", "sparse_attention"} <= items


@pytest.mark.parametrize("claim", CLAIMS, ids=str)
def test_the_code_does_what_the_page_says(claim: Claim, tmp_path):
    problem = check_claim(claim, tmp_path)
    assert problem is None, problem


def test_a_refusal_sentence_naming_a_working_flag_is_caught(tmp_path):
    """The check itself: the stale sentence issue 35 found ("--kill-switch-path ... are being
    implemented; until then they are refused"), and a refusal list with a working flag put in."""
    stale = ("The scheduler overrides, `--kill-switch-path FILE` and `--pad-vocab-size-to 50304` are being\n"
             "implemented; until then they are refused naming the flag to use.\n")
    edited = "when its feature is not implemented (`--swiglu`, rotary positions, `--openai-gelu`, fp4).\n"
    for text, working in ((stale, "--kill-switch-path FILE"), (edited, "--openai-gelu")):
        claims = page_claims("page.md", text)
        assert working in {claim.item for claim in claims}, claims
        problems = [check_claim(claim, tmp_path) for claim in claims if claim.item == working]
        assert problems and all("parses; the page says it is refused" in problem for problem in problems)
