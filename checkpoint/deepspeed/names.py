"""Which tensor of a Megatron-DeepSpeed GPT (GPTModel or GPTModelPipe) each of our parameters is, and how its rows
differ: the fused QKV is per group, or [TP rank][q | k | v] blocks in code after the FPDT change (args with
ds_sequence_parallel_fpdt); SwiGLU's dense_h_to_4h holds [gate; up], ours two parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from base.errors import CheckpointError

Region = tuple[slice, ...]


@dataclass(frozen=True)
class Mapped:
    """One of our parameters as a source tensor: `source`, row i taken from row `rows[i]` (None: row i)."""
    source: str
    rows: Optional[torch.Tensor] = None

    def shape(self, source_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(source_shape) if self.rows is None else (len(self.rows), *source_shape[1:])

    def shape_in(self, source_shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
        return self.shape(source_shapes[self.source])

    def sources(self) -> tuple[str, ...]:
        return (self.source,)

    def read(self, region: Region, read_source: Callable[[str, Region], torch.Tensor]) -> torch.Tensor:
        return read_mapped(self, region, read_source)


def qkv_rows_from_blocks(heads: int, groups: int, head_dim: int, tensor_parallel: int = 1) -> torch.Tensor:
    """For each row of our grouped layout, its row in the [TP rank][all queries | keys | values] layout."""
    if heads % tensor_parallel or groups % tensor_parallel:
        raise CheckpointError(f"{heads} attention heads and {groups} key/value heads do not split over a "
                              f"tensor-parallel size of {tensor_parallel}")
    per_group, heads_per_rank, groups_per_rank = heads // groups, heads // tensor_parallel, groups // tensor_parallel
    rank_rows = (heads_per_rank + 2 * groups_per_rank) * head_dim
    rows = []
    for group in range(groups):
        rank, local_group = divmod(group, groups_per_rank)
        base = rank * rank_rows
        for j in range(per_group):
            query = group * per_group + j - rank * heads_per_rank
            rows.append(base + query * head_dim)
        rows.append(base + (heads_per_rank + local_group) * head_dim)                    # key
        rows.append(base + (heads_per_rank + groups_per_rank + local_group) * head_dim)  # value
    return (torch.tensor(rows).unsqueeze(1) + torch.arange(head_dim)).reshape(-1)


@dataclass(frozen=True)
class Attention:
    """What the query/key/value rows need: the heads, key/value heads and head size of the model."""
    heads: int
    groups: int
    head_dim: int


# Megatron-DeepSpeed GPTModel's names (TP 1 shapes) -> ours. The layer's own names are ours already.
_MEGATRON_DEEPSPEED = [
    (r"language_model\.embedding\.word_embeddings\.weight", "word_embeddings.weight"),
    (r"language_model\.embedding\.position_embeddings\.weight", "position_embeddings.weight"),
    (r"language_model\.output_layer\.weight", "output_layer.weight"),
    (r"language_model\.encoder\.final_layernorm\.(weight|bias)", r"final_layernorm.\1"),
    (r"language_model\.encoder\.layers\.(\d+)\.self_attention\.(query_key_value|dense)\.(weight|bias)",
     r"blocks.\1.attention.\2.\3"),
    (r"language_model\.encoder\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.(weight|bias)",
     r"blocks.\1.\2.\3"),
    (r"language_model\.encoder\.layers\.(\d+)\.mlp\.(dense_h_to_4h|dense_4h_to_h)\.(weight|bias)",
     r"blocks.\1.mlp.\2.\3"),
]

MEGATRON_DEEPSPEED, MEGATRON_DEEPSPEED_PIPE = "Megatron-DeepSpeed GPTModel", "Megatron-DeepSpeed GPTModelPipe"
TRANSFORMERS = "transformers"  # a family of families/, GPT-2's too (checkpoint/deepspeed/families.py)


def model_family(names) -> Optional[str]:
    """Which family a source's parameter names are (None: none of them)."""
    names = list(names)
    if any(name.startswith("language_model.") for name in names):
        return MEGATRON_DEEPSPEED
    if any(re.fullmatch(r"\d+\.self_attention\..+", name) for name in names):
        return MEGATRON_DEEPSPEED_PIPE
    if any(name.startswith(("transformer.h.", "transformer.wte.", "model.")) for name in names):
        return TRANSFORMERS  # a CausalLM class's base model: GPT-2's `transformer`, the others' `model`
    return None


def _first_match(rules, name: str):
    for rule in rules:
        match = re.fullmatch(rule[0], name)
        if match:
            return match.expand(rule[1]), rule
    return None, None


def pipeline_module_names(names) -> dict[str, str]:
    """GPTModelPipe's names (by layer index; a tied embedding under tied_modules.embed) -> GPTModel's, for every name it
    can place."""
    names = list(names)
    layers = sorted({int(m.group(1)) for n in names for m in [re.fullmatch(r"(\d+)\.self_attention\..*", n)] if m})
    number = {index: position for position, index in enumerate(layers)}
    renamed = {}
    for name in names:
        embedding = re.fullmatch(r"(?:tied_modules\.embed|\d+)\.(word_embeddings|position_embeddings)\.weight", name)
        layer = re.fullmatch(r"(\d+)\.(.+)", name)
        if embedding:
            renamed[name] = f"language_model.embedding.{embedding.group(1)}.weight"
        elif layer and int(layer.group(1)) in number:
            renamed[name] = f"language_model.encoder.layers.{number[int(layer.group(1))]}.{layer.group(2)}"
        elif layer and layer.group(2) in ("weight", "bias") and layers and int(layer.group(1)) > layers[-1]:
            renamed[name] = f"language_model.encoder.final_layernorm.{layer.group(2)}"
        elif layer and layer.group(2) == "lm_head.weight":
            renamed[name] = "language_model.output_layer.weight"
    return renamed


def megatron_deepspeed_map(source_shapes: dict[str, tuple[int, ...]], attention: Attention, block_qkv: bool,
                           tensor_parallel: int, swiglu: bool) -> tuple[dict[str, Mapped], list[str]]:
    """Our names -> Mapped for a Megatron-DeepSpeed GPTModel, and the source names left unmapped. `block_qkv`: the FPDT
    block layout; `tensor_parallel`: the saved TP size."""
    mapped, unknown = {}, []
    pipeline = pipeline_module_names(source_shapes) if model_family(source_shapes) == MEGATRON_DEEPSPEED_PIPE else {}
    for name, shape in source_shapes.items():
        ours, _ = _first_match(_MEGATRON_DEEPSPEED, pipeline.get(name, name))
        if ours is None:
            unknown.append(name)
        elif ours.endswith("attention.query_key_value.weight") or ours.endswith("attention.query_key_value.bias"):
            if block_qkv and attention.groups != attention.heads:
                raise CheckpointError(
                    f"{name}: Megatron-DeepSpeed after commit 676a482c cuts query_key_value into three equal "
                    f"blocks, which holds only for multi-head attention, and this checkpoint has "
                    f"{attention.groups} key/value heads for {attention.heads} heads")
            rows = qkv_rows_from_blocks(attention.heads, attention.groups, attention.head_dim, tensor_parallel) \
                if block_qkv else None
            mapped[ours] = Mapped(name, rows)
        elif swiglu and ".mlp.dense_h_to_4h." in ours:
            half = shape[0] // 2
            for part, offset in (("gate", 0), ("up", half)):
                mapped[ours.replace("dense_h_to_4h", f"dense_h_to_4h_{part}")] = \
                    Mapped(name, torch.arange(offset, offset + half))
        else:
            mapped[ours] = Mapped(name)
    return mapped, unknown


def _row_runs(rows: torch.Tensor) -> list[tuple[int, int, int]]:
    """(our first row, source first row, length) of each stretch of consecutive source rows."""
    runs, start = [], 0
    values = rows.tolist()
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[i - 1] + 1:
            runs.append((start, values[start], i - start))
            start = i
    return runs


def read_mapped(mapped: Mapped, region: Region, read_source: Callable[[str, Region], torch.Tensor]) -> torch.Tensor:
    """`region` of our tensor, from `read_source(source name, source region)`: only the region's elements."""
    def read(ours: Region) -> torch.Tensor:
        return read_source(mapped.source, ours)

    if mapped.rows is None:
        return read(region)
    rows = mapped.rows[region[0]]
    pieces = [read((slice(source, source + length), *region[1:])) for _, source, length in _row_runs(rows)]
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]
