"""Megatron-Core's distributed optimizer in its dp_reshardable layout: which stretch of which bucket holds which part of
our whole tensors. The file records only bucket sizes, so the layout is rebuilt as _ParamAndGradBuffer builds it and
checked against those sizes: a layout this code does not know is refused, never misread. An MoE model's routed
experts have a buffer of their own over the expert data-parallel group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from base.errors import CheckpointError


class UnreadLayout(CheckpointError):
    """Buckets this reader does not rebuild: the weights still load, the optimizer states are not read."""
PARAM_ALIGNMENT = 64  # _pad_start_of_param_if_needed
BUCKET_ALIGNMENT = 128  # _pad_end_of_bucket_if_needed: lcm(DP, 128)


@dataclass(frozen=True)
class LocalPiece:
    """Rows [row_start, row_start + shape[0]) of a TP-local parameter: our tensor `name`'s slice at `global_offset`."""
    name: str
    row_start: int
    shape: tuple[int, ...]
    global_offset: tuple[int, ...]


@dataclass(frozen=True)
class LocalParameter:
    """A parameter of one TP x PP rank's Megatron-Core GPT model, in registration order."""
    module_name: str
    shape: tuple[int, ...]
    pieces: tuple[LocalPiece, ...]  # empty: a copy kept elsewhere too (the last stage's tied embedding)
    shared_embedding: bool = False


@dataclass(frozen=True)
class ModelShape:
    """What the layout depends on, from the checkpoint's args."""
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    padded_vocab_size: int
    max_position_embeddings: int
    learned_positions: bool
    layernorm: bool  # LayerNorm (weight and bias) or RMSNorm (weight)
    gated: bool
    add_bias_linear: bool
    add_qkv_bias: bool
    qk_layernorm: bool
    tied: bool
    num_experts: Optional[int] = None  # an MoE model's routed experts (SequentialMLP), and which layers hold them
    moe_ffn_hidden_size: int = 0
    moe_layers: tuple[bool, ...] = ()


def _split(name: str, shape: tuple[int, ...], axis: Optional[int], tp_rank: int, tp: int) -> LocalPiece:
    """TP rank `tp_rank`'s slice of our whole tensor `name` (of local `shape`) split along `axis` (None: whole)."""
    offset = [0] * len(shape)
    if axis is not None:
        offset[axis] = tp_rank * shape[axis]
    return LocalPiece(name, 0, tuple(shape), tuple(offset))


@dataclass(frozen=True)
class Chunk:
    """One model chunk of a TP x PP rank: virtual chunk `vp_stage` of `vp` on pipeline stage `pp_rank` of `pp`."""
    tp_rank: int
    tp: int
    pp_rank: int
    pp: int
    vp_stage: int = 0
    vp: int = 1

    @property
    def first(self) -> bool:  # holds the embeddings
        return self.pp_rank == 0 and self.vp_stage == 0

    @property
    def last(self) -> bool:  # holds the final norm and the output layer
        return self.pp_rank == self.pp - 1 and self.vp_stage == self.vp - 1

    def layers(self, num_layers: int) -> range:
        """Its global layers (Megatron-Core's get_transformer_layer_offset)."""
        per_chunk = num_layers // (self.pp * self.vp)
        first = (self.vp_stage * self.pp + self.pp_rank) * per_chunk
        return range(first, first + per_chunk)


def local_parameters(model: ModelShape, chunk: Chunk) -> list[LocalParameter]:
    """One model chunk's parameters in Megatron-Core's registration order, each as the pieces of our tensors it holds.
    """
    h, tp_rank, tp, pp = model.hidden_size, chunk.tp_rank, chunk.tp, chunk.pp
    heads_width = model.num_attention_heads * model.kv_channels
    qkv_rows = (model.num_attention_heads + 2 * model.num_query_groups) * model.kv_channels
    params: list[LocalParameter] = []

    def add(module_name: str, ours: str, shape: tuple[int, ...], axis: Optional[int]) -> None:
        local = list(shape)
        if axis is not None:
            local[axis] //= tp
        params.append(LocalParameter(module_name, tuple(local), (_split(ours, tuple(local), axis, tp_rank, tp),)))

    def norm(module_name: str, ours: str, width: int) -> None:
        add(f"{module_name}.weight", f"{ours}.weight", (width,), None)
        if model.layernorm:
            add(f"{module_name}.bias", f"{ours}.bias", (width,), None)

    if chunk.first:
        add("embedding.word_embeddings.weight", "word_embeddings.weight", (model.padded_vocab_size, h), 0)
        if model.learned_positions:
            add("embedding.position_embeddings.weight", "position_embeddings.weight",
                (model.max_position_embeddings, h), None)
    for local, layer in enumerate(chunk.layers(model.num_layers)):
        theirs, ours = f"decoder.layers.{local}", f"blocks.{layer}"
        norm(f"{theirs}.input_layernorm", f"{ours}.input_layernorm", h)
        add(f"{theirs}.self_attention.linear_proj.weight", f"{ours}.attention.dense.weight", (h, heads_width), 1)
        if model.add_bias_linear:
            add(f"{theirs}.self_attention.linear_proj.bias", f"{ours}.attention.dense.bias", (h,), None)
        add(f"{theirs}.self_attention.linear_qkv.weight", f"{ours}.attention.query_key_value.weight", (qkv_rows, h), 0)
        if model.add_qkv_bias:
            add(f"{theirs}.self_attention.linear_qkv.bias", f"{ours}.attention.query_key_value.bias", (qkv_rows,), 0)
        if model.qk_layernorm:
            norm(f"{theirs}.self_attention.q_layernorm", f"{ours}.attention.q_layernorm", model.kv_channels)
            norm(f"{theirs}.self_attention.k_layernorm", f"{ours}.attention.k_layernorm", model.kv_channels)
        norm(f"{theirs}.pre_mlp_layernorm", f"{ours}.post_attention_layernorm", h)
        if model.moe_layers and model.moe_layers[layer]:  # the router; its experts are the expert optimizer's
            add(f"{theirs}.mlp.router.weight", f"{ours}.mlp.router.weight", (model.num_experts, h), None)
            if model.add_bias_linear:
                add(f"{theirs}.mlp.router.bias", f"{ours}.mlp.router.bias", (model.num_experts,), None)
            continue
        _mlp(params, model, model.ffn_hidden_size, f"{theirs}.mlp", f"{ours}.mlp", tp_rank, tp)
    if chunk.last:
        norm("decoder.final_layernorm", "final_layernorm", h)
        if not model.tied:
            add("output_layer.weight", "output_layer.weight", (model.padded_vocab_size, h), 0)
        elif pp > 1:  # the last stage's copy of the tied embedding (language_module.py: shared_embedding)
            params.append(LocalParameter("output_layer.weight", (model.padded_vocab_size // tp, h), (), True))
    if pp > 1 and chunk.first and model.tied:
        params[0] = LocalParameter(params[0].module_name, params[0].shape, params[0].pieces, True)
    return params


def local_expert_parameters(model: ModelShape, chunk: Chunk, ep_rank: int, ep: int) -> list[LocalParameter]:
    """One model chunk's routed-expert parameters on expert-parallel rank `ep_rank` (of `ep`) and expert TP rank
    `chunk.tp_rank` (of `chunk.tp`), in registration order: each MoE layer's local experts (SequentialMLP's
    local_experts.<j>: global expert ep_rank x experts per rank + j), fc1 then fc2. DDP keeps them in a buffer of
    their own, the expert DistributedOptimizer's."""
    params: list[LocalParameter] = []
    local_experts = model.num_experts // ep
    for local, layer in enumerate(chunk.layers(model.num_layers)):
        if not model.moe_layers[layer]:
            continue
        for j in range(local_experts):
            _mlp(params, model, model.moe_ffn_hidden_size, f"decoder.layers.{local}.mlp.experts.local_experts.{j}",
                 f"blocks.{layer}.mlp.experts.{ep_rank * local_experts + j}", chunk.tp_rank, chunk.tp)
    return params


def _mlp(params: list[LocalParameter], model: ModelShape, ffn: int, theirs: str, ours: str, tp_rank: int,
         tp: int) -> None:
    """An MLP of width `ffn`: fc1 (column-parallel), then fc2 (row-parallel: its columns split, its bias whole)."""
    h = model.hidden_size
    _fc1(params, model, ffn, f"{theirs}.linear_fc1", ours, tp_rank, tp)
    local = (h, ffn // tp)
    params.append(LocalParameter(f"{theirs}.linear_fc2.weight", local,
                                 (_split(f"{ours}.dense_4h_to_h.weight", local, 1, tp_rank, tp),)))
    if model.add_bias_linear:
        params.append(LocalParameter(f"{theirs}.linear_fc2.bias", (h,),
                                     (_split(f"{ours}.dense_4h_to_h.bias", (h,), None, tp_rank, tp),)))


def _fc1(params: list[LocalParameter], model: ModelShape, ffn: int, theirs: str, ours: str, tp_rank: int,
         tp: int) -> None:
    """fc1's weight (and bias): SwiGLU's TP-local rows are [this rank's gate rows; its up rows]."""
    rows = ffn // tp
    h = model.hidden_size
    kinds = [("weight", (h,))] + ([("bias", ())] if model.add_bias_linear else [])
    for kind, rest in kinds:
        if model.gated:
            pieces = tuple(LocalPiece(f"{ours}.{half}.{kind}", start, (rows, *rest), (tp_rank * rows, *[0] * len(rest)))
                           for start, half in ((0, "dense_h_to_4h_gate"), (rows, "dense_h_to_4h_up")))
            params.append(LocalParameter(f"{theirs}.{kind}", (2 * rows, *rest), pieces))
        else:
            params.append(LocalParameter(f"{theirs}.{kind}", (rows, *rest),
                                         (LocalPiece(f"{ours}.dense_h_to_4h.{kind}", 0, (rows, *rest),
                                                     (tp_rank * rows, *[0] * len(rest))),)))


@dataclass(frozen=True)
class BucketedParameter:
    parameter: LocalParameter
    bucket: int
    start: int  # in the bucket's flat tensor


def bucket_layout(params: list[LocalParameter], dp: int, bucket_size: Optional[int]
                  ) -> tuple[list[BucketedParameter], list[int]]:
    """Where each parameter's elements lie in the buckets (reverse order, 64-aligned, padded to lcm(DP, 128)), and each
    bucket's unpadded size."""
    placed: list[BucketedParameter] = []
    unpadded: list[int] = []
    bucket_start = start = 0
    in_bucket = 0

    def close(end: int) -> int:
        nonlocal bucket_start, in_bucket
        unpadded.append(end - bucket_start)
        padded = int(math.ceil(end / math.lcm(dp, BUCKET_ALIGNMENT)) * math.lcm(dp, BUCKET_ALIGNMENT))
        bucket_start, in_bucket = padded, 0
        return padded

    end = 0
    for param in reversed(params):
        start = int(math.ceil(start / PARAM_ALIGNMENT) * PARAM_ALIGNMENT)
        if param.shared_embedding and in_bucket:
            start = close(start)
        end = start + math.prod(param.shape)
        placed.append(BucketedParameter(param, len(unpadded), start - bucket_start))
        in_bucket += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or param.shared_embedding:
            start = close(end)
        else:
            start = end
    if in_bucket:
        close(end)
    return placed, unpadded


def buffer_dtypes(args) -> tuple[torch.dtype, torch.dtype]:
    """(parameter dtype, gradient dtype) of a dense model's gradient buffer, as DDP makes it from the args."""
    param = torch.bfloat16 if getattr(args, "bf16", False) else torch.float16 if getattr(args, "fp16", False) \
        else torch.float32
    return param, torch.float32 if getattr(args, "accumulate_allreduce_grads_in_fp32", False) else param


def buffer_key(dtypes: tuple[torch.dtype, torch.dtype]) -> str:
    """The dtype part of a bucket's key: `dtype_(torch.bfloat16, torch.float32)`."""
    return f"dtype_({dtypes[0]}, {dtypes[1]})"


def check_layout(unpadded: list[int], saved: object, buffer: int, buffers: int,
                 dtypes: tuple[torch.dtype, torch.dtype], where: str) -> None:
    """The rebuilt bucket sizes of gradient buffer `buffer` are the ones the checkpoint recorded."""
    try:
        if len(saved) != buffers:
            raise UnreadLayout(f"{where}: the distributed optimizer holds {len(saved)} gradient buffers, the layout "
                               f"rebuilt from its args {buffers} (one per virtual chunk, a dense model's): a layout "
                               f"this reader does not know")
        if list(saved[buffer]) != [dtypes]:
            raise UnreadLayout(f"{where}: the distributed optimizer's buffer holds {list(saved[buffer])} "
                               f"(parameter, gradient) dtypes, its args give {dtypes}: a layout this reader does not "
                               f"know")
        recorded = [int(n) for n in saved[buffer][dtypes]]
    except (TypeError, KeyError, IndexError, StopIteration, ValueError, AttributeError):
        raise CheckpointError(f"{where}: its recorded bucket sizes are unreadable ({str(saved)[:120]})") from None
    if recorded != unpadded:
        raise UnreadLayout(f"{where}: the distributed optimizer's buckets hold {recorded} elements, the layout "
                           f"rebuilt from its args {unpadded}: a layout this reader does not know (another "
                           f"parameter order, dtype or bucket size)")
