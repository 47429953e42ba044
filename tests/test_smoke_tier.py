"""The smoke tier, `python -m pytest -m smoke` (docs/testing.md): a few fast tests that stand for every package, so a
change that breaks a package's basics fails in under a minute. Each package's tests (tests/<package>/) hold at least
one test marked `smoke`, and none of them is also `slow`."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layering import PACKAGES

TESTS = Path(__file__).resolve().parent


def _marks(decorator: ast.expr) -> set[str]:
    """The pytest marks a decorator applies: `@pytest.mark.smoke`, and a parametrize whose params carry
    `marks=pytest.mark.smoke`."""
    found = set()
    for node in ast.walk(decorator):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "mark":
            found.add(node.attr)
    return found


def marked_tests(path: Path) -> dict[str, set[str]]:
    """{test function: the marks its decorators apply} for the tests of one file."""
    tree = ast.parse(path.read_text(), str(path))
    return {node.name: set().union(*(_marks(decorator) for decorator in node.decorator_list))
            for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_package_has_a_smoke_test_and_no_smoke_test_is_slow():
    smoke = {package: [f"{path.name}::{name}" for path in sorted((TESTS / package).glob("test_*.py"))
                       for name, marks in marked_tests(path).items() if "smoke" in marks]
             for package in PACKAGES}
    assert [package for package, tests in smoke.items() if not tests] == []
    slow = [f"{path.relative_to(TESTS)}::{name}" for path in sorted(TESTS.rglob("test_*.py"))
            for name, marks in marked_tests(path).items() if {"smoke", "slow"} <= marks]
    assert slow == []
