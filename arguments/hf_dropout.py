"""The dropouts a Hugging Face folder's model trains with, as --attention-dropout and --hidden-dropout.

Dropout changes the math of every training step, so `--init-from-hf` takes it from config.json as it takes the
architecture (arguments/hf_folder.py), and the export writes the run's values back (checkpoint/hf/folders.py,
families/common/llama_shaped.py, the families' writers): a folder saying `attention_dropout: 0.0` (Llama, Qwen,
DeepSeek-V3, most releases since 2024) trains at 0.0, where Megatron's defaults (0.1 each) stood before and were written back into
the exported config.json. Unlike the architecture, a dropout is a training choice: a flag typed on the command line
(or in the DeepSpeed JSON) that differs wins, and one start-up line says it overrides the folder.

- GPT-2 (transformers' GPT2Config): attn_pdrop, and resid_pdrop for --hidden-dropout, which here drops the
  embedding's output too (Megatron's embedding dropout is its hidden dropout); an embd_pdrop other than resid_pdrop
  is said in a start-up line.
- Phi-3: resid_pdrop (and embd_pdrop, likewise), attention_dropout.
- Every other family: attention_dropout (null: 0.0); its model has no dropout on the residual branches or the
  embedding, so --hidden-dropout 0.
"""

from __future__ import annotations

from typing import Any

from families.common.fields import HFConfig
from families.common.reader import FolderValue

# (hidden dropout's key, the embedding dropout's, the attention dropout's, transformers' defaults of the three)
DROPOUT_KEYS = {"gpt2": ("resid_pdrop", "embd_pdrop", "attn_pdrop", (0.1, 0.1, 0.1)),
                "phi3": ("resid_pdrop", "embd_pdrop", "attention_dropout", (0.0, 0.0, 0.0))}
OTHERS = (None, None, "attention_dropout", (0.0, 0.0, 0.0))


def _value(config: HFConfig, key: str, default: float) -> Any:
    value = config.values.get(key, config.fields.get(key, default))
    return default if value is None else float(value)


def folder_dropouts(config: HFConfig) -> tuple[dict[str, FolderValue], list[str]]:
    """The folder's dropouts as settings (module docstring), and the start-up lines about what differs here."""
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
