"""Delayed scaling's amax histories and scales in checkpoints (--fp8-recipe delayed), as TransformerEngine's
`_extra_state` carries them: per FP8 linear by global name, stored as fp32 bit patterns (exact, inf and NaN included).
One rank per stage and expert-parallel rank sends its own; the first rank writes them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from gpt.fp8 import delayed_states

KEYS = ("amax_history", "scale")


def _bits(tensor: torch.Tensor) -> list:
    return tensor.detach().to("cpu", torch.float32).contiguous().view(torch.int32).tolist()


def _from_bits(bits: list, device: torch.device) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.int32).view(torch.float32).to(device)


def fp8_histories(model: nn.Module) -> dict[str, dict[str, list]]:
    """{linear name: {"amax_history": bits, "scale": bits}} of this rank's delayed-scaling linears ({} without)."""
    return {name: {key: _bits(value) for key, value in delayed.state_dict().items()}
            for name, delayed in delayed_states(model).items()}


def saved_fp8_histories(model: nn.Module, config, state) -> dict[str, dict[str, list]]:
    """On the first rank every stage's and expert-parallel rank's histories by global name, {} elsewhere; a collective.
    """
    if not config.model.fp8.enabled:
        return {}
    experts = state.experts
    mine = fp8_histories(model) if experts.tensor_rank == 0 and experts.data_rank == 0 else {}
    merged: dict[str, dict[str, list]] = {}
    for histories in state.comm.all_gather_object(mine):
        for name, entry in histories.items():
            merged.setdefault(name, entry)  # the copies of a name are equal after the amax reduction
    return merged if state.is_first_rank else {}


def fit_history_length(history: torch.Tensor, length: int) -> torch.Tensor:
    """A saved history at this run's --fp8-amax-history-len (TE's adjust_amax_history_length): first rows, or zero rows
    added."""
    if history.size(0) >= length:
        return history[:length].clone()
    return torch.nn.functional.pad(history, (0, 0, 0, length - history.size(0)))


# A gated MLP's gate and up run as one FP8 linear, JOINED, with one state.
JOINED, PARTS = ".dense_h_to_4h", (".dense_h_to_4h_gate", ".dense_h_to_4h_up")


def _saved_state(name: str, saved: dict, device: torch.device) -> Optional[dict[str, torch.Tensor]]:
    """The saved history and scale of linear `name`, or None. A joined gate/up saved as two takes the elementwise max
    history and the smaller scale; two saved as one each take it."""
    def entry(key: str) -> Optional[dict[str, torch.Tensor]]:
        value = saved.get(key)
        if not isinstance(value, dict) or any(part not in value for part in KEYS):
            return None
        return {part: _from_bits(value[part], device) for part in KEYS}
    found = entry(name)
    if found is not None:
        return found
    if name.endswith(JOINED):
        parts = [entry(name[:-len(JOINED)] + part) for part in PARTS]
        if all(part is not None for part in parts) and parts[0]["amax_history"].shape == \
                parts[1]["amax_history"].shape:
            return {"amax_history": torch.maximum(parts[0]["amax_history"], parts[1]["amax_history"]),
                    "scale": torch.minimum(parts[0]["scale"], parts[1]["scale"])}
    for part in PARTS:
        if name.endswith(part):
            return entry(name[:-len(part)] + JOINED)
    return None


def restore_fp8_histories(model: nn.Module, saved: Optional[dict[str, dict[str, list]]]) -> list[str]:
    """Put the saved histories and scales into this rank's delayed-scaling linears; returns those the checkpoint lacks
    (they start fresh)."""
    saved = saved or {}
    missing = []
    for name, delayed in delayed_states(model).items():
        entry = _saved_state(name, saved, delayed.scale.device)
        if entry is None:
            missing.append(name)
            continue
        delayed.load_state_dict({
            "amax_history": fit_history_length(entry["amax_history"], len(delayed.amax_history)),
            "scale": entry["scale"]})
    return missing
