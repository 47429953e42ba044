"""Where each of our whole (TP 1) tensors lies in the tensors Megatron-Core's torch_dist checkpoints save, by its keys:
decoder layers stacked on a first axis (or one key per layer where layers differ), experts on the next, HybridModel's
layers one key each by pattern symbol. Layouts match ours except SwiGLU's fc1, which Megatron-Core saves as one [gate;
up] tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from gpt.hybrid_pattern import pattern_blocks

LAYERS = "decoder.layers."
EXPERTS = "mlp.experts.experts."
# TopKRouter's expert-bias buffer, [layers, experts] when stacked.
EXPERT_BIAS = "mlp.router.expert_bias"

# Outside the layers: Megatron-Core's key -> ours.
MODEL_NAMES = {
    "embedding.word_embeddings.weight": "word_embeddings.weight",
    "embedding.position_embeddings.weight": "position_embeddings.weight",
    "decoder.final_layernorm.weight": "final_layernorm.weight",
    "decoder.final_layernorm.bias": "final_layernorm.bias",
    "output_layer.weight": "output_layer.weight",
}
# Inside a layer: Megatron-Core's name -> ours; the first of each pair is torch_dist's (TE names for the local spec's
# norms), the second the module's own.
LAYER_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "input_layernorm.weight": "input_layernorm.weight",
    "input_layernorm.bias": "input_layernorm.bias",
    "self_attention.linear_qkv.weight": "attention.query_key_value.weight",
    "self_attention.linear_qkv.bias": "attention.query_key_value.bias",
    "self_attention.linear_proj.weight": "attention.dense.weight",
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
# Multi-latent attention inside `self_attention.`; TE's spec fuses the latent norms into the up projections.
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
# Multi-token prediction layers, unstacked under `mtp.layers.<k>.`; the transformer layer by a decoder layer's names.
MTP_LAYERS, OUR_MTP_LAYERS, MTP_TRANSFORMER = "mtp.layers.", "mtp_layers.", "transformer_layer."
MTP_OWN = tuple(f"{module}.{part}" for module in ("enorm", "hnorm", "final_layernorm") for part in ("weight", "bias")
                ) + ("eh_proj.weight",)
# An `M` layer (MambaMixer; its norm fused into in_proj) -> ours; in_proj and conv1d saved in parts.
MAMBA_PARTS = {"in_proj": ("z", "x", "B", "C", "dt"), "conv1d": ("x", "B", "C")}
MAMBA_LAYER_NAMES = {
    **{f"mixer.in_proj.layer_norm_{part}": f"input_layernorm.{part}" for part in ("weight", "bias")},
    **{f"mixer.in_proj.weight.{part}": f"attention.in_proj.{part}_weight" for part in MAMBA_PARTS["in_proj"]},
    **{f"mixer.conv1d.{kind}.{part}": f"attention.conv1d.{part}_{kind}" for kind in ("weight", "bias")
       for part in MAMBA_PARTS["conv1d"]},
    **{f"mixer.{name}": f"attention.{name}" for name in ("A_log", "D", "dt_bias", "norm.weight", "out_proj.weight")},
}
# A `G` layer or a GPTModel gated_delta_net layer (input norm fused into in_proj) -> ours; GDN_SPLITS saved in parts.
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


HYBRID_MODEL_NAMES = {
    "decoder.final_norm.weight": "final_layernorm.weight",
    "decoder.final_norm.bias": "final_layernorm.bias",
}
HYBRID_MIXERS, HYBRID_MLPS = ("*", "+", "M", "G"), ("-", "E")
HYBRID_LAYER_PREFIXES = {"*": ("self_attention.", "input_layernorm."), "+": ("self_attention.", "input_layernorm."),
                         "M": ("mixer.",), "G": ("self_attention.",),
                         "-": ("mlp.", "pre_mlp_layernorm."), "E": ("mlp.", "pre_mlp_layernorm.")}
MTP_INNER = "mtp_model_layer.layers."
GATED = "dense_h_to_4h"  # with SwiGLU: its rows are [gate; up], ours two tensors
GATED_HALVES = ("dense_h_to_4h_gate", "dense_h_to_4h_up")


@dataclass(frozen=True)
class Placement:
    """Where one of our whole tensors lies in a Megatron-Core tensor: at `index` of its leading (layer, expert) axes,
    from row `row_offset`. With a `stride` it holds rows [h run, (h + 1) run) of ours from h stride + row_offset, per
    head h."""
    key: str
    index: tuple[int, ...]
    row_offset: int
    shape: tuple[int, ...]
    run: int = 0
    stride: int = 0

    def region(self, ours: tuple[slice, ...]) -> tuple[slice, ...]:
        """Our region as a region of Megatron-Core's tensor (not for a strided placement)."""
        leading = tuple(slice(i, i + 1) for i in self.index)
        if not ours:
            return leading
        first = slice(ours[0].start + self.row_offset, ours[0].stop + self.row_offset)
        return (*leading, first, *ours[1:])

    def pieces(self, ours: tuple[slice, ...]) -> list[tuple[tuple[slice, ...], tuple]]:
        """The part of our region this tensor holds, as (its region in Megatron-Core's tensor, its index into ours)."""
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
    """A Gated DeltaNet in_proj or conv1d placed whole, split into Megatron-Core's per-part tensors (`<key>.<part>`);
    any other placement as it is."""
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
    """Our block of HybridModel's global `layer` holding `name` (a mixer and the MLP after it are one block); None where
    the layer is not one."""
    prefixes = HYBRID_LAYER_PREFIXES.get(symbols[layer]) if 0 <= layer < len(symbols) else None
    if prefixes is None or not name.startswith(prefixes):
        return None
    return _layer_blocks(symbols)[layer]


def our_placements(key: str, shape: tuple[int, ...], gated: bool, mla: bool = False,
                   hybrid_pattern: Optional[str] = None, gdn: Optional[GdnHeads] = None
                   ) -> Optional[dict[str, Placement]]:
    """Our tensors inside Megatron-Core's tensor `key` of global `shape`; None for an unknown key. `gated`: SwiGLU;
    `mla`: multi-latent attention; `hybrid_pattern`: a HybridModel checkpoint; `gdn`: the Gated DeltaNet heads."""
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
    """HybridModel's MTP depth d: its own tensors ours under `mtp_layers.<d>.`, its inner layers our MTP block's
    `transformer_layer`."""
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
    """Our tensors in a layer's tensor `name` (`layers` None: stacked on the first axis; `prefix`: our name's start per
    layer)."""
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
    # An MoE model's MTP transformer layer has SequentialMLP's experts, like its last decoder layer.
    return _layer_placements(key, shape, gated, name[len(MTP_TRANSFORMER):], [0],
                             {0: f"{OUR_MTP_LAYERS}{layer}.{MTP_TRANSFORMER}"}, mla, None, gdn)


# Our names -> Megatron-Core's, for writing: the first name LAYER_NAMES gives each of ours.
OUR_TOP_NAMES = {ours: theirs for theirs, ours in MODEL_NAMES.items()}
OUR_LAYER_NAMES: dict[str, str] = {}
for _theirs, _ours in (*LAYER_NAMES.items(), *MLA_LAYER_NAMES.items()):
    OUR_LAYER_NAMES.setdefault(_ours, _theirs)
# The local spec's MLA layer has no keys map: its norms go under their modules' own names.
MLA_WRITTEN_NORMS = {f"{ours}.{part}": f"{theirs}.{part}" for ours, theirs in (
    ("input_layernorm", "input_layernorm"), ("post_attention_layernorm", "pre_mlp_layernorm"))
    for part in ("weight", "bias")}
OUR_EXPERT_NAMES = {ours: theirs for theirs, ours in EXPERT_NAMES.items()}
OUR_MAMBA_NAMES = {ours: theirs for theirs, ours in MAMBA_LAYER_NAMES.items()}
OUR_GDN_NAMES = {ours: theirs for theirs, ours in GDN_LAYER_NAMES.items()}
# An MoE pre-MLP norm is written under both names Megatron-Core loads it by (the local spec's fused fc1 norm and
# `pre_mlp_layernorm.*`); a load reads the one it asks for and ignores the other.
MOE_NORM_ALIASES = {LAYERS + "mlp.linear_fc1.layer_norm_weight": LAYERS + "pre_mlp_layernorm.weight",
                    LAYERS + "mlp.linear_fc1.layer_norm_bias": LAYERS + "pre_mlp_layernorm.bias"}
OUR_EXPERTS = "mlp.experts."


def megatron_placement(name: str, shape: tuple[int, ...], num_layers: int, num_experts: Optional[int] = None,
                       per_layer: bool = False, mla: bool = False, gdn_layers: frozenset[int] = frozenset()
                       ) -> Optional[tuple[Placement, tuple[int, ...]]]:
    """Where our whole tensor `name` goes in Megatron-Core's GPTModel layout, with that tensor's global shape; None for
    a name not written. `per_layer`: one key per layer; `mla`, `gdn_layers`: the layers' kinds."""
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


# HybridModel's layout for writing: the reader's pairing turned round.
OUR_HYBRID_TOP_NAMES = {**OUR_TOP_NAMES, **{ours: theirs for theirs, ours in HYBRID_MODEL_NAMES.items()}}
HYBRID_MOE_NORMS = {f"post_attention_layernorm.{part}": f"pre_mlp_layernorm.{part}" for part in ("weight", "bias")}
# A `+` layer's names: MLA's linears and its own input norm.
OUR_HYBRID_MLA_NAMES = {f"input_layernorm.{part}": f"input_layernorm.{part}" for part in ("weight", "bias")}
for _theirs, _ours in MLA_LAYER_NAMES.items():
    OUR_HYBRID_MLA_NAMES.setdefault(_ours, _theirs)


def hybrid_layer(symbols: str, block: int, attention: bool) -> Optional[int]:
    """HybridModel's global layer of our block's mixer (`attention`) or MLP; None where the block has none."""
    kinds = HYBRID_MIXERS if attention else HYBRID_MLPS
    return next((layer for layer, (symbol, at) in enumerate(zip(symbols, _layer_blocks(symbols)))
                 if at == block and symbol in kinds), None)


OUR_HYBRID_MIXER_NAMES = {"+": OUR_HYBRID_MLA_NAMES, "M": OUR_MAMBA_NAMES, "G": OUR_GDN_NAMES}


def hybrid_megatron_placement(name: str, shape: tuple[int, ...], pattern: str, num_experts: Optional[int] = None
                              ) -> Optional[tuple[Placement, tuple[int, ...]]]:
    """Where our whole tensor `name` goes in HybridModel's layout under `pattern`, with that tensor's global shape: one
    key per layer, experts stacked; None where it has no place."""
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
