"""Llama's config.json (transformers' LlamaForCausalLM): Llama's field table (families/common/fields.py), its rules
between fields and its settings (families/common/reader.py), which the other Llama-shaped families start from."""

from __future__ import annotations

from families.common.fields import LLAMA_FIELDS, llama_shaped
from families.common.reader import LLAMA_ARCHITECTURE, FamilyReader, llama_settings


def read(values, raw, path, fields):
    return llama_shaped(values, raw, path, fields)  # LlamaConfig.validate_architecture: the heads divide hidden


READER = FamilyReader("llama", (LLAMA_ARCHITECTURE, "LlamaModel"), LLAMA_FIELDS, read, llama_settings)
