"""Sliding-window attention: Megatron-LM's --window-size and --window-attn-skip-freq as Megatron-Core reads them. A
query sees the L keys before it (causal, so the right side is 0); every N-th layer, or those a 0/1 list marks, attends
to the whole context."""

from __future__ import annotations

from argparse import ArgumentTypeError
from typing import Optional, Union

import torch

from base.errors import ConfigError
from gpt.layer_pattern import layer_flags


def window_size_value(text) -> tuple[int, int]:
    """--window-size as Megatron-LM's tuple_type reads it: "L,R" or "(L,R)"."""
    if isinstance(text, (tuple, list)):
        values = list(text)
    else:
        values = [part for part in str(text).strip().strip("()[]").split(",")]
    try:
        numbers = tuple(int(str(value).strip()) for value in values)
    except ValueError:
        numbers = ()
    if len(numbers) != 2:
        raise ArgumentTypeError(f"invalid window {text!r}: give LEFT,RIGHT (two integers, -1 for no limit)")
    return numbers


def check_window_size(window_size: Optional[tuple[int, int]]) -> None:
    if window_size is None:
        return
    if any(side < -1 for side in window_size):
        raise ConfigError(f"--window-size {window_size[0]},{window_size[1]}: each side is a number of keys, at least "
                          f"0, or -1 for no limit", flags=("--window-size",))


def layer_windows(window_size: Optional[tuple[int, int]], skip_freq: Union[None, int, str],
                  num_layers: int) -> tuple[Optional[int], ...]:
    """Per layer, how many keys before the query it sees, or None for the whole causal context."""
    if window_size is None or window_size[0] < 0:
        return (None,) * num_layers
    left = window_size[0]
    if skip_freq is None:
        return (left,) * num_layers
    text = str(skip_freq).strip()
    if "[" not in text:
        try:
            every = int(text)
        except ValueError:
            raise ConfigError(f"--window-attn-skip-freq {text!r} is neither an integer nor a list expression such "
                              f"as '([1]*3+[0]*1)*2'", flags=("--window-attn-skip-freq",)) from None
        if every < 1:
            raise ConfigError(f"--window-attn-skip-freq must be at least 1, got {every}",
                              flags=("--window-attn-skip-freq",))
        return tuple(left if (layer + 1) % every else None for layer in range(num_layers))
    pattern = layer_flags(text, "--window-attn-skip-freq", num_layers, "1 (sliding window) or 0 (full attention)")
    return tuple(left if value else None for value in pattern)


def any_layer_windowed(window_size: Optional[tuple[int, int]], skip_freq: Union[None, int, str],
                       num_layers: int) -> bool:
    """Whether some layer has a window, without a tuple per layer."""
    if window_size is None or window_size[0] < 0 or num_layers < 1:
        return False
    if skip_freq is None:
        return True
    text = str(skip_freq).strip()
    if "[" not in text:
        return text != "1"  # every layer but each N-th: N = 1 leaves none
    return any(window is not None for window in layer_windows(window_size, skip_freq, num_layers))


def window_visible(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """[queries, keys] bool: the key is the query or one of `window` before it."""
    distance = query_positions[:, None] - key_positions[None, :]
    return (distance >= 0) & (distance <= window)


def causal_window_mask(seq_length: int, window: int, device: torch.device,
                       attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The window as SDPA's bool mask, combined with `attention_mask` where given."""
    positions = torch.arange(seq_length, device=device)
    band = window_visible(positions, positions, window)
    return band if attention_mask is None else attention_mask & band
