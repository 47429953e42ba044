"""Which family's mapping takes tensors under transformers' names to ours, chosen in one place for --init-from-hf and
DeepSpeed folders of a transformers model. A mapping is the family's own: name pass, shapes from its own export, and a
conversion that only moves rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from arguments.config import ModelConfig
from arguments.hf_config import registered_family
from checkpoint.hf import folders as hf
from checkpoint.hf.config_check import check_llama_hf_config
from families.common import dense_weights as hf_dense
from families.common import llama_shaped as hf_llama
from families.common.layout import canonical_names, tensor_shapes
from families.registry import dense_families, family_weights, llama_families

GPT2_TYPE = "gpt2"
# The Llama-shaped model types (Apertus is read whole: not here).
LLAMA_TYPES = (hf_llama.MODEL_TYPE, *hf_llama.MOE_TYPES)


@dataclass(frozen=True)
class HFMapping:
    """One family's mapping for one model; shapes are built when asked, on a meta model."""
    model_type: str
    canonical: Callable[[dict], dict]
    shapes_of: Callable[[], dict[str, tuple[int, ...]]]
    convert: Callable[[dict], dict]
    shift: Callable[[str, torch.Tensor], torch.Tensor]
    check_config: Callable
    embedding: str = "model.embed_tokens.weight"
    tied: bool = True
    transposed: frozenset = frozenset()

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return self.shapes_of()


def hf_mapping(model_type: str, model: ModelConfig, padded_vocab: int) -> HFMapping:
    """The mapping of `model_type`'s family for `model` (vocabulary padded to `padded_vocab`); unclaimed types are
    GPT-2's."""
    moe, family = family_weights().get(model_type), registered_family(model_type)
    tied = not model.output.untie_embeddings_and_output_weights

    def shift(name: str, values: torch.Tensor) -> torch.Tensor:
        return hf.shifted_gains({name: values}, model, family or moe, -1)[name]
    if moe is not None:
        return HFMapping(model_type, lambda tensors: canonical_names(tensors, model.num_layers),
                         lambda: tensor_shapes(moe, model), lambda ids: moe.from_hf(ids, model, padded_vocab), shift,
                         check_llama_hf_config, tied=tied)
    if family is not None:
        return HFMapping(model_type, lambda tensors: hf_dense.canonical_names(tensors, family),
                         lambda: hf_dense.tensor_shapes(model, family),
                         lambda ids: hf_dense.from_hf(ids, model, padded_vocab, family), shift, check_llama_hf_config,
                         tied=tied)
    if model_type in LLAMA_TYPES:
        return HFMapping(model_type, lambda tensors: hf_llama.canonical_names(tensors, model_type),
                         lambda: hf_llama.llama_tensor_shapes(model, model_type),
                         lambda ids: hf_llama.from_llama_state_dict(ids, model, padded_vocab, model_type), shift,
                         check_llama_hf_config, tied=tied)
    transposed = frozenset(theirs for _, theirs, how in hf.name_table(model) if how in ("qkv_weight", "linear"))
    return HFMapping(GPT2_TYPE, hf.gpt2_lm_head_names, lambda: hf.hf_tensor_shapes(model),
                     lambda ids: hf.from_hf_state_dict(ids, model, padded_vocab), shift, hf.check_hf_config,
                     embedding="transformer.wte.weight", tied=True, transposed=transposed)


def model_types_for(model: ModelConfig) -> list[str]:
    """The model_types whose names may hold `model`: the one the export writes first, then every dense family it fits.
    """
    others = [dense.model_type for dense in dense_families().values() if not dense.misfits(model)]
    return list(dict.fromkeys([hf.model_type_of(model), *others]))


def read_whole_because(model_type: str) -> Optional[str]:
    """Why `model_type`'s conversion is more than moving rows (GPT-OSS's interleaved experts, Apertus's xIELU buffers);
    None where it only moves rows."""
    moe = family_weights().get(model_type)
    if moe is not None and moe.read_whole is not None:
        return moe.read_whole
    if moe is not None and moe.unpack is not None:
        return (f"{moe.architecture}'s experts are stored [hidden, 2 x ffn] with gate and up columns interleaved, "
                f"which its conversion transposes and splits: more than moving rows")
    if model_type in llama_families() and model_type not in LLAMA_TYPES:
        return "its conversion checks the xIELU activation's beta and eps buffers by value: more than moving rows"
    return None
