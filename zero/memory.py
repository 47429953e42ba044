"""Model-state memory: what ZeRO's accounting predicts (the ZeRO paper's Table 1, with our padded shards), what the
optimizer holds (its tensors summed by distinct storage, so a flat buffer counts once), and an analytic model of the
activations a micro-batch saves for backward."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable, Optional

import torch

MODEL_STATE_CATEGORIES = ("parameters", "gradients", "master_weights", "optimizer_states")
BUFFER_CATEGORY = "buffers"
# attribution order: storage shared with a buffer counts as a model state
MEASURED_CATEGORIES = MODEL_STATE_CATEGORIES + (BUFFER_CATEGORY,)

# Bytes per element of (parameters, gradients, fp32 master, Adam's two moments).
_BYTES_PER_ELEMENT = {
    "fp32": (4, 4, 4, 8),
    "bf16": (2, 2, 4, 8),
    "fp16": (2, 2, 4, 8),
}
# fp32 optimizer states per element beside the master.
OPTIMIZER_STATES = {"adam": 2, "ademamix": 3, "muon": 2, "sophiag": 2}
MOMENT_BYTES = {"fp32": 4, "bf16": 2}
_PARTITIONED_FROM_STAGE = {"parameters": 3, "gradients": 2, "master_weights": 1, "optimizer_states": 1}
ZERO_STAGES = (0, 1, 2, 3)
PAPER_GB = 10**9  # decimal GB, as Table 1


def _check_stage(stage: int) -> None:
    if stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage must be one of {ZERO_STAGES}, got {stage!r}")


def _check_data_parallel_size(data_parallel_size: int) -> None:
    if data_parallel_size < 1:
        raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")


def predict_model_state_bytes(num_parameters: int, stage: int, data_parallel_size: int,
                              precision: str, gradient_precision: Optional[str] = None,
                              optimizer: str = "adam", moment_dtypes: tuple[str, str] = ("fp32", "fp32")
                              ) -> dict[str, int]:
    """Per-rank bytes of each model state for Ψ = `num_parameters` (this rank's TP shard)."""
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}")
    if any(dtype not in MOMENT_BYTES for dtype in moment_dtypes):
        raise ValueError(f"moment dtypes must be among {sorted(MOMENT_BYTES)}, got {moment_dtypes!r}")
    for value in (precision, gradient_precision or precision):
        if value not in _BYTES_PER_ELEMENT:
            raise ValueError(f"precision must be one of {sorted(_BYTES_PER_ELEMENT)}, got {value!r}")
    _check_stage(stage)
    _check_data_parallel_size(data_parallel_size)
    if num_parameters < 0:
        raise ValueError(f"num_parameters must be >= 0, got {num_parameters}")
    shard_elements = -(-num_parameters // data_parallel_size)
    per_element = list(_BYTES_PER_ELEMENT[precision])
    per_element[1] = _BYTES_PER_ELEMENT[gradient_precision or precision][1]
    per_element[3] = sum(MOMENT_BYTES[dtype] for dtype in moment_dtypes) + 4 * (OPTIMIZER_STATES[optimizer] - 2)
    predicted = {}
    for category, bytes_per_element in zip(MODEL_STATE_CATEGORIES, per_element):
        partitioned = stage >= _PARTITIONED_FROM_STAGE[category]
        predicted[category] = bytes_per_element * (shard_elements if partitioned else num_parameters)
    predicted["total"] = sum(predicted.values())
    return predicted


def paper_model_state_gb(psi: float, data_parallel_size: int, stage: int, k: int = 12) -> float:
    """The ZeRO paper's per-device model-state memory (Table 1), in decimal GB."""
    _check_stage(stage)
    _check_data_parallel_size(data_parallel_size)
    n = data_parallel_size
    per_stage = {
        0: (4 + k) * psi,
        1: 4 * psi + k * psi / n,
        2: 2 * psi + (2 + k) * psi / n,
        3: (4 + k) * psi / n,
    }
    return per_stage[stage] / PAPER_GB


def checkpointed_input_bytes(seq_length: int, micro_batch_size: int, hidden_size: int, bytes_per_element: int,
                             tensor_parallel_size: int, partitioned: bool) -> int:
    """Bytes one rank keeps for one checkpointed block input (its 1/TP slice with P_a)."""
    _check_positive(seq_length=seq_length, micro_batch_size=micro_batch_size, hidden_size=hidden_size,
                    bytes_per_element=bytes_per_element, tensor_parallel_size=tensor_parallel_size)
    elements = seq_length * micro_batch_size * hidden_size
    if partitioned:
        elements = -(-elements // tensor_parallel_size)
    return elements * bytes_per_element


@dataclass(frozen=True)
class LayerActivationTerms:
    """One block's activations saved for backward, in bytes per token at 16 bits, as Korthikanti et al. 2022 count
    them."""
    replicated_bytes_per_token: int   # kept whole on every TP rank: norm and column-parallel
                                      # inputs, dropout masks (1 byte)
    partitioned_bytes_per_token: int  # split over TP (and, under sequence parallelism,
                                      # the norm inputs and dropout masks)
    bytes_per_attention_score: int    # softmax output 2, its dropout mask 1, dropout output 2
    attention_heads: int

    @classmethod
    def korthikanti_gpt(cls, hidden_size: int, num_attention_heads: int) -> "LayerActivationTerms":
        """The paper's block: 34sbh + 5as^2b bytes, 24sbh inside the TP regions."""
        return cls(10 * hidden_size, 24 * hidden_size, 5, num_attention_heads)


def predict_saved_activation_bytes(num_layers: int, seq_length: int, micro_batch_size: int, hidden_size: int,
                                   num_attention_heads: int, bytes_per_element: int, tensor_parallel_size: int,
                                   checkpoint_num_layers: Optional[int], partitioned: bool,
                                   layer: Optional[LayerActivationTerms] = None,
                                   recompute_method: str = "uniform") -> dict[str, int]:
    """Per-rank bytes of the blocks' activations saved for backward in one micro-batch: checkpointed inputs, one block's
    without recompute, and the total (embeddings and logits not included)."""
    _check_positive(num_layers=num_layers, num_attention_heads=num_attention_heads)
    if checkpoint_num_layers is not None and checkpoint_num_layers < (0 if recompute_method == "block" else 1):
        raise ValueError(f"checkpoint_num_layers must be >= 1 (>= 0 under block) or None, got {checkpoint_num_layers}")
    one_input = checkpointed_input_bytes(seq_length, micro_batch_size, hidden_size, bytes_per_element,
                                         tensor_parallel_size, partitioned)
    layer = layer or LayerActivationTerms.korthikanti_gpt(hidden_size, num_attention_heads)
    s, b, t = seq_length, micro_batch_size, tensor_parallel_size
    per_token_16_bit = (layer.replicated_bytes_per_token + Fraction(layer.partitioned_bytes_per_token, t)
                        + Fraction(layer.bytes_per_attention_score * layer.attention_heads * s, t))
    per_layer = math.ceil(s * b * per_token_16_bit * Fraction(bytes_per_element, 2))
    if checkpoint_num_layers is None:
        checkpointed = 0
        total = num_layers * per_layer
    elif recompute_method == "block":
        recomputed = min(checkpoint_num_layers, num_layers)
        checkpointed = recomputed * one_input
        total = checkpointed + (num_layers - recomputed) * per_layer
    else:
        checkpointed = -(-num_layers // checkpoint_num_layers) * one_input
        total = checkpointed
    return {"checkpointed_inputs": checkpointed, "per_layer_without_recompute": per_layer, "total": total}


def _check_positive(**sizes: int) -> None:
    for name, value in sizes.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def storage_identity(tensor: torch.Tensor) -> tuple[str, int]:
    """Which allocation `tensor` is a view of (on meta, the storage's address)."""
    storage = tensor.untyped_storage()
    if tensor.device.type == "meta":
        return ("meta", storage._cdata)
    return (str(tensor.device), storage.data_ptr())


def _storage_key(tensor: torch.Tensor) -> tuple[str, int, int]:
    return (*storage_identity(tensor), tensor.untyped_storage().nbytes())


def measure_tensor_bytes(categories: dict[str, Iterable[Optional[torch.Tensor]]],
                         include_meta: bool = False) -> dict[str, int]:
    """Bytes of the distinct storages behind each category's tensors, plus the model-state "total"."""
    unknown = set(categories) - set(MEASURED_CATEGORIES)
    if unknown:
        raise ValueError(f"unknown memory categories {sorted(unknown)}; expected some of "
                         f"{list(MEASURED_CATEGORIES)}")
    seen: set[tuple[str, int, int]] = set()
    measured = {category: 0 for category in MODEL_STATE_CATEGORIES}
    for category in MEASURED_CATEGORIES:
        if category not in categories:
            continue
        measured[category] = 0
        for tensor in categories[category]:
            if tensor is None or (tensor.device.type == "meta" and not include_meta):
                continue
            key = _storage_key(tensor)
            if key in seen:
                continue
            seen.add(key)
            measured[category] += key[2]
    measured["total"] = sum(measured[category] for category in MODEL_STATE_CATEGORIES)
    return measured


PLACEMENTS = ("device", "host")


def host_resident_tensors(optimizer) -> list[torch.Tensor]:
    """The tensors offload keeps in host memory, named by buffer, not by device, so CPU and meta runs say where CUDA's
    go."""
    if hasattr(optimizer, "parts"):  # expert parallelism's dense and expert optimizers
        return [tensor for part in optimizer.parts for tensor in host_resident_tensors(part)]
    tensors = list(optimizer.host_state_tensors())
    parameters = optimizer.parameters
    if getattr(getattr(parameters, "placement", None), "parameter_shard_on_host", False):
        tensors.append(parameters.shard)
    return tensors


def measure_by_placement(categories: dict[str, Iterable[Optional[torch.Tensor]]],
                         host_tensors: Iterable[torch.Tensor], include_meta: bool = False
                         ) -> dict[str, dict[str, int]]:
    """`measure_tensor_bytes` split into "device" and "host"."""
    host_keys = {_storage_key(tensor) for tensor in host_tensors if tensor is not None}

    def placed(on_host: bool) -> dict[str, list[torch.Tensor]]:
        return {category: [tensor for tensor in tensors if tensor is not None
                           and (_storage_key(tensor) in host_keys) == on_host]
                for category, tensors in categories.items()}

    categories = {category: list(tensors) for category, tensors in categories.items()}
    return {"device": measure_tensor_bytes(placed(False), include_meta),
            "host": measure_tensor_bytes(placed(True), include_meta)}


def within_tolerance(measured_total: int, predicted_total: int, padding_bytes: int,
                     rel: float = 0.02) -> bool:
    """|measured - predicted| <= rel * predicted + padding_bytes."""
    if rel < 0 or padding_bytes < 0:
        raise ValueError(f"rel and padding_bytes must be >= 0, got rel={rel}, padding_bytes={padding_bytes}")
    return abs(measured_total - predicted_total) <= rel * predicted_total + padding_bytes


def relative_difference(measured: int, predicted: int) -> Optional[float]:
    """(measured - predicted) / predicted; None when nothing was predicted."""
    if predicted == 0:
        return None
    return (measured - predicted) / predicted


def memory_record(measured: dict[str, int], predicted: dict[str, int], rank: int,
                  extra: dict[str, Any]) -> dict[str, Any]:
    """A flat record of scalars, for metrics.jsonl and W&B."""
    record: dict[str, Any] = {"rank": rank}
    for category in MODEL_STATE_CATEGORIES + ("total",):
        record[f"measured_{category}_bytes"] = measured[category]
        record[f"predicted_{category}_bytes"] = predicted[category]
    if BUFFER_CATEGORY in measured:
        record["measured_buffers_bytes"] = measured[BUFFER_CATEGORY]
    record["relative_difference"] = relative_difference(measured["total"], predicted["total"])
    record.update(extra)
    return record


def format_bytes(num_bytes: float) -> str:
    """Binary units (KiB, MiB, ...), two decimals above a byte."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} TiB"


def format_memory_line(record: dict[str, Any]) -> str:
    """One console line of measured and predicted model states."""
    parts = ", ".join(
        f"{label} {format_bytes(record[f'measured_{category}_bytes'])}"
        for label, category in zip(("params", "grads", "master", "adam"), MODEL_STATE_CATEGORIES))
    difference = record["relative_difference"]
    difference_text = "n/a" if difference is None else f"{difference * 100:+.1f}%"
    line = (f"rank {record['rank']} model states: measured {format_bytes(record['measured_total_bytes'])} "
            f"({parts}) predicted {format_bytes(record['predicted_total_bytes'])} ({difference_text})")
    if "measured_buffers_bytes" in record:
        line += f"; buffers {format_bytes(record['measured_buffers_bytes'])}"
    return line
