"""Renders every setting's flag, by the settings section that declares it, into docs/configuration.md's flag
table; `--write` rewrites it, tests/test_flag_table.py checks it. The flags' meanings are `--help`'s."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from arguments.config import PretrainConfig
from base.options import SECTION, flag_of, option_fields
from scripts.tools import generated_table

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"
START, END = "<!-- flags:start -->", "<!-- flags:end -->"
FLAGS_A_ROW = 16  # a long section continues on the rows below, so no cell is a wall


def _section_paths(kind: type, path: str) -> list[str]:
    """The dotted section path of each setting of `kind`, in option_fields' order (a section's settings in its place)."""
    paths = []
    for field in dataclasses.fields(kind):
        if field.metadata.get(SECTION):
            paths += _section_paths(field.default_factory, f"{path}.{field.name}")
        else:
            paths.append(path)
    return paths


def flags_by_section() -> dict[str, list[str]]:
    """Each settings section's flags, sections in PretrainConfig's order, flags in declaration order."""
    config = PretrainConfig()
    sections: dict[str, list[str]] = {}
    for name in config.SECTIONS:
        kind = type(getattr(config, name))
        fields = [field for field, _ in option_fields(kind)]
        paths = _section_paths(kind, name)
        assert len(paths) == len(fields), kind
        for path, field in zip(paths, fields):
            sections.setdefault(path, []).append(flag_of(field))
    return sections


def render(sections: dict[str, list[str]]) -> str:
    lines = ["| section | flags |", "|---|---|"]
    for section, flags in sections.items():
        for start in range(0, len(flags), FLAGS_A_ROW):
            label = f"`{section}`" if start == 0 else ""
            lines.append(f"| {label} | {' '.join(f'`{flag}`' for flag in flags[start:start + FLAGS_A_ROW])} |")
    return "\n".join(lines)


def page_with_table(page: str, table: str) -> str:
    return generated_table.page_with_table(page, table, START, END)


def main() -> None:
    generated_table.write_or_check(PAGE, render(flags_by_section()), START, END, __doc__)


if __name__ == "__main__":
    main()
