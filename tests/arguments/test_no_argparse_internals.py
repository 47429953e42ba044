"""Issue 35, point 3: no module reads argparse's private attributes (`parser._actions`,
`_option_string_actions`, `_registry`, `argparse._StoreConstAction`, ...). They are not argparse's
documented interface and change between Python versions; the options this program adds are kept in its
own table where each is added (arguments/option_table.py)."""

from __future__ import annotations

import re

from tests.readme import ROOT
from tests.repository_tree import repository_files

PRIVATE = re.compile(r"\._(?:actions|option_string_actions|registry|registries|registry_get|action_groups|group_actions|"
                     r"mutually_exclusive_groups|get_optional_actions|get_positional_actions|get_option_tuples|"
                     r"parse_optional|match_argument)\b|\bargparse\._[A-Za-z]")


def _library_files():
    for path in (path for path in repository_files() if path.suffix == ".py"):
        parts = path.relative_to(ROOT).parts
        if parts[0] == "tests" or any(part.startswith(".") or part in ("venv", "site-packages") for part in parts):
            continue
        yield path


def test_no_module_outside_tests_reads_argparse_private_attributes():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in _library_files()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if PRIVATE.search(line)]
    assert found == []


def test_the_pattern_catches_each_way_of_reading_them():
    for line in ("parser._actions", "parser._option_string_actions.get(flag)", "parser._registry_get('action', x)",
                 "isinstance(action, argparse._StoreConstAction)", "group._group_actions"):
        assert PRIVATE.search(line), line
    assert not PRIVATE.search("option_table(parser).action_for(flag)")


def test_the_option_table_holds_every_option_the_parser_has():
    """The table is built where add_argument is called; argparse's own view (read here, in a test, only to
    check the table is complete) must hold nothing the table lacks."""
    from arguments.parser import build_parser

    parser = build_parser()
    table = parser.option_table
    assert [action.dest for action in table] == [action.dest for action in parser._actions]
    assert sorted(table.options()) == sorted(parser._option_string_actions)
