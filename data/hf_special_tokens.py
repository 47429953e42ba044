"""The end-of-document token of a Hugging Face tokenizer folder: the one its own files declare.

Megatron-LM's HuggingFaceTokenizer ends a document with `AutoTokenizer.from_pretrained(DIR).eos_token_id`
(megatron/training/tokenizer/tokenizer.py, _HuggingFaceTokenizer.eod), so Llama 2's and Mistral's documents end with
`</s>`, Llama 3's with `<|end_of_text|>`, Gemma's with `<eos>` and GPT-2's with `<|endoftext|>`. transformers reads
`eos_token` from tokenizer_config.json, and special_tokens_map.json's overrides it; either may hold the token as a
string or as an AddedToken object ({"content": ...}). A bare tokenizer.json declares no eos: GPT-2's token,
`<|endoftext|>`, is taken where the vocabulary has it, as this project always did.
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
# kept with a saved tokenizer too, so an export of a folder's model writes its generation settings back
GENERATION_CONFIG_FILE = "generation_config.json"


def read_json_object(path: str, where: str, holding: str) -> dict:
    """The JSON object in `path` (a tokenizer's vocabulary or settings), refused in one line naming `where` and what
    it should hold when unreadable or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise DataError(f"{where}: not a JSON object of {holding} ({type(error).__name__}: {error})") from None
    if not isinstance(content, dict):
        raise DataError(f"{where}: expected a JSON object of {holding}, got {type(content).__name__}")
    return content


def read_side_files(directory: str) -> dict[str, dict]:
    """The folder's tokenizer_config.json, special_tokens_map.json and generation_config.json, each as read (left out
    where absent): kept so a saved copy of the tokenizer carries them and transformers reads it the same way."""
    paths = {name: os.path.join(directory, name) for name in (*SIDE_FILES, GENERATION_CONFIG_FILE)}
    return {name: read_json_object(path, path, "settings") for name, path in paths.items() if os.path.isfile(path)}


def token_text(value, path: str) -> Optional[str]:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise DataError(f"{path}: eos_token is {value!r}, neither a token nor an AddedToken object")


def end_of_document_token(side_files: dict[str, dict], vocabulary: dict[str, int], where: str) -> str:
    """The token that ends a document: the declared eos_token, else <|endoftext|> where the vocabulary has it;
    refused in one line when neither names a token of `vocabulary` (`where` names the tokenizer)."""
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
