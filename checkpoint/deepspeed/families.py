"""A DeepSpeed run of a transformers model of a family read here: its parameters carry the module's names, so the
family's own Hugging Face mapping (the one --init-from-hf uses), traced once on stand-ins, says which rows of which
DeepSpeed tensor each of our tensors is. Families whose conversion is more than moving rows are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from base.errors import CheckpointError, ConfigError
from base.options import replace_settings
from checkpoint.hf.folders import check_tensors_fit
from checkpoint.hf.mapping import HFMapping, hf_mapping, model_types_for, read_whole_because
from checkpoint.hf.source import Run, read_runs, traced_runs

Region = tuple[slice, ...]
ReadSource = Callable[[str, Region, tuple[int, ...]], torch.Tensor]  # (name, region of the view, the view)


@dataclass(frozen=True)
class SourceTensor:
    """A DeepSpeed parameter as traced_runs takes it: its name and shape."""
    name: str
    shape: tuple[int, ...]


def row_view(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A tensor as rows: [-1, last] (traced_runs numbers a fused tensor's rows so)."""
    return (math.prod(shape[:-1]), shape[-1]) if len(shape) > 2 else tuple(shape)


@dataclass(frozen=True)
class Traced:
    """One of our tensors as runs of DeepSpeed tensors' rows, at its whole `shape`; `shift` the family's gain shift."""
    runs: list[Run]
    whole_shape: tuple[int, ...]
    shift: Callable[[str, torch.Tensor], torch.Tensor]
    name: str

    def shape_in(self, source_shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
        return self.whole_shape

    def sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(run.stored.name for run in self.runs if run.stored is not None))

    def read(self, region: Region, read_source: ReadSource) -> torch.Tensor:
        """`region` of our tensor: of each run it overlaps, only its rows' region of the DeepSpeed tensor."""
        rows, rest = region[0], region[1:]

        def read_run(run: Run, theirs: slice) -> torch.Tensor:
            if run.stored is None:
                raise CheckpointError(f"{self.name}: rows {theirs} are no DeepSpeed tensor's")
            view = row_view(run.stored.shape)
            if run.transposed:  # GPT-2's Conv1D: our rows are its columns
                return read_source(run.stored.name, (rest[0], theirs), view).t()
            return read_source(run.stored.name, (theirs, *rest), view)
        return self.shift(self.name, read_runs(self.runs, rows, read_run))


ROUTER_BUFFER = "e_score_correction_bias"  # DeepSeek-V3's and GLM-4.5's router bias: a buffer in transformers


def _why_not(mapping: HFMapping, canonical: dict[str, torch.Tensor]) -> Optional[str]:
    """Why these parameters (under the family's canonical names) are not `mapping`'s model (None: they are)."""
    expected = mapping.shapes
    buffers = sorted(name for name in expected if name.endswith(ROUTER_BUFFER) and name not in canonical)
    if buffers:
        return (f"its routers' {ROUTER_BUFFER} ({buffers[0]}, ...) is a buffer, not a parameter, and this reader takes "
                f"DeepSpeed's ZeRO partitions, which hold parameters only (the model states' module copy that holds "
                f"buffers is not read)")
    if mapping.tied and "lm_head.weight" in canonical:  # DeepSpeed records a tied (shared) parameter once
        return ("its lm_head.weight is a parameter of its own, this run's output layer is the word embedding (pass "
                "--untie-embeddings-and-output-weights)")
    try:
        check_tensors_fit(canonical, expected, "its parameters", mapping.embedding, mapping.tied)
    except ConfigError as error:
        return str(error)
    return None


def _fitting(shapes: dict[str, tuple[int, ...]], model) -> HFMapping:
    """The first family whose names hold these tensors for `model`, at the vocabulary they hold."""
    meta = {name: torch.empty(shape, device="meta") for name, shape in shapes.items()}
    reasons = []
    for model_type in model_types_for(model):
        because = read_whole_because(model_type)
        if because is None:
            mapping = hf_mapping(model_type, model, model.vocab_size)
            canonical = mapping.canonical(meta)
            rows = canonical[mapping.embedding].shape[0] if mapping.embedding in canonical else model.vocab_size
            if rows != model.vocab_size:
                mapping = hf_mapping(model_type, replace_settings(model, vocab_size=rows), rows)
            because = _why_not(mapping, canonical)
            if because is None:
                return mapping
        reasons.append(f"as {model_type}: {because}")
    raise CheckpointError(reasons[0] if reasons else "no family of families/ holds this run's model")


def family_map(source_shapes: dict[str, tuple[int, ...]], model) -> tuple[str, dict[str, Traced]]:
    """(the family's model_type, our names -> Traced) for a DeepSpeed run of a transformers model; CheckpointError where
    no family fits."""
    mapping = _fitting(source_shapes, model)
    stored = {name: SourceTensor(name, tuple(shape)) for name, shape in source_shapes.items()}
    traced = traced_runs(stored, mapping.transposed, lambda ids: mapping.convert(mapping.canonical(ids)))
    return mapping.model_type, {ours: Traced(runs, shape, mapping.shift, ours) for ours, (runs, shape) in traced.items()}
