"""The token ids a Hugging Face model folder pairs with its tokenizer (config.json's bos, eos and pad ids, which a
tokenizer alone cannot give), kept so an export writes them back as found.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from data import DataError
from data.hf_special_tokens import SIDE_FILES, token_text

MODEL_CONFIG_FILE = "config.json"
TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")


def _is_ids(value) -> bool:
    def one(v):
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0
    return value is None or one(value) or (isinstance(value, list) and all(one(v) for v in value))


def folder_token_ids(directory: str) -> Optional[dict]:
    """config.json's token ids in model folder `directory`; None where no model's config.json sits there."""
    path = os.path.join(directory, MODEL_CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise DataError(f"{path}: unreadable or not JSON ({error})") from None
    if not isinstance(content, dict) or "model_type" not in content:
        return None  # not a transformers model's config: the tokenizer came without one
    ids = {key: content.get(key) for key in TOKEN_ID_KEYS}
    wrong = next((key for key, value in ids.items() if not _is_ids(value)), None)
    if wrong is not None:
        raise DataError(f"{path}: {wrong} is {ids[wrong]!r}; it must be a token id, a list of them, or null")
    return ids


def declared_token_ids(side_files: dict[str, dict], vocabulary: dict[str, int], eod_id: int) -> dict:
    """The ids a tokenizer's side files declare: eos the end-of-document id, bos and pad their tokens' (bos the EOD
    where none is named)."""
    found = {"bos_token": None, "pad_token": None}
    named = set()
    for name in SIDE_FILES:
        for key in found:
            if key in side_files.get(name, {}):
                named.add(key)
                found[key] = token_text(side_files[name][key], name) or found[key]
    bos = vocabulary.get(found["bos_token"]) if "bos_token" in named else eod_id
    pad = vocabulary.get(found["pad_token"]) if found["pad_token"] is not None else None
    return {"bos_token_id": bos, "eos_token_id": eod_id, "pad_token_id": pad}
