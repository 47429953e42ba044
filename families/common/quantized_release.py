"""A released config.json's quantization_config says how the release stores its weights, not what the model computes:
transformers trains such a release only dequantized, so --init-from-hf builds the plain model and names the block in one
start-up line.
"""

from __future__ import annotations


def quantization_note(path, quantization_config, class_name: str) -> tuple[str, ...]:
    """The start-up line for a config.json's quantization_config (none when the file has none)."""
    if quantization_config is None:
        return ()
    method = quantization_config.get("quant_method")
    kept = quantization_config.get("modules_to_not_convert")
    unquantized = f"; modules_to_not_convert: {', '.join(map(str, kept))}" if isinstance(kept, list) and kept else ""
    return (f"> {path}: quantization_config quant_method {method!r} is how the release stores its weights"
            f"{unquantized}; the run is the unquantized {class_name} transformers trains after dequantizing them "
            f"(it then drops the block), and --init-from-hf reads bf16/fp16/fp32 weights only",)
