"""Fixtures of the arguments tests."""

from __future__ import annotations

import functools

import pytest


def parser_shape(parser) -> list[tuple]:
    """What a parse reads of the parser: every action's options, destination, default, arity, type and choices."""
    return [(tuple(a.option_strings), a.dest, repr(a.default), a.nargs, getattr(a.type, "__qualname__", repr(a.type)),
             repr(a.choices), repr(a.const), a.required) for a in parser._actions] + [repr(parser._defaults)]


@pytest.fixture(scope="module")
def one_parser():
    """The flags' parser built once for a module's parses instead of once per parse (arguments/parser.py's
    parse_arguments builds it anew each time: 60% of a parse of the tiny model's flags; as
    tests/checkpoint/test_metadata_ranges.py does): a parse does not change it, which the teardown checks against a
    parser built anew, so no test sees what an earlier one left. For modules of many parses whose tests change
    nothing the parser is built from (presets, harvested flags)."""
    import arguments.parser

    build = arguments.parser.build_parser
    cached = functools.cache(build)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arguments.parser, "build_parser", cached)
        yield
    assert parser_shape(cached()) == parser_shape(build()), "a parse changed the parser"
