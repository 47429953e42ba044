"""docs/provenance.toml is rendered into coming-from-megatron-deepspeed.md and names files that exist here."""

from __future__ import annotations

import re

from scripts.tools.provenance_table import PAGE, ROOT, load_rows, page_with_table, render


def test_the_page_shows_the_provenance_file_as_rendered():
    page = PAGE.read_text()
    assert page_with_table(page, render(load_rows())) == page, "run python scripts/tools/provenance_table.py --write"


def test_every_row_names_a_module_here_and_a_release():
    rows = load_rows()
    assert rows
    assert [r["ours"] for r in rows if not (ROOT / r["ours"]).exists()] == []
    assert [r["release"] for r in rows if not re.fullmatch(r"(core_)?v?\d+\.\d+(\.\d+)?\S*|main", r["release"])] == []
