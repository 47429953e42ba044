"""Renders docs/provenance.toml, where each behaviour follows the real pair, into the table of
docs/coming-from-megatron-deepspeed.md; `--write` rewrites it, tests/test_provenance_table.py checks it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from scripts.tools import generated_table

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "provenance.toml"
PAGE = ROOT / "docs" / "coming-from-megatron-deepspeed.md"
START, END = "<!-- provenance:start -->", "<!-- provenance:end -->"
FIELDS = ("setting", "ours", "theirs", "function", "release")


def load_rows(path: Path = DATA) -> list[dict[str, str]]:
    rows = tomllib.loads(path.read_text()).get("row", [])
    for row in rows:
        if set(row) != set(FIELDS):
            raise ValueError(f"{path}: a row has {sorted(row)}, not {list(FIELDS)}")
    return rows


def render(rows: list[dict[str, str]]) -> str:
    lines = ["| setting | here | Megatron-LM / DeepSpeed | function | release |", "|---|---|---|---|---|"]
    lines += [f"| `{r['setting']}` | `{r['ours']}` | `{r['theirs']}` | `{r['function']}` | {r['release']} |"
              for r in sorted(rows, key=lambda r: (r["ours"], r["setting"]))]
    return "\n".join(lines)


def page_with_table(page: str, table: str) -> str:
    return generated_table.page_with_table(page, table, START, END)


def main() -> None:
    generated_table.write_or_check(PAGE, render(load_rows()), START, END, __doc__)


if __name__ == "__main__":
    main()
