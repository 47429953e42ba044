"""A table a script generates into a docs page between two HTML comment markers: `--write` rewrites it, else it says
whether the page is up to date (tests compare `page_with_table` with the page)."""

from __future__ import annotations

import argparse
from pathlib import Path


def page_with_table(page: str, table: str, start: str, end: str) -> str:
    head, rest = page.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}\n{end}{tail}"


def write_or_check(page_path: Path, table: str, start: str, end: str, description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help="rewrite the page's table")
    args = parser.parse_args()
    page = page_path.read_text()
    new = page_with_table(page, table, start, end)
    if args.write and new != page:
        page_path.write_text(new)
        print(f"wrote {page_path.name}")
    else:
        print("up to date" if new == page else "stale: run with --write")
