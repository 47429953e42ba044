"""Megatron-LM's per-layer patterns given as a list expression ("([1]*3+[0]*1)*2": one 0/1 per layer). Only list
literals of integers, +, * and parentheses are read (Megatron uses eval()), and the length is worked out before the list
is built."""

from __future__ import annotations

import ast

from base.errors import ConfigError


def freq_value(text: str):
    """A layer frequency flag's value as Megatron-LM keeps it: an int, or the expression's text."""
    text = str(text).strip()
    if "[" in text:
        return text
    try:
        return int(text)
    except ValueError:
        return text  # refused with the launch's other problems


def _read(text: str, flag: str) -> ast.AST:
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        raise _not_a_list(text, flag) from None


def _not_a_list(text: str, flag: str) -> ConfigError:
    return ConfigError(f"{flag} {text!r} is not a list expression of 0s and 1s such as '([1]*3+[0]*1)*2'",
                       flags=(flag,))


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _length(node: ast.AST) -> tuple[bool, int]:
    """(True, the list's length) or (False, the integer), without building the list."""
    if isinstance(node, ast.List):
        if not all(_is_int(item) for item in node.elts):
            raise ValueError(node)
        return True, len(node.elts)
    if _is_int(node):
        return False, node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        (left_list, left), (right_list, right) = _length(node.left), _length(node.right)
        if isinstance(node.op, ast.Add):
            if left_list != right_list:  # a list plus an integer: eval's TypeError
                raise ValueError(node)
            return left_list, left + right
        if left_list and right_list:
            raise ValueError(node)
        if left_list or right_list:
            return True, (left * max(right, 0) if left_list else right * max(left, 0))
        return False, left * right
    raise ValueError(node)


def _value(node: ast.AST):
    if isinstance(node, ast.List):
        return [_value(item) for item in node.elts]
    if isinstance(node, ast.Constant):
        return node.value
    left, right = _value(node.left), _value(node.right)
    return left + right if isinstance(node.op, ast.Add) else left * right


def layer_flags(text: str, flag: str, num_layers: int, meaning: str) -> list[int]:
    """The one 0/1 per layer that `text` writes; anything else is one ConfigError naming `flag`."""
    try:
        is_list, length = _length(_read(text, flag))
    except (ValueError, RecursionError):
        is_list, length = False, 0
    if not is_list:
        raise _not_a_list(text, flag)
    if length != num_layers:
        raise ConfigError(f"{flag} {text!r} gives {length} values; it needs one {meaning} per layer, {num_layers} "
                          f"in all", flags=(flag, "--num-layers"))
    pattern = _value(_read(text, flag))
    if any(value not in (0, 1) for value in pattern):
        raise ConfigError(f"{flag} {text!r} holds {sorted(set(pattern) - {0, 1})[0]}; it needs one {meaning} per "
                          f"layer", flags=(flag,))
    return pattern


def no_rope_layers(freq, num_layers: int) -> tuple[bool, ...]:
    """--no-rope-freq per layer: True where attention skips rotary. An integer N (dividing the layers) makes each N-th
    layer skip, as Megatron-Core."""
    if not freq:
        return (False,) * num_layers
    every = check_no_rope_freq(freq, num_layers)
    if every is None:
        return tuple(bool(value) for value in layer_flags(str(freq), "--no-rope-freq", num_layers, NO_ROPE_VALUES))
    return tuple((layer + 1) % every == 0 for layer in range(num_layers))


NO_ROPE_VALUES = "1 (no rotary) or 0 (rotary)"


def check_no_rope_freq(freq, num_layers: int):
    """A bad --no-rope-freq as one ConfigError, cheap for an integer; the integer, or None for a list."""
    text = str(freq).strip()
    if "[" in text:
        layer_flags(text, "--no-rope-freq", num_layers, NO_ROPE_VALUES)
        return None
    try:
        every = int(text)
    except ValueError:
        raise _not_a_list(text, "--no-rope-freq") from None
    if every < 1 or num_layers % every:
        raise ConfigError(f"--no-rope-freq {every} must be a divisor of --num-layers {num_layers} (each N-th layer "
                          f"skips rotary, as Megatron-Core asserts)", flags=("--no-rope-freq", "--num-layers"))
    return every
