"""The README, read by the tests that keep it true (its commands run, its tables complete)."""

from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_section(title: str) -> str:
    """The text under `## title`, up to the next `## ` heading."""
    return README.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
