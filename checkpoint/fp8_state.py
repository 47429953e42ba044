"""Delayed scaling's amax histories and scales in checkpoints (--fp8-recipe delayed, gpt/fp8.py).

TransformerEngine keeps each module's FP8 metadata (amax_history and scale per tensor role) in the module's
`_extra_state`, saved and loaded with the model's state dict (transformer_engine/pytorch/module/base.py,
get_extra_state / set_extra_state), so a Megatron resume continues the histories, with or without the optimizer.
Here the same: each FP8 linear's history [history_len, 3] and scales [3] by the linear's global module name, in
the checkpoint's metadata as their fp32 bit patterns (int32: exact for every value, inf and NaN included, which
JSON numbers would not carry). After the amax reduction over the tensor x data parallel ranks (parallel/fp8/
recipes.py) every rank of a pipeline stage holds the same histories for the linears they share, so one rank per
stage and expert-parallel rank (the first of its expert tensor- and data-parallel groups) sends its own, and the
first rank writes them all, one entry per global name (saved_fp8_histories). Under expert parallelism each expert's
history is held by its expert-parallel rank alone (its amax reduced with the other ranks' experts at the same local
index, as TE does, parallel/fp8/grouped.py), so it is that rank's copy which is saved. The stateless recipes have
nothing to save.
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
    """What a save writes: on the first rank every stage's and expert-parallel rank's histories by global name, {}
    elsewhere. A collective (every rank calls it) with --fp8-format on and more than one rank."""
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
    """A saved history at this run's --fp8-amax-history-len, as TE's adjust_amax_history_length (module/base.py)
    does on the first forward after the load: its first `length` rows, or zero rows appended."""
    if history.size(0) >= length:
        return history[:length].clone()
    return torch.nn.functional.pad(history, (0, 0, 0, length - history.size(0)))


# gpt/fp8.py runs a gated MLP's gate and up as one FP8 linear (Megatron's linear_fc1) named JOINED, with one state
JOINED, PARTS = ".dense_h_to_4h", (".dense_h_to_4h_gate", ".dense_h_to_4h_up")


def _saved_state(name: str, saved: dict, device: torch.device) -> Optional[dict[str, torch.Tensor]]:
    """The saved history and scale of the linear `name`, as tensors, or None. A joined gate and up saved as two
    linears (before they were joined, or by a run that did not join them: --fp8-param-gather, biases) take the
    elementwise max of the two histories (their rows were the two halves' amaxes; the joined tensor's amax is their
    max) and the smaller scale of each role (the one that fits both halves); two linears saved as one each take it."""
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
    """Put the saved histories (at this run's length) and scales into this rank's delayed-scaling linears
    (_saved_state: a gate and up saved apart or joined fit either way); returns the names of those the checkpoint
    holds none for (they start fresh: zeros, scale 1)."""
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
