"""A Llama-shaped folder's config.json against this run's model, read as transformers reads it; each difference named
with the flag that would make them agree.
"""

from __future__ import annotations

import os
from typing import Optional

from arguments.hf_config import check_hf_config_json
from arguments.hf_folder import architecture_settings
from base.errors import ConfigError
from base.options import setting_value
from families.common.features import flag_for
from families.common.llama_shaped import ARCHITECTURE
from families.registry import dense_families
from gpt.model_config import ModelConfig


def parsed_llama_config(hf: dict, source: str | os.PathLike, family: Optional[str] = None):
    """config.json read as transformers reads it (defaults, older rope keys converted), its log lines kept out; a field
    its strict dataclass refuses is one line, not a traceback."""
    from transformers import CONFIG_MAPPING, LlamaConfig
    from transformers.utils import logging

    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    import transformers

    # A family's own config class, else the model_type's; a file without model_type is a Llama's.
    model_type = hf.get("model_type")
    dense = dense_families()
    registered = dense.get(model_type) or dense.get(family or "")
    config_class = getattr(transformers, registered.config_class) if registered is not None else \
        CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else LlamaConfig
    _check_dtype(hf, source)
    try:
        # as transformers reads the file: `{"__float__": "Infinity"}` objects are floats (NemotronH's time_step_limit)
        return config_class.from_dict(config_class._decode_special_floats(hf))
    except (TypeError, ValueError, KeyError, *_strict_dataclass_errors()) as error:
        reason = " ".join(str(error).split())
        raise ConfigError(f"{source}: transformers cannot read it as a {config_class.__name__} ({reason})") from None
    finally:
        logging.set_verbosity(verbosity)


def _check_dtype(hf: dict, source) -> None:
    """config.json's dtype names a torch dtype (transformers' getattr would raise a traceback)."""
    import torch

    for key in ("dtype", "torch_dtype"):
        value = hf.get(key)
        if value is not None and not (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype)):
            raise ConfigError(f"{source}: its {key} {value!r} is not a torch dtype (float32, bfloat16, float16, ...)")


def _strict_dataclass_errors() -> tuple[type[Exception], ...]:
    """huggingface_hub's error for a field its strict dataclasses refuse (transformers 5's configs);
    older versions have none."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def llama_settings(hf: dict, source: str | os.PathLike) -> dict:
    """The ModelConfig settings the folder's LlamaForCausalLM has, with its vocab_size; a config our blocks cannot
    compute is refused in one line naming each key."""
    config = check_hf_config_json(hf, source)
    parsed_llama_config(config.fields, source, config.family)
    settings = {name: given.value for name, given in architecture_settings(config).items()}
    return {**settings, "vocab_size": config.vocab_size}


def _ours(config: ModelConfig, name: str):
    """This run's value of a setting, as comparable to config.json's."""
    if name == "ffn_hidden_size":
        return config.ffn_size
    if name == "num_query_groups":
        return config.attention.query_groups(config.num_attention_heads)
    if name == "kv_channels":  # the width, given or not (Megatron's default is hidden / heads)
        return config.head_dim
    if name == "moe_ffn_hidden_size":  # the experts' width, given or not (default: the MLP's)
        return config.moe.ffn_hidden_size if config.moe is not None else None
    return setting_value(config, name)


def check_llama_hf_config(hf: dict, model_config: ModelConfig, source: str | os.PathLike) -> None:
    """Raise ConfigError listing every difference from this run's model, each with the flag that fixes it."""
    settings = llama_settings(hf, source)
    problems = []
    for name, theirs in settings.items():
        if name in ("vocab_size", "max_position_embeddings", "hf_model_type"):
            continue
        mine = _ours(model_config, name)
        if theirs != mine:
            problems.append(f"pass {flag_for(name, theirs)} (this run has {mine})")
    if settings["vocab_size"] != model_config.vocab_size:
        problems.append(f"pass the folder's tokenizer.json as --tokenizer-file: config.json vocab_size is "
                        f"{settings['vocab_size']}, this run's tokenizer has {model_config.vocab_size} tokens")
    if problems:
        architecture = (hf.get("architectures") or [ARCHITECTURE])[0]
        raise ConfigError(f"{source} ({architecture}) does not match this run's model: {'; '.join(problems)}")
