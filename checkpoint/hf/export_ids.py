"""The token ids and generation settings a Hugging Face export writes: the source model folder's where the run started
from one, else the run's tokenizer's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from base.errors import ConfigError
from checkpoint.inside import inside
from data.hf_special_tokens import GENERATION_CONFIG_FILE


def tokenizer_ids(tokenizer_dir: Path) -> dict:
    """The bos, eos and pad ids the checkpoint's saved tokenizer declares (its eos the end-of-document id)."""
    from data import DataError
    from data.tokenizer import TOKENIZER_FILE, load_tokenizer

    path = inside(tokenizer_dir.parent, tokenizer_dir.name, TOKENIZER_FILE)
    if not path.is_file():
        raise ConfigError(f"{path}: missing; the checkpoint's tokenizer folder is incomplete")
    try:
        return load_tokenizer(tokenizer_file=str(path)).declared_ids()
    except DataError as error:
        raise ConfigError(f"{path}: the checkpoint's tokenizer does not load ({error})") from None


def set_token_ids(hf_config, tokenizer_dir: Optional[Path], folder_ids: Optional[dict]) -> None:
    """config.json's ids: the source folder's, else the saved tokenizer's; without either the writer's (end-of-document
    id as bos and eos)."""
    ids = folder_ids if folder_ids is not None else tokenizer_ids(tokenizer_dir) if tokenizer_dir is not None else {}
    for key, value in ids.items():
        setattr(hf_config, key, value)


def write_generation_config(hf_config, folder: Path, tokenizer_dir: Optional[Path]) -> None:
    """generation_config.json: the source folder's where the tokenizer carries it, else transformers' own from
    config.json."""
    if tokenizer_dir is not None and (tokenizer_dir / GENERATION_CONFIG_FILE).is_file():
        return
    from transformers import GenerationConfig

    GenerationConfig.from_model_config(hf_config).save_pretrained(str(folder))
