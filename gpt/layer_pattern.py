"""Megatron-LM's per-layer patterns given as a list expression (its moe_freq_type, the type of --moe-layer-freq and
--window-attn-skip-freq): "([1]*3+[0]*1)*2" is one 0 or 1 per layer. Megatron evaluates the text with eval(); here
only list literals of integers, +, * and parentheses are read."""

from __future__ import annotations

import ast

from base.errors import ConfigError


def list_expression(text: str, flag: str) -> list:
    """The list `text` writes; anything else is one ConfigError naming `flag`."""
    def value(node: ast.AST):
        if isinstance(node, ast.List):
            return [value(item) for item in node.elts]
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(text)
    try:
        result = value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, TypeError, RecursionError):
        result = None
    if not isinstance(result, list):
        raise ConfigError(f"{flag} {text!r} is not a list expression of 0s and 1s such as '([1]*3+[0]*1)*2'",
                          flags=(flag,))
    return result
