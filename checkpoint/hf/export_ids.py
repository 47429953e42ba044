"""The token ids and generation settings a Hugging Face export writes: config.json's bos, eos and pad ids as the model
folder the run started from has them (recorded with the checkpoint's tokenizer: data/hf_model_ids.py), else as the
run's tokenizer declares them; and generation_config.json, the folder's own where it had one, else the one
transformers' save_pretrained derives from config.json."""

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
    """config.json's ids: the model folder's (`folder_ids`) where the run started from one, else the saved tokenizer's;
    without either, the family's writer's (the end-of-document id as bos and eos) stand."""
    ids = folder_ids if folder_ids is not None else tokenizer_ids(tokenizer_dir) if tokenizer_dir is not None else {}
    for key, value in ids.items():
        setattr(hf_config, key, value)


def write_generation_config(hf_config, folder: Path, tokenizer_dir: Optional[Path]) -> None:
    """generation_config.json in `folder`: where the saved tokenizer carries the source folder's, it is copied with the
    tokenizer's files; else transformers' own, from config.json's ids (GenerationConfig.from_model_config)."""
    if tokenizer_dir is not None and (tokenizer_dir / GENERATION_CONFIG_FILE).is_file():
        return
    from transformers import GenerationConfig

    GenerationConfig.from_model_config(hf_config).save_pretrained(str(folder))
