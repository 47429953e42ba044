"""The options this program adds to its argument parser, recorded where each is added: argparse keeps its action table
private, so `OptionTable.add` keeps each Action `add_argument` returns, and the parser's options are read from
`parser.option_table`."""

from __future__ import annotations

import argparse
from typing import Iterator, Optional


class OptionTable:
    def __init__(self) -> None:
        self._added: list[argparse.Action] = []
        self._by_option: dict[str, argparse.Action] = {}

    def add(self, container, *options: str, **keywords) -> argparse.Action:
        """`container.add_argument(*options, **keywords)` (a parser or a group), recorded."""
        action = container.add_argument(*options, **keywords)
        self._added.append(action)
        for option in action.option_strings:
            self._by_option[option] = action
        return action

    def __iter__(self) -> Iterator[argparse.Action]:
        """The actions in the order they were added (a setting's own flag before its other spellings)."""
        return iter(self._added)

    def __contains__(self, option: str) -> bool:
        return option in self._by_option

    def action_for(self, option: str) -> Optional[argparse.Action]:
        return self._by_option.get(option)

    def options(self) -> list[str]:
        return list(self._by_option)

    def dests(self) -> list[str]:
        return list(dict.fromkeys(action.dest for action in self._added if action.dest != "help"))


def option_table(parser: argparse.ArgumentParser) -> OptionTable:
    """The table of a parser built by arguments/parser.py's build_parser."""
    return parser.option_table


def stores_a_constant(action: argparse.Action) -> bool:
    """A flag that stores a fixed value (store_const, store_true, store_false), not one typed after it
    nor a --flag/--no-flag pair."""
    return action.nargs == 0 and not isinstance(action, argparse.BooleanOptionalAction)
