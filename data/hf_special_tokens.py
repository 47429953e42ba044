"""The end-of-document token of a Hugging Face tokenizer folder: the eos_token its own files declare (as Megatron-LM's
HuggingFaceTokenizer uses), read as transformers reads them; a bare tokenizer.json falls back to GPT-2's
`<|endoftext|>`.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from data import DataError

GPT2_END_OF_DOCUMENT = "<|endoftext|>"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
# transformers reads them in this order, a later file's eos_token winning.
SIDE_FILES = (TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE)
# Kept with a saved tokenizer so an export writes the generation settings back.
GENERATION_CONFIG_FILE = "generation_config.json"


def read_json_object(path: str, where: str, holding: str) -> dict:
    """The JSON object in `path`, refused in one line naming `where` when unreadable or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise DataError(f"{where}: not a JSON object of {holding} ({type(error).__name__}: {error})") from None
    if not isinstance(content, dict):
        raise DataError(f"{where}: expected a JSON object of {holding}, got {type(content).__name__}")
    return content


def read_side_files(directory: str) -> dict[str, dict]:
    """The folder's tokenizer_config.json, special_tokens_map.json and generation_config.json as read, kept for saved
    copies."""
    paths = {name: os.path.join(directory, name) for name in (*SIDE_FILES, GENERATION_CONFIG_FILE)}
    return {name: read_json_object(path, path, "settings") for name, path in paths.items() if os.path.isfile(path)}


def token_text(value, path: str) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise DataError(f"{path}: eos_token is {value!r}, neither a token nor an AddedToken object")


def end_of_document_token(side_files: dict[str, dict], vocabulary: dict[str, int], where: str) -> str:
    """The declared eos_token, else <|endoftext|> where the vocabulary has it; refused in one line otherwise."""
    declared = None
    for name in SIDE_FILES:
        token = token_text(side_files.get(name, {}).get("eos_token"), f"{where} {name}")
        declared = token if token is not None else declared
    if declared is not None:
        if declared not in vocabulary:
            raise DataError(f"{where}: eos_token {declared!r} (the end-of-document token) is not in tokenizer.json's "
                            f"vocabulary; give the tokenizer's own files")
        return declared
    if GPT2_END_OF_DOCUMENT in vocabulary:
        return GPT2_END_OF_DOCUMENT
    raise DataError(f"{where}: vocabulary has no {GPT2_END_OF_DOCUMENT!r} token and no tokenizer_config.json beside it "
                    f"declares an eos_token (the end-of-document token); give the tokenizer's folder with its "
                    f"tokenizer_config.json")
