"""Issue 50, item 4: a README a newcomer finishes. At most 1,200 words (`wc -w`), what it is in three
lines, a feature table whose every row names flags, a doc page and a test that exist (and that name
each other: the page and the test both mention the row's flags), and five files to read in order.

Before, the README was 2,291 words with neither a feature table nor a reading list; the launcher's exit
codes, signals and SLURM variables were in its main text (now docs/launching.md)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from tests.readme import README, ROOT, readme_section

MAX_WORDS = 1200
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def word_count(text: str) -> int:
    """What `wc -w` counts: runs of non-whitespace."""
    return len(text.split())


@functools.lru_cache(maxsize=None)
def pretrain_help() -> str:
    from arguments.parser import build_parser

    return build_parser().format_help()


def feature_rows(section: str) -> list[list[str]]:
    """The cells of every body row of the section's table (header and separator dropped)."""
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) >= 2, "no table"
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in rows]
    assert [cell.lower() for cell in cells[0]] == ["feature", "flags", "doc", "test"], cells[0]
    return [row for row in cells[1:] if not set("".join(row)) <= set("-: ")]


def _linked(cell: str) -> Path | None:
    links = LINK.findall(cell)
    return ROOT / links[0][1].partition("#")[0] if len(links) == 1 else None


def _names(text: str, flag: str) -> bool:
    """`text` names `flag` as typed (`--offload-param`) or as its setting (`offload_param`)."""
    setting = flag.lstrip("-").replace("-", "_")
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None or \
        re.search(rf"(?<!\w){re.escape(setting)}(?!\w)", text) is not None


def row_problems(row: list[str]) -> list[str]:
    """Why a feature row does not hold: a flag pretrain_gpt.py --help does not list, a doc page or test
    file that does not exist, or one that does not mention the row's flags."""
    if len(row) != 4:
        return [f"{row}: {len(row)} cells, not 4"]
    feature, flag_cell, doc_cell, test_cell = row
    flags = re.findall(r"`(--[\w-]+)`", flag_cell)
    problems = [] if flags else [f"{feature}: no flag"]
    for flag in flags:
        if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", pretrain_help()):
            problems.append(f"{feature}: {flag} is not a flag of pretrain_gpt.py (not in its --help)")
    doc, test = _linked(doc_cell), _linked(test_cell)
    if doc is None or doc.parent != ROOT / "docs" or doc.suffix != ".md" or not doc.is_file():
        problems.append(f"{feature}: {doc_cell} is not one link to a docs/*.md page")
    else:
        problems += [f"{feature}: {doc.name} does not mention {flag}" for flag in flags if flag not in doc.read_text()]
    if test is None or ROOT / "tests" not in test.parents or not test.name.startswith("test_") or not test.is_file():
        problems.append(f"{feature}: {test_cell} is not one link to a tests/**/test_*.py file")
    else:
        text = test.read_text()
        if not re.search(r"^def test_", text, flags=re.M):
            problems.append(f"{feature}: {test.name} has no test")
        problems += [f"{feature}: {test.name} does not mention {flag}" for flag in flags if not _names(text, flag)]
    return problems


def test_the_readme_is_at_most_1200_words():
    assert word_count(README.read_text()) <= MAX_WORDS


def test_the_readme_says_what_it_is_in_three_lines():
    text = README.read_text()
    intro = text[:text.index("\n## ")].split("\n", 1)[1]  # below the title, above the first section
    assert len([line for line in intro.splitlines() if line.strip()]) == 3, intro


def test_every_feature_row_names_a_flag_a_doc_page_and_a_test_that_exist():
    rows = feature_rows(readme_section("Features"))
    assert len(rows) >= 12, rows
    assert [problem for row in rows for problem in row_problems(row)] == []


def test_a_feature_row_that_does_not_hold_is_caught():
    """The check itself: a flag that is not there, a page that does not say it, a test that does not exist."""
    good = ["ZeRO", "`--zero-stage`", "[zero](docs/zero.md)", "[t](tests/zero/test_zero_training.py)"]
    assert row_problems(good) == []
    assert row_problems(["x", "`--no-such-flag`", good[2], good[3]]) == [
        "x: --no-such-flag is not a flag of pretrain_gpt.py (not in its --help)",
        "x: zero.md does not mention --no-such-flag", "x: test_zero_training.py does not mention --no-such-flag"]
    assert row_problems(["x", "`--tensorboard-dir`", good[2], good[3]]) == [
        "x: zero.md does not mention --tensorboard-dir", "x: test_zero_training.py does not mention --tensorboard-dir"]
    assert row_problems(["x", good[1], "[z](docs/nowhere.md)", "[t](tests/test_nothing.py)"]) == [
        "x: [z](docs/nowhere.md) is not one link to a docs/*.md page",
        "x: [t](tests/test_nothing.py) is not one link to a tests/**/test_*.py file"]


def test_where_to_read_the_code_lists_five_files_in_reading_order():
    section = readme_section("Where to read the code")
    items = re.findall(r"^(\d+)\. (.*)$", section, flags=re.M)
    assert [number for number, _ in items] == ["1", "2", "3", "4", "5"], section
    for _, item in items:
        link = LINK.match(item)
        assert link and link.group(1) == link.group(2) and (ROOT / link.group(2)).is_file(), item
    assert items[0][1].startswith("[pretrain_gpt.py]")  # the entry point first
