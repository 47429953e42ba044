"""The README and the docs/ pages, read by the tests that keep them true (their commands run, their
tables complete)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def doc_pages() -> list[Path]:
    """README.md and every docs/*.md page."""
    return [README] + sorted(DOCS.glob("*.md"))


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line index, level, title) of every Markdown heading outside fenced code blocks (a `# comment`
    inside a bash block is not a heading)."""
    found, fence = [], False
    for index, line in enumerate(text.split("\n")):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            match = re.match(r"(#{1,6}) (.+?)\s*$", line)
            if match:
                found.append((index, len(match.group(1)), match.group(2)))
    return found


def doc_section(path, title: str) -> str:
    """The text under the heading `title` of the page `path` (README.md or docs/x.md, absolute or
    relative to the repository root), up to the next heading of the same or a higher level: under a
    `## title`, the next `## ` or `# `; under a page's `# title`, the whole page."""
    path = Path(path)
    text = (path if path.is_absolute() else ROOT / path).read_text()
    lines = text.split("\n")
    found = headings(text)
    matches = [(index, level) for index, level, name in found if name == title]
    assert len(matches) == 1, f"{path}: {len(matches)} headings named {title!r}"
    start, level = matches[0]
    end = next((index for index, other, _ in found if index > start and other <= level), len(lines))
    return "\n".join(lines[start + 1:end])


def readme_section(title: str) -> str:
    """The text under the README's `## title`, up to the next `## ` heading."""
    return doc_section(README, title)
