"""Megatron-Core's torch_dist keys and this project's parameter names: where each of our whole (TP 1) tensors lies
in the tensors Megatron-Core's sharded_state_dict saves.

Megatron-Core (megatron/core/transformer/transformer_block.py, sharded_state_dict) stacks the decoder's layers: a
layer's tensor is one index of `decoder.layers.<name>`, whose first axis runs over every layer of the model (global
numbers, so pipeline stages and virtual stages need nothing here), unless its layers differ (--moe-layer-freq, or
the singleton_local_shards metadata): then each is `decoder.layers.<global number>.<name>`. Its experts
(moe/experts.py: SequentialMLP, GroupedMLP and TEGroupedMLP save the same weights) add an axis over every expert
after the layers' (`mlp.experts.experts.<name>`: the MoE layer's `experts` module saves under its own `experts.`), or
`mlp.experts.experts.<expert>.<name>` per expert. Under torch_dist the local
spec's norms are saved under TransformerEngine's names (`self_attention.linear_qkv.layer_norm_weight` is the input
norm, `mlp.linear_fc1.layer_norm_weight` the pre-MLP norm; the spec's sharded_state_dict_keys_map), so both specs'
files read alike; the separate names are accepted too (a multi-latent layer of the local spec saves them so, and is
written so: MLA_LAYER_NAMES, MLA_WRITTEN_NORMS). Multi-token prediction layers are saved unstacked, each under
`mtp.layers.<k>.` (MTP_LAYERS), its transformer layer by a decoder layer's names.

Megatron-Core 0.19's HybridModel (models/hybrid: HybridStack.sharded_state_dict) gives each symbol of its
--hybrid-layer-pattern a layer of its own, always numbered in the key (`decoder.layers.<global layer>.<name>`, the
`|` separators not counted): a `*` layer holds the attention (`self_attention.*`, its input norm under TE's name
`self_attention.linear_qkv.layer_norm_weight`), a `-` or `E` layer the MLP or MoE (`mlp.*`, the dense MLP's norm
`mlp.linear_fc1.layer_norm_weight`, the MoE layer's `pre_mlp_layernorm.weight`), and the final norm is
`decoder.final_norm`; a `+` layer holds multi-latent attention (`self_attention.*` by MLA_LAYER_NAMES, its input
norm `input_layernorm.*`). Under a pattern of GPT blocks (`*-`, `*E`, `+-`, `+E`: gpt/hybrid_pattern.py) the k-th
mixer (`*` or `+`) and the k-th `-`/`E` are our block k's attention and MLP (Megatron-Core's own GPT retarget,
dist_checkpointing/gpt_checkpoint_interop.py, pairs them so); a name in a layer of the other kind is not ours. Its MTP depth d (after
a `/`) is `mtp.layers.<d>.`: enorm, hnorm, eh_proj and final_layernorm as ours under `mtp_layers.<d>.`, and the
MTP pattern's layers nested as `mtp_model_layer.layers.<g>.`, our MTP block's `transformer_layer`. A save here
under a pattern writes this layout by the same pairing turned round (hybrid_megatron_placement). An `M` layer holds
MambaMixer's `mixer.*` (MAMBA_LAYER_NAMES), a `G` layer GatedDeltaNet's `self_attention.*` (GDN_LAYER_NAMES; GPTModel's
layers under --experimental-attention-variant gated_delta_net too), each input norm fused into in_proj as TE's spec
saves it.

Megatron-Core's mixers save in_proj and conv1d split into parts (ssm/utils.py _split_tensor_factory: one key per
part, `<name>.<part>`, each whole over TP). Mamba's parts are ours one for one (gpt/mamba.py SplitParts); Gated
DeltaNet's in_proj is [q|k|v|z|beta|alpha] and its conv1d [q|k|v] there, each part in head order, where ours lie per
query/key head: a part's rows are every head's run of ours (Placement's `run` and `stride`, split_gdn_parts).

Our layouts are Megatron-Core's: the fused QKV is [group][its query heads, key, value][head dim] (gpt/model.py), a
linear's weight is [out, in]. SwiGLU's fc1 differs: Megatron-Core keeps [gate; up] in one weight, which its
sharded factory (transformer/mlp.py apply_swiglu_sharded_factory) saves as the two halves of one tensor of 2 x ffn
rows, every gate row first; ours are two weights, `dense_h_to_4h_gate` (the activated half, Megatron's first) and
`dense_h_to_4h_up`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from gpt.hybrid_pattern import pattern_blocks

LAYERS = "decoder.layers."
EXPERTS = "mlp.experts.experts."
# Megatron-Core's TopKRouter's persistent buffer under --moe-router-enable-expert-bias (checkpoint/router_state.py),
# inside a layer: `decoder.layers.mlp.router.expert_bias` [layers, experts], or per layer where layers differ
EXPERT_BIAS = "mlp.router.expert_bias"

# Outside the layers: Megatron-Core's key -> ours.
MODEL_NAMES = {
    "embedding.word_embeddings.weight": "word_embeddings.weight",
    "embedding.position_embeddings.weight": "position_embeddings.weight",
    "decoder.final_layernorm.weight": "final_layernorm.weight",
    "decoder.final_layernorm.bias": "final_layernorm.bias",
    "output_layer.weight": "output_layer.weight",
}
# Inside a layer (after `decoder.layers.[<layer>.]`): Megatron-Core's name -> ours (the first of each pair is how
# torch_dist saves it; the second the module's own name, which other specs and versions save).
LAYER_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "input_layernorm.weight": "input_layernorm.weight",
    "input_layernorm.bias": "input_layernorm.bias",
    "self_attention.linear_qkv.weight": "attention.query_key_value.weight",
    "self_attention.linear_qkv.bias": "attention.query_key_value.bias",
    "self_attention.linear_proj.weight": "attention.dense.weight",
    # --softmax-type learnable: DotProductAttention's (and TE's) per-head offsets [heads], split over TP by head
    "self_attention.core_attention.softmax_offset": "attention.softmax_offset",
    "self_attention.linear_proj.bias": "attention.dense.bias",
    "self_attention.q_layernorm.weight": "attention.q_layernorm.weight",
    "self_attention.q_layernorm.bias": "attention.q_layernorm.bias",
    "self_attention.k_layernorm.weight": "attention.k_layernorm.weight",
    "self_attention.k_layernorm.bias": "attention.k_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "post_attention_layernorm.bias",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "pre_mlp_layernorm.bias": "post_attention_layernorm.bias",
    "mlp.linear_fc1.weight": "mlp.dense_h_to_4h.weight",
    "mlp.linear_fc1.bias": "mlp.dense_h_to_4h.bias",
    "mlp.linear_fc2.weight": "mlp.dense_4h_to_h.weight",
    "mlp.linear_fc2.bias": "mlp.dense_4h_to_h.bias",
    "mlp.router.weight": "mlp.router.weight",
    "mlp.router.bias": "mlp.router.bias",  # Megatron's Router under --add-bias-linear (its default)
    "mlp.shared_experts.linear_fc1.weight": "mlp.shared_experts.dense_h_to_4h.weight",
    "mlp.shared_experts.linear_fc1.bias": "mlp.shared_experts.dense_h_to_4h.bias",
    "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.dense_4h_to_h.weight",
    "mlp.shared_experts.linear_fc2.bias": "mlp.shared_experts.dense_4h_to_h.bias",
    "mlp.shared_experts.gate_weight": "mlp.shared_experts.gate_weight",  # --moe-shared-expert-gate's [1, hidden]
}
# Multi-latent attention (Megatron-Core's MLASelfAttention, gpt/mla.py): the same names inside `self_attention.`
# but for linear_proj, whose our name is MLA's own. The local spec's latent norms are q_layernorm and kv_layernorm;
# TransformerEngine's spec fuses each into the up projection after it (TELayerNormColumnParallelLinear:
# `linear_q_up_proj.layer_norm_weight`, `linear_kv_up_proj.layer_norm_weight`), read alike. The layouts are ours:
# linear_q_(up_)proj's rows [head][qk_head_dim, qk_pos_emb_head_dim], linear_kv_down_proj's [kv_lora_rank,
# qk_pos_emb_head_dim], linear_kv_up_proj's [head][qk_head_dim, v_head_dim].
MLA_LAYER_NAMES = {
    **{f"self_attention.{linear}.weight": f"attention.{linear}.weight" for linear in (
        "linear_q_proj", "linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj",
        "linear_proj")},
    "self_attention.linear_proj.bias": "attention.linear_proj.bias",
    "self_attention.core_attention.softmax_offset": "attention.softmax_offset",
    **{f"self_attention.{norm}.{part}": f"attention.{norm}.{part}" for norm in ("q_layernorm", "kv_layernorm")
       for part in ("weight", "bias")},
    **{f"self_attention.linear_{latent}_up_proj.layer_norm_{part}": f"attention.{latent}_layernorm.{part}"
       for latent in ("q", "kv") for part in ("weight", "bias")},
}
EXPERT_NAMES = {  # inside `mlp.experts.experts.[<expert>.]`: -> ours inside `mlp.experts.<expert>.`
    "linear_fc1.weight": "dense_h_to_4h.weight",
    "linear_fc1.bias": "dense_h_to_4h.bias",
    "linear_fc2.weight": "dense_4h_to_h.weight",
    "linear_fc2.bias": "dense_4h_to_h.bias",
}
# Multi-token prediction (Megatron-Core's MultiTokenPredictionBlock, gpt/mtp.py): layer k's tensors are saved
# unstacked under `mtp.layers.<k>.`, its own norms and projection by their names, its transformer layer's under
# `transformer_layer.` by a decoder layer's names (LAYER_NAMES; MLA's with multi-latent attention)
MTP_LAYERS, OUR_MTP_LAYERS, MTP_TRANSFORMER = "mtp.layers.", "mtp_layers.", "transformer_layer."
MTP_OWN = tuple(f"{module}.{part}" for module in ("enorm", "hnorm", "final_layernorm") for part in ("weight", "bias")
                ) + ("eh_proj.weight",)
# An `M` layer (core_v0.19.0 ssm/mamba_mixer.py MambaMixer.sharded_state_dict under hybrid_layer_specs.py's
# mamba_layer: the layer's norm fused into in_proj, TELayerNormColumnParallelLinear) -> ours
MAMBA_PARTS = {"in_proj": ("z", "x", "B", "C", "dt"), "conv1d": ("x", "B", "C")}
MAMBA_LAYER_NAMES = {
    **{f"mixer.in_proj.layer_norm_{part}": f"input_layernorm.{part}" for part in ("weight", "bias")},
    **{f"mixer.in_proj.weight.{part}": f"attention.in_proj.{part}_weight" for part in MAMBA_PARTS["in_proj"]},
    **{f"mixer.conv1d.{kind}.{part}": f"attention.conv1d.{part}_{kind}" for kind in ("weight", "bias")
       for part in MAMBA_PARTS["conv1d"]},
    **{f"mixer.{name}": f"attention.{name}" for name in ("A_log", "D", "dt_bias", "norm.weight", "out_proj.weight")},
}
# A `G` layer, or a GPTModel layer of --experimental-attention-variant gated_delta_net (ssm/gated_delta_net/common.py
# _GDNBase.sharded_state_dict; its input norm fused into in_proj: hybrid_layer_specs.py gdn_layer, and
# experimental_attention_variant_module_specs.py's fuse_input_layernorm) -> ours; GDN_SPLITS' tensors in parts
GDN_LAYER_NAMES = {
    **{f"self_attention.in_proj.layer_norm_{part}": f"input_layernorm.{part}" for part in ("weight", "bias")},
    **{f"self_attention.{name}": f"attention.{name}" for name in (
        "dt_bias", "A_log", "out_norm.weight", "out_norm.bias", "out_proj.weight", "in_proj.weight", "conv1d.weight")},
}
GDN_SPLITS = {"self_attention.in_proj.weight": ("query", "key", "value", "z", "beta", "alpha"),
              "self_attention.conv1d.weight": ("query", "key", "value")}
GPT_LAYER_NAMES = {**LAYER_NAMES, **GDN_LAYER_NAMES}


@dataclass(frozen=True)
class GdnHeads:
    """A Gated DeltaNet layer's heads (the --linear-* sizes), which place its in_proj's and conv1d's rows."""
    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int

    @classmethod
    def of(cls, settings) -> "GdnHeads":
        """From our GatedDeltaNetSettings or Megatron-LM's args (the same field names)."""
        return cls(settings.linear_num_key_heads, settings.linear_key_head_dim, settings.linear_num_value_heads,
                   settings.linear_value_head_dim)

    def runs(self, parts: tuple[str, ...]) -> tuple[int, ...]:
        """Each part's rows per query/key head (a head's value heads' for value, z, beta and alpha)."""
        group = self.value_heads // self.key_heads
        sizes = {"query": self.key_dim, "key": self.key_dim, "value": group * self.value_dim,
                 "z": group * self.value_dim, "beta": group, "alpha": group}
        return tuple(sizes[part] for part in parts)


# HybridModel's (core_v0.19.0) outside its layers, where they differ from GPTModel's
HYBRID_MODEL_NAMES = {
    "decoder.final_norm.weight": "final_layernorm.weight",
    "decoder.final_norm.bias": "final_layernorm.bias",
}
# The names a hybrid layer of each symbol holds: attention's and multi-latent attention's `self_attention.` (and a
# separate input norm), Mamba's `mixer.`, Gated DeltaNet's `self_attention.` (norms fused into in_proj), the MLP's
# and MoE's `mlp.` (and a separate pre-MLP norm)
HYBRID_MIXERS, HYBRID_MLPS = ("*", "+", "M", "G"), ("-", "E")
HYBRID_LAYER_PREFIXES = {"*": ("self_attention.", "input_layernorm."), "+": ("self_attention.", "input_layernorm."),
                         "M": ("mixer.",), "G": ("self_attention.",),
                         "-": ("mlp.", "pre_mlp_layernorm."), "E": ("mlp.", "pre_mlp_layernorm.")}
# HybridModel's MTP depths (`mtp.layers.<d>.`, MTP_LAYERS): their own tensors (MTP_OWN), ours under
# `mtp_layers.<d>.` by the same names, and the nested stack of the MTP pattern's layers
MTP_INNER = "mtp_model_layer.layers."
GATED = "dense_h_to_4h"  # with SwiGLU: its rows are [gate; up], ours two tensors
GATED_HALVES = ("dense_h_to_4h_gate", "dense_h_to_4h_up")


@dataclass(frozen=True)
class Placement:
    """Where one of our whole tensors lies in a Megatron-Core tensor: at `index` of its leading (layer, expert)
    axes, rows `row_offset` on of the next axis, at our shape. With a `stride`, the tensor holds only some of our
    rows: its rows [h run, (h + 1) run) are ours [h stride + row_offset, ... + run) for each head h (a part of a
    Gated DeltaNet projection)."""
    key: str
    index: tuple[int, ...]
    row_offset: int
    shape: tuple[int, ...]
    run: int = 0
    stride: int = 0

    def region(self, ours: tuple[slice, ...]) -> tuple[slice, ...]:
        """Our region of the tensor as a region of Megatron-Core's (not for a strided placement: pieces)."""
        leading = tuple(slice(i, i + 1) for i in self.index)
        if not ours:
            return leading
        first = slice(ours[0].start + self.row_offset, ours[0].stop + self.row_offset)
        return (*leading, first, *ours[1:])

    def pieces(self, ours: tuple[slice, ...]) -> list[tuple[tuple[slice, ...], tuple]]:
        """The part of our region this tensor holds, as (its region in Megatron-Core's tensor, its index into our
        region); none where it holds no row of it. A strided placement's rows of a contiguous region of ours are
        contiguous in Megatron-Core's tensor (the heads' runs follow each other there), indexed by a row list."""
        within = tuple(slice(0, part.stop - part.start) for part in ours)
        if not self.stride:
            return [(self.region(ours), within)]
        first, theirs, rows = ours[0], [], []
        for head in range(first.start // self.stride, -(-first.stop // self.stride)):
            start = head * self.stride + self.row_offset
            low, high = max(first.start, start), min(first.stop, start + self.run)
            if low < high:
                theirs += [head * self.run + low - start, head * self.run + high - start]
                rows.append(torch.arange(low - first.start, high - first.start))
        if not rows:
            return []
        leading = tuple(slice(i, i + 1) for i in self.index)
        return [((*leading, slice(theirs[0], theirs[-1]), *ours[1:]), (torch.cat(rows), *within[1:]))]


def split_gdn_parts(placement: Placement, global_shape: tuple[int, ...], gdn: GdnHeads
                    ) -> list[tuple[Placement, tuple[int, ...]]]:
    """A Gated DeltaNet in_proj or conv1d placed whole (`<key>` under GDN_SPLITS) as Megatron-Core saves it: one
    tensor per part (`<key>.<part>`, the part's rows of every head in head order), each strided over ours; any
    other placement as it is."""
    base = next((split for split in GDN_SPLITS if placement.key.endswith(f".{split}")), None)
    if base is None:
        return [(placement, global_shape)]
    parts = GDN_SPLITS[base]
    runs, leading = gdn.runs(parts), len(placement.index)
    stride = sum(runs)
    return [(Placement(f"{placement.key}.{part}", placement.index, sum(runs[:at]), placement.shape, run, stride),
             (*global_shape[:leading], gdn.key_heads * run, *global_shape[leading + 1:]))
            for at, (part, run) in enumerate(zip(parts, runs))]


def hybrid_layer_symbols(pattern: str) -> str:
    """HybridModel's layer symbols in global layer order: the main pattern (before any `/`), `|` left out."""
    return pattern.split("/")[0].replace("|", "")


def _layer_blocks(symbols: str) -> list[int]:
    """Each HybridModel layer's block here (gpt/hybrid_pattern.py: a mixer pairs with the MLP right after it)."""
    return [block for block, part in enumerate(pattern_blocks(symbols)) for _ in part]


def hybrid_block(symbols: str, layer: int, name: str) -> Optional[int]:
    """Our block of HybridModel's global `layer` holding `name` (a mixer and the MLP right after it are one block, any
    other layer a block of its own); None where the layer is not one (another symbol, or a name of the other kind of
    layer)."""
    prefixes = HYBRID_LAYER_PREFIXES.get(symbols[layer]) if 0 <= layer < len(symbols) else None
    if prefixes is None or not name.startswith(prefixes):
        return None
    return _layer_blocks(symbols)[layer]


def our_placements(key: str, shape: tuple[int, ...], gated: bool, mla: bool = False,
                   hybrid_pattern: Optional[str] = None, gdn: Optional[GdnHeads] = None
                   ) -> Optional[dict[str, Placement]]:
    """Our tensors inside Megatron-Core's tensor `key` of global `shape` (None: a key this mapping does not know).
    `gated`: the model is SwiGLU's (fc1 holds [gate; up]); `mla`: its attention is multi-latent (MLA_LAYER_NAMES).
    `hybrid_pattern`: the checkpoint is HybridModel's, of this --hybrid-layer-pattern (its layers numbered per
    symbol, module docstring; a `+` layer's attention is multi-latent, a `*` layer's not, whatever `mla` says).
    `gdn`: the Gated DeltaNet layers' heads, which place the parts of their in_proj and conv1d (GDN_SPLITS)."""
    if key in MODEL_NAMES:
        return {MODEL_NAMES[key]: Placement(key, (), 0, tuple(shape))}
    if hybrid_pattern is not None and key in HYBRID_MODEL_NAMES:
        return {HYBRID_MODEL_NAMES[key]: Placement(key, (), 0, tuple(shape))}
    if hybrid_pattern is not None and key.startswith(MTP_LAYERS):
        return _hybrid_mtp_placements(key, shape, gated, hybrid_pattern, gdn)
    if key.startswith(MTP_LAYERS):
        return _mtp_placements(key, tuple(shape), gated, mla, gdn)
    if not key.startswith(LAYERS):
        return None
    parts = key[len(LAYERS):].split(".")
    layer_axis = not parts[0].isdigit()  # stacked layers: the first axis; else the layer is in the key
    layers = None if layer_axis else [int(parts.pop(0))]
    name = ".".join(parts)
    prefix, symbol = {}, None  # HybridModel: its layer -> our block's prefix, and the layer's symbol
    if hybrid_pattern is not None:
        if layer_axis:
            return None
        symbols = hybrid_layer_symbols(hybrid_pattern)
        block = hybrid_block(symbols, layers[0], name)
        if block is None:
            return None
        prefix[layers[0]], mla, symbol = f"blocks.{block}.", symbols[layers[0]] == "+", symbols[layers[0]]
    return _layer_placements(key, shape, gated, name, layers, prefix, mla, symbol, gdn)


def _hybrid_mtp_placements(key: str, shape: tuple[int, ...], gated: bool, hybrid_pattern: str,
                           gdn: Optional[GdnHeads] = None) -> Optional[dict[str, Placement]]:
    """HybridModel's MTP depth d (`mtp.layers.<d>.`): its own norms and projection are ours under `mtp_layers.<d>.`,
    its inner layers (`mtp_model_layer.layers.<g>.`, one per symbol of the MTP pattern) our MTP block's
    `transformer_layer` (module docstring)."""
    depth, _, rest = key[len(MTP_LAYERS):].partition(".")
    mtp_parts = hybrid_pattern.split("/")[1:]
    if not depth.isdigit() or int(depth) >= len(mtp_parts):
        return None
    if rest in MTP_OWN:
        return {f"mtp_layers.{depth}.{rest}": Placement(key, (), 0, tuple(shape))}
    if not rest.startswith(MTP_INNER):
        return None
    layer, _, name = rest[len(MTP_INNER):].partition(".")
    if not layer.isdigit() or hybrid_block(mtp_parts[int(depth)], int(layer), name) != 0:
        return None  # one block per MTP depth (gpt/hybrid_pattern.py)
    symbol = mtp_parts[int(depth)][int(layer)]
    return _layer_placements(key, shape, gated, name, [int(layer)],
                             {int(layer): f"mtp_layers.{depth}.transformer_layer."}, symbol == "+", symbol, gdn)


def _layer_names(symbol: Optional[str]) -> dict[str, str]:
    """A layer's names by HybridModel's symbol (None: a GPTModel layer, attention or Gated DeltaNet)."""
    return {"M": MAMBA_LAYER_NAMES, "G": GDN_LAYER_NAMES, None: GPT_LAYER_NAMES}.get(symbol, LAYER_NAMES)


def _layer_placements(key: str, shape: tuple[int, ...], gated: bool, name: str, layers, prefix: dict, mla: bool,
                      symbol: Optional[str] = None, gdn: Optional[GdnHeads] = None) -> Optional[dict[str, Placement]]:
    """Our tensors in a layer's tensor `name` (`layers` None: stacked on the first axis); `prefix`: our name's start
    for a layer, `blocks.<layer>.` where it names none; `mla`: the attention is multi-latent (MLA_LAYER_NAMES);
    `symbol`: HybridModel's layer kind (_layer_names); `gdn`: the heads placing a Gated DeltaNet part (GDN_SPLITS)."""
    expert_axis, experts = False, [None]
    layer_axis = layers is None
    base, _, part = name.rpartition(".")
    if base in GDN_SPLITS and symbol in ("G", None):
        parts = GDN_SPLITS[base]
        if gdn is None or part not in parts:
            return None
        runs, at = gdn.runs(parts), parts.index(part)
        leading, stride = int(layer_axis), sum(runs)
        own = (shape[leading] // runs[at] * stride, *shape[leading + 1:])
        return {prefix.get(layer, f"blocks.{layer}.") + _layer_names(symbol)[base]: Placement(
            key, (layer,) if layer_axis else (), sum(runs[:at]), own, runs[at], stride)
            for layer in (range(shape[0]) if layer_axis else layers)}
    if name.startswith(EXPERTS):
        inner = name[len(EXPERTS):].split(".")
        expert_axis = not inner[0].isdigit()
        experts = None if expert_axis else [int(inner.pop(0))]
        template = EXPERT_NAMES.get(".".join(inner))
        template = template and "mlp.experts.{expert}." + template
    else:
        template = (mla and MLA_LAYER_NAMES.get(name)) or _layer_names(symbol).get(name)
    if template is None:
        return None
    leading = int(layer_axis) + int(expert_axis)
    own = tuple(shape[leading:])
    layers = range(shape[0]) if layer_axis else layers
    experts = range(shape[leading - 1]) if expert_axis else experts
    placements = {}
    for layer in layers:
        for expert in experts:
            index = (*((layer,) if layer_axis else ()), *((expert,) if expert_axis else ()))
            ours = prefix.get(layer, f"blocks.{layer}.") + template.format(expert=expert)
            if gated and f".{GATED}." in ours:
                half = own[0] // 2
                for offset, part in zip((0, half), GATED_HALVES):
                    placements[ours.replace(f".{GATED}.", f".{part}.")] = Placement(key, index, offset,
                                                                                    (half, *own[1:]))
            else:
                placements[ours] = Placement(key, index, 0, own)
    return placements


def _mtp_placements(key: str, shape: tuple[int, ...], gated: bool, mla: bool, gdn: Optional[GdnHeads] = None
                    ) -> Optional[dict[str, Placement]]:
    """An MTP layer's tensor (MTP_LAYERS): ours of the same name under `mtp_layers.<k>.`, no leading axis."""
    layer, _, name = key[len(MTP_LAYERS):].partition(".")
    if not layer.isdigit():
        return None
    if name in MTP_OWN:
        return {f"{OUR_MTP_LAYERS}{layer}.{name}": Placement(key, (), 0, shape)}
    if not name.startswith(MTP_TRANSFORMER):
        return None
    # its transformer layer as one decoder layer of its own key: an MoE model's (the last decoder layer's kind, as
    # Megatron-Core's gpt_builders builds it) holds SequentialMLP's experts [experts, ...] and the router's
    return _layer_placements(key, shape, gated, name[len(MTP_TRANSFORMER):], [0],
                             {0: f"{OUR_MTP_LAYERS}{layer}.{MTP_TRANSFORMER}"}, mla, None, gdn)


# Our names -> Megatron-Core's, for writing: the first name LAYER_NAMES gives each of ours is the one torch_dist saves
OUR_TOP_NAMES = {ours: theirs for theirs, ours in MODEL_NAMES.items()}
OUR_LAYER_NAMES: dict[str, str] = {}
for _theirs, _ours in (*LAYER_NAMES.items(), *MLA_LAYER_NAMES.items()):
    OUR_LAYER_NAMES.setdefault(_ours, _theirs)
# A multi-latent layer of the local spec (gpt_layer_specs.py get_gpt_layer_local_spec) has no
# sharded_state_dict_keys_map: its norms are saved under their modules' own names, which Megatron-LM's load asks for
MLA_WRITTEN_NORMS = {f"{ours}.{part}": f"{theirs}.{part}" for ours, theirs in (
    ("input_layernorm", "input_layernorm"), ("post_attention_layernorm", "pre_mlp_layernorm"))
    for part in ("weight", "bias")}
OUR_EXPERT_NAMES = {ours: theirs for theirs, ours in EXPERT_NAMES.items()}
# an `M` layer's and a Gated DeltaNet layer's (its in_proj and conv1d whole: split_gdn_parts splits them)
OUR_MAMBA_NAMES = {ours: theirs for theirs, ours in MAMBA_LAYER_NAMES.items()}
OUR_GDN_NAMES = {ours: theirs for theirs, ours in GDN_LAYER_NAMES.items()}
# An MoE layer's pre-MLP norm is written under both names Megatron-Core loads it by: the local GPT spec's (its keys
# map saves it as fc1's fused norm, what Megatron-LM's --transformer-impl local loads) and the module's own,
# `pre_mlp_layernorm.*` (TransformerEngine's GPT spec, and HybridModel's MoE layer, which Megatron-Core 0.19's
# GPT retarget looks for: without it its pretrain_hybrid.py fails "decoder.layers.pre_mlp_layernorm.weight from
# model not in state dict", as on Megatron-LM 0.16.1's own local-spec MoE saves). A load reads the names its model
# asks and leaves the other (Megatron-LM's default dist_ckpt_strictness, assume_ok_unexpected).
MOE_NORM_ALIASES = {LAYERS + "mlp.linear_fc1.layer_norm_weight": LAYERS + "pre_mlp_layernorm.weight",
                    LAYERS + "mlp.linear_fc1.layer_norm_bias": LAYERS + "pre_mlp_layernorm.bias"}
OUR_EXPERTS = "mlp.experts."


def megatron_placement(name: str, shape: tuple[int, ...], num_layers: int, num_experts: Optional[int] = None,
                       per_layer: bool = False, mla: bool = False, gdn_layers: frozenset[int] = frozenset()
                       ) -> Optional[tuple[Placement, tuple[int, ...]]]:
    """Where our whole tensor `name` (of `shape`) goes in Megatron-Core's layout, and that tensor's global shape;
    None for a name this mapping does not write (a layer of another kind). Stacked over the layers, or under each
    layer's own key where they differ (`per_layer`: Megatron-Core's non_homogeneous_layers, which an --moe-layer-freq
    list or above 1 sets). An expert's tensor (of an MoE layer of `num_experts`) goes at its expert of
    `mlp.experts.experts.<name>` (after the layer's index where stacked), the layout SequentialMLP saves. `mla`: the
    model's attention is multi-latent (its layers' norms by MLA_WRITTEN_NORMS); `gdn_layers`: the layers whose mixer
    is Gated DeltaNet (--experimental-attention-variant gated_delta_net: GDN_LAYER_NAMES, its parts whole)."""
    if name in OUR_TOP_NAMES:
        return Placement(OUR_TOP_NAMES[name], (), 0, tuple(shape)), tuple(shape)
    head, _, inner = name.partition(".")
    layer, _, inner = inner.partition(".")
    if head not in ("blocks", OUR_MTP_LAYERS[:-1]) or not layer.isdigit():
        return None
    row_offset, own = 0, tuple(shape)
    for index, half in enumerate(GATED_HALVES):
        if f".{half}." in f".{inner}":
            inner = inner.replace(half, GATED)
            row_offset, own = index * shape[0], (2 * shape[0], *shape[1:])
    if head != "blocks":  # an MTP layer's (_mtp_placements): unstacked
        if inner in MTP_OWN:
            return Placement(f"{MTP_LAYERS}{layer}.{inner}", (), 0, tuple(shape)), tuple(shape)
        if not inner.startswith(MTP_TRANSFORMER):
            return None
        inner = inner[len(MTP_TRANSFORMER):]
        if inner.startswith(OUR_EXPERTS) and num_experts:  # an MoE model's MTP layer: its experts, one key
            expert, _, inner = inner[len(OUR_EXPERTS):].partition(".")
            theirs = OUR_EXPERT_NAMES.get(inner)
            if theirs is None or not expert.isdigit():
                return None
            return (Placement(f"{MTP_LAYERS}{layer}.{MTP_TRANSFORMER}{EXPERTS}{theirs}", (int(expert),), row_offset,
                              tuple(shape)), (num_experts, *own))
        theirs = (mla and MLA_WRITTEN_NORMS.get(inner)) or OUR_LAYER_NAMES.get(inner)
        return None if theirs is None else (
            Placement(f"{MTP_LAYERS}{layer}.{MTP_TRANSFORMER}{theirs}", (), row_offset, tuple(shape)), own)
    if inner.startswith(OUR_EXPERTS) and num_experts:
        expert, _, inner = inner[len(OUR_EXPERTS):].partition(".")
        theirs = OUR_EXPERT_NAMES.get(inner)
        if theirs is None or not expert.isdigit():
            return None
        if per_layer:
            return (Placement(f"{LAYERS}{layer}.{EXPERTS}{theirs}", (int(expert),), row_offset, tuple(shape)),
                    (num_experts, *own))
        return (Placement(LAYERS + EXPERTS + theirs, (int(layer), int(expert)), row_offset, tuple(shape)),
                (num_layers, num_experts, *own))
    theirs = (int(layer) in gdn_layers and OUR_GDN_NAMES.get(inner)) or (mla and MLA_WRITTEN_NORMS.get(inner)) \
        or OUR_LAYER_NAMES.get(inner)
    if theirs is None:
        return None
    if per_layer:
        return Placement(f"{LAYERS}{layer}.{theirs}", (), row_offset, tuple(shape)), own
    return Placement(LAYERS + theirs, (int(layer),), row_offset, tuple(shape)), (num_layers, *own)


# HybridModel's own layout, for writing (a run with --hybrid-layer-pattern): the reader's pairing (hybrid_block)
# turned round, so what is written is what our_placements reads back
OUR_HYBRID_TOP_NAMES = {**OUR_TOP_NAMES, **{ours: theirs for theirs, ours in HYBRID_MODEL_NAMES.items()}}
# an MoE layer's pre-MLP norm is the module's own (`pre_mlp_layernorm.*`); a dense MLP's is fc1's fused norm
HYBRID_MOE_NORMS = {f"post_attention_layernorm.{part}": f"pre_mlp_layernorm.{part}" for part in ("weight", "bias")}
# a `+` layer's names (HybridModel's mla_layer: MLASelfAttention's linears, and its input norm a TENorm of its own,
# `input_layernorm.*`); its latent norms under the local GPT spec's names (HybridModel's MLA builds none: such a
# model's save is said at start-up to be this project's format, arguments/config.py)
OUR_HYBRID_MLA_NAMES = {f"input_layernorm.{part}": f"input_layernorm.{part}" for part in ("weight", "bias")}
for _theirs, _ours in MLA_LAYER_NAMES.items():
    OUR_HYBRID_MLA_NAMES.setdefault(_ours, _theirs)


def hybrid_layer(symbols: str, block: int, attention: bool) -> Optional[int]:
    """HybridModel's global layer of our block `block`'s mixer (`attention`) or MLP (hybrid_block's inverse); None
    where the block has none (an `M` or `G` block without an MLP, a lone `-`)."""
    kinds = HYBRID_MIXERS if attention else HYBRID_MLPS
    return next((layer for layer, (symbol, at) in enumerate(zip(symbols, _layer_blocks(symbols)))
                 if at == block and symbol in kinds), None)


# our names in a layer of each mixer symbol (a `*` layer's: OUR_LAYER_NAMES)
OUR_HYBRID_MIXER_NAMES = {"+": OUR_HYBRID_MLA_NAMES, "M": OUR_MAMBA_NAMES, "G": OUR_GDN_NAMES}


def hybrid_megatron_placement(name: str, shape: tuple[int, ...], pattern: str, num_experts: Optional[int] = None
                              ) -> Optional[tuple[Placement, tuple[int, ...]]]:
    """Where our whole tensor `name` goes in HybridModel's layout under --hybrid-layer-pattern `pattern` (module
    docstring), and that tensor's global shape: each layer under its own key (`decoder.layers.<global layer>.`), its
    experts stacked over the expert axis (`mlp.experts.experts.<name>`, SequentialMLP's), an MTP depth's nested
    layers under `mtp.layers.<d>.mtp_model_layer.layers.<layer of the MTP pattern>.`; None for a name this layout has
    no place for."""
    if name in OUR_HYBRID_TOP_NAMES:
        return Placement(OUR_HYBRID_TOP_NAMES[name], (), 0, tuple(shape)), tuple(shape)
    head, _, inner = name.partition(".")
    index, _, inner = inner.partition(".")
    if head not in ("blocks", OUR_MTP_LAYERS[:-1]) or not index.isdigit():
        return None
    row_offset, own = 0, tuple(shape)
    for at, half in enumerate(GATED_HALVES):
        if f".{half}." in f".{inner}":
            inner = inner.replace(half, GATED)
            row_offset, own = at * shape[0], (2 * shape[0], *shape[1:])
    mtp_parts = pattern.split("/")[1:]
    if head == "blocks":
        symbols, block, stem = hybrid_layer_symbols(pattern), int(index), LAYERS
    else:
        if int(index) >= len(mtp_parts):
            return None
        if inner in MTP_OWN:
            return Placement(f"{MTP_LAYERS}{index}.{inner}", (), 0, tuple(shape)), tuple(shape)
        if not inner.startswith(MTP_TRANSFORMER):
            return None
        symbols, block, stem = mtp_parts[int(index)], 0, f"{MTP_LAYERS}{index}.{MTP_INNER}"
        inner = inner[len(MTP_TRANSFORMER):]
    if inner.startswith(OUR_EXPERTS):
        expert, _, rest = inner[len(OUR_EXPERTS):].partition(".")
        theirs = OUR_EXPERT_NAMES.get(rest)
        if theirs is None or not expert.isdigit() or not num_experts:
            return None
        layer = hybrid_layer(symbols, block, attention=False)
        if layer is None:
            return None
        return (Placement(f"{stem}{layer}.{EXPERTS}{theirs}", (int(expert),), row_offset, tuple(shape)),
                (num_experts, *own))
    attention = inner.startswith(("attention.", "input_layernorm."))  # the mixer's, else the MLP's
    layer = hybrid_layer(symbols, block, attention)
    if layer is None:
        return None
    theirs = OUR_HYBRID_MIXER_NAMES.get(symbols[layer], OUR_LAYER_NAMES).get(inner)
    if theirs is None:
        return None
    if symbols[layer] == "E":
        theirs = HYBRID_MOE_NORMS.get(inner, theirs)
    return Placement(f"{stem}{layer}.{theirs}", (), row_offset, tuple(shape)), own
