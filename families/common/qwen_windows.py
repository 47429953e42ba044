"""What Qwen2 and Qwen3 (families/qwen2/, families/qwen3/) share: their sliding-window keys, read into our windows
as Qwen2Config.__post_init__ and Qwen2Attention take them, and written back."""

from __future__ import annotations

from families.common.dense import (
    LAYER_TYPES,
    SLIDING,
    checked_layer_types,
    layer_types_of,
    sliding_window_of,
    window_settings,
)
from families.common.fields import BOOLEAN, INTEGER, POSITIVE_INT, Field, FolderValue, HFConfig
from gpt.model_config import ModelConfig

# Qwen2's and Qwen3's window keys (Qwen2Config, Qwen3Config)
SLIDING_FIELDS = (Field("use_sliding_window", BOOLEAN, False), Field("sliding_window", POSITIVE_INT, 4096, nullable=True),
                  Field("max_window_layers", INTEGER, 28), LAYER_TYPES)

def windowed_layers(config: HFConfig) -> tuple[tuple[bool, ...], object]:
    """(which layers have the window, transformers' sliding_window) as Qwen2Config.__post_init__ and
    Qwen2Attention take them (`self.sliding_window = config.sliding_window if layer_types[i] == "sliding_attention"
    else None`)."""
    values = config.values
    window = values["sliding_window"] if values["use_sliding_window"] else None
    kinds = checked_layer_types(config)
    if kinds is None:
        kinds = [SLIDING if window is not None and layer >= values["max_window_layers"] else "full_attention"
                 for layer in range(config.num_layers)]
    return tuple(kind == SLIDING and window is not None for kind in kinds), window


def qwen_window_settings(config: HFConfig) -> dict[str, FolderValue]:
    windowed, window = windowed_layers(config)
    return window_settings(window, windowed, "use_sliding_window, sliding_window, max_window_layers, layer_types")


def qwen_window_write(model: ModelConfig) -> dict:
    """Qwen2's and Qwen3's window keys for our windows: use_sliding_window, and the layer_types of each layer (any
    pattern; transformers reads layer_types when given)."""
    window = sliding_window_of(model)
    return dict(use_sliding_window=window is not None, sliding_window=window, max_window_layers=model.num_layers,
                layer_types=layer_types_of(model))
