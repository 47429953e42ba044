"""docs/configuration.md's flag table is rendered from the settings' metadata and names every setting's flag once."""

from __future__ import annotations

import re

from arguments.config import FLAG_NAMES
from arguments.parser import shared_parser
from scripts.tools.flag_table import END, PAGE, START, flags_by_section, page_with_table, render


def test_the_page_shows_the_flag_table_as_rendered():
    page = PAGE.read_text()
    assert page_with_table(page, render(flags_by_section())) == page, "run python scripts/tools/flag_table.py --write"


def test_the_table_names_every_setting_flag_once_and_each_parses():
    table = PAGE.read_text().split(START, 1)[1].split(END, 1)[0]
    flags = re.findall(r"`(--[\w-]+)`", table)
    assert sorted(flags) == sorted(FLAG_NAMES.values())
    assert len(set(flags)) == len(flags)
    options = shared_parser()._option_string_actions
    assert [flag for flag in flags if flag not in options] == []
