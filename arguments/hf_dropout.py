"""The dropouts a Hugging Face folder's model trains with, as --attention-dropout and --hidden-dropout, taken from
config.json as the architecture is (most releases since 2024 say 0.0). A dropout is a training choice: a typed flag that
differs wins, said in one start-up line."""

from __future__ import annotations

from typing import Any

from families.common.fields import HFConfig
from families.common.reader import FolderValue

# (hidden, embedding, attention dropout keys, transformers' defaults); other families have no residual or embedding
# dropout
DROPOUT_KEYS = {"gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop", (0.1, 0.1, 0.1)),
                "phi3": ("resid_pdrop", "embd_pdrop", "attention_dropout", (0.0, 0.0, 0.0))}
OTHERS = (None, None, "attention_dropout", (0.0, 0.0, 0.0))


def _value(config: HFConfig, key: str, default: float) -> Any:
    value = config.values.get(key, config.fields.get(key, default))
    return default if value is None else float(value)


def folder_dropouts(config: HFConfig) -> tuple[dict[str, FolderValue], list[str]]:
    """The folder's dropouts as settings, and start-up lines for what differs here (GPT-2's embd_pdrop: the embedding's
    dropout is --hidden-dropout's)."""
    hidden_key, embedding_key, attention_key, (hidden, embedding, attention) = DROPOUT_KEYS.get(config.family, OTHERS)
    settings = {"attention_dropout": FolderValue(_value(config, attention_key, attention), attention_key)}
    notes = []
    if hidden_key is None:
        settings["hidden_dropout"] = FolderValue(0.0, f"model_type {config.family}: no dropout on the residual "
                                                      f"branches")
        return settings, notes
    settings["hidden_dropout"] = FolderValue(_value(config, hidden_key, hidden), hidden_key)
    embedding = _value(config, embedding_key, embedding)
    if embedding != settings["hidden_dropout"].value:
        notes.append(f"> {config.path}: {embedding_key} {embedding:g} differs from {hidden_key} "
                     f"{settings['hidden_dropout'].value:g}; the embedding's dropout here is --hidden-dropout's, "
                     f"{hidden_key}")
    return settings, notes
