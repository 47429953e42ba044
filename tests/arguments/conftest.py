"""Fixtures of the arguments tests."""

from __future__ import annotations

import pytest


def parser_shape(parser) -> list[tuple]:
    """What a parse reads of the parser: every action's options, destination, default, arity, type and choices."""
    return [(tuple(a.option_strings), a.dest, repr(a.default), a.nargs, getattr(a.type, "__qualname__", repr(a.type)),
             repr(a.choices), repr(a.const), a.required) for a in parser._actions] + [repr(parser._defaults)]


@pytest.fixture(scope="module", autouse=True)
def one_parser():
    """parse_arguments parses with one parser per process (arguments/parser.py's shared_parser), which a parse must
    leave as it was built: after each module's parses its shape is checked against a parser built anew, so no test
    sees what an earlier one left."""
    import arguments.parser

    yield
    assert parser_shape(arguments.parser.shared_parser()) == parser_shape(arguments.parser.build_parser()), \
        "a parse changed the parser"
