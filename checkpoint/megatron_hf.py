"""A Megatron-LM torch_dist checkpoint as a Hugging Face state: the model its args describe, at the saved (padded)
vocabulary so the exported loss is Megatron-LM's, and its fp32 weights read through checkpoint/torch_dist/source.py
under transformers' names; the settings the args gave are returned for the config.json fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from base.errors import CheckpointError
from base.options import setting_names, with_settings
from checkpoint.hf.folders import check_convertible, to_hf_state_dict
from checkpoint.megatron_hf_fields import END_OF_DOCUMENT
from checkpoint.torch_dist.common import load_common, saved_args
from checkpoint.torch_dist.resume import RENAMED, hybrid_settings, metadata_view
from checkpoint.torch_dist.source import MegatronSource
from gpt.model_config import ModelConfig

MASTER = "master"  # the exact weights: an fp32 run's model tensors, a 16-bit run's fp32 copies (torch_dist/source.py)
# The shape: Megatron-LM's args of the same names
SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "kv_channels", "ffn_hidden_size", "seq_length",
         "max_position_embeddings", "init_method_std")
# Run settings the args hold under our names, not the export's to take.
RUN_SETTINGS = ("vocab_size", "make_vocab_size_divisible_by", "attention_backend", "cp_comm_type")


def _scalar(value):
    """A setting's value from the args, or None; a list of one (--moe-aux-loss-coeff) as its element."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return value if isinstance(value, (bool, int, float, str)) else None


def end_of_document_id(args: dict) -> Optional[int]:
    """The run's end-of-document id where its args give it (NullTokenizer's, after the --vocab-size ids)."""
    return args.get("vocab_size") if args.get("tokenizer_type") == "NullTokenizer" else None


def megatron_settings(common: dict) -> tuple[ModelConfig, frozenset[str]]:
    """The model Megatron-LM's args describe, and the names of the settings they gave."""
    from arguments.config import PretrainConfig  # the defaults a setting its args lack takes

    args = vars(saved_args(common))
    if "layernorm_zero_centered_gamma" not in args:  # Megatron-LM saves every argument; older saves of ours did not
        raise CheckpointError("its args do not say whether the norms store gain - 1 (layernorm_zero_centered_gamma, "
                              "--apply-layernorm-1p), so the exported norms could be off by 1: convert a save that "
                              "records it (Megatron-LM's own, or this project's since it writes the key)")
    ours = {RENAMED.get(name, name): name for name in args}
    known = setting_names(ModelConfig)
    given = {name for name in known if ours.get(name, name) in args and name not in RUN_SETTINGS}
    model = dict(metadata_view(common, PretrainConfig())["config"]["model"])
    # Every other setting the export may write comes from the run's args, not our defaults.
    for name in sorted(given - set(model)):
        value = _scalar(args[ours.get(name, name)])
        if value is not None:
            model[name] = value
        elif args[ours.get(name, name)] is not None:
            given.discard(name)  # a value no setting here holds: named where config.json writes it
    model.update({name: args[name] for name in SHAPE if args.get(name) is not None})
    model.update(hybrid_settings(args))  # a HybridModel's args count a layer per symbol (resume.py)
    model["vocab_size"] = args["padded_vocab_size"]
    given |= {"vocab_size"} | ({"activation"} if "swiglu" in args else set())  # metadata_view's _activation
    if end_of_document_id(args) is not None:
        given.add(END_OF_DOCUMENT)
    if model.get("num_experts") is not None and args.get("moe_ffn_hidden_size") is not None:
        model["moe_ffn_hidden_size"] = args["moe_ffn_hidden_size"]
    config = with_settings(ModelConfig, {name: value for name, value in model.items() if name in known})
    return config, frozenset(given)


def megatron_to_hf_state(iteration_dir: Path) -> tuple[ModelConfig, dict[str, torch.Tensor], frozenset[str]]:
    """The model config, its weights under transformers' names and the settings its args gave."""
    config, given = megatron_settings(load_common(iteration_dir))
    check_convertible(config, "the Hugging Face export")  # before any weight is read
    source = MegatronSource(iteration_dir)
    weights = {name: source.read(MASTER, name, tuple(slice(0, n) for n in info.shape)).reshape(info.shape)
               for name, info in source.tensors(MASTER).items()}
    weights.update({name: torch.tensor(values, dtype=torch.float32)
                    for name, values in (source.expert_biases() or {}).items()})
    return config, to_hf_state_dict(weights, config), given
