"""The house's prose against its code: docstring and comment words per code line, module docstrings' lengths, and
the docs' words. `python -m tests.prose_count` prints them; tests/test_house_bounds.py holds them to their bounds.

A code line is a line of a Python file that is neither blank, nor a comment, nor inside a docstring.
"""

from __future__ import annotations

import ast
import io
import statistics
import tokenize
from dataclasses import dataclass
from pathlib import Path

from tests.test_layering import PACKAGES, ROOT

SOURCE_FOLDERS = (*PACKAGES, "scripts")


@dataclass(frozen=True)
class FileProse:
    code_lines: int
    prose_words: int             # docstrings' and comments' words
    module_docstring_words: int


def _docstrings(tree: ast.AST) -> list[ast.Constant]:
    nodes = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                nodes.append(first.value)
    return nodes


def file_prose(path: Path) -> FileProse:
    text = path.read_text()
    tree = ast.parse(text, str(path))
    docstrings = _docstrings(tree)
    prose_lines = set()
    words = 0
    for node in docstrings:
        prose_lines.update(range(node.lineno, node.end_lineno + 1))
        words += len(node.value.split())
    comment_only = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            words += len(token.string.lstrip("#").split())
            if not token.line[:token.start[1]].strip():
                comment_only.add(token.start[0])
    code = sum(1 for number, line in enumerate(text.splitlines(), 1)
               if line.strip() and number not in prose_lines and number not in comment_only)
    module = docstrings[0] if docstrings and docstrings[0].lineno == _first_statement_line(tree) else None
    return FileProse(code, words, len(module.value.split()) if module is not None else 0)


def _first_statement_line(tree: ast.Module) -> int:
    return tree.body[0].lineno if tree.body else 0


def source_files(root: Path = ROOT) -> list[Path]:
    files = [path for folder in SOURCE_FOLDERS for path in sorted((root / folder).rglob("*.py"))]
    return files + sorted(root.glob("*.py"))


def house_prose(root: Path = ROOT) -> dict[str, float]:
    prose = [file_prose(path) for path in source_files(root)]
    module_words = [p.module_docstring_words for p in prose if p.module_docstring_words]
    return {"prose words per code line": sum(p.prose_words for p in prose) / sum(p.code_lines for p in prose),
            "module docstring median words": statistics.median(module_words),
            "module docstring max words": max(module_words),
            "docs words": sum(len(path.read_text().split()) for path in sorted((root / "docs").rglob("*.md"))),
            "largest docs page words": max(len(path.read_text().split())
                                           for path in sorted((root / "docs").rglob("*.md")))}


if __name__ == "__main__":
    for name, value in house_prose().items():
        print(f"{name}: {value:,.2f}" if isinstance(value, float) else f"{name}: {value:,}")
