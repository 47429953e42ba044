"""A resume's tokenizer against its checkpoint's: ids mean what the embedding learned only under the same tokenizer, and
a same-size vocabulary passes every shape check. Our saves record `tokenizer_digest`; a differing one is one line naming
both (a note under --override-data-on-resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from base.errors import ConfigError
from checkpoint.null_tokenizer_reading import null_tokenizer_record
from data.sentencepiece_tokenizer import SENTENCEPIECE_TYPES
from data.tokenizer import RunTokenizer, tokenizer_digest

TOKENIZER_DIGEST_KEY, TOKENIZER_SIZE_KEY = "tokenizer_digest", "tokenizer_vocab_size"
# The source model folder's config.json bos/eos/pad ids, which the HF export writes back.
FOLDER_IDS_KEY = "hf_token_ids"
SHOWN_DIGEST = len("sha256:") + 12  # enough to tell two apart in a line


@dataclass(frozen=True)
class SavedTokenizer:
    digest: str
    vocab_size: Optional[int]
    named: str  # how the checkpoint's run named it (`describe_tokenizer`)
    iteration_dir: Path


def describe_tokenizer(setting: Callable[[str], object]) -> str:
    """The flags that name a run's tokenizer, or the embedded corpus's tokenizer when none does."""
    tokenizer_type = setting("tokenizer_type")
    named = [f"--tokenizer-type {tokenizer_type}"] if tokenizer_type else []
    model_flag = "--tokenizer-model" if tokenizer_type in SENTENCEPIECE_TYPES else "--tokenizer-file"
    for name, flag in (("tokenizer_file", model_flag), ("vocab_file", "--vocab-file"), ("merge_file", "--merge-file")):
        if setting(name):
            named.append(f"{flag} {setting(name)}")
    return " ".join(named) or f"the embedded corpus's tokenizer (--tokenizer-vocab-size {setting('tokenizer_vocab_size')})"


def tokenizer_record(tokenizer: RunTokenizer) -> dict:
    """What a save records of the run's tokenizer (metadata.json keys)."""
    record = {TOKENIZER_DIGEST_KEY: tokenizer_digest(tokenizer), TOKENIZER_SIZE_KEY: tokenizer.vocab_size,
              **null_tokenizer_record(tokenizer)}
    folder_ids = getattr(tokenizer, "folder_ids", None)
    if folder_ids is not None:
        record[FOLDER_IDS_KEY] = folder_ids
    return record


def saved_tokenizer(metadata: dict, iteration_dir: Path) -> Optional[SavedTokenizer]:
    """The tokenizer a checkpoint's metadata records; None for a save without the digest (or another format's)."""
    digest = metadata.get(TOKENIZER_DIGEST_KEY)
    if digest is None:
        return None
    data = (metadata.get("config") or {}).get("data") or {}
    return SavedTokenizer(digest, metadata.get(TOKENIZER_SIZE_KEY), describe_tokenizer(data.get), iteration_dir)


def check_resume_tokenizer(saved: Optional[SavedTokenizer], config, tokenizer: RunTokenizer) -> Optional[str]:
    """None when this run's tokenizer is the checkpoint's (or none is recorded); a note under --override-data-on-resume;
    else a ConfigError naming both."""
    if saved is None or saved.vocab_size not in (None, tokenizer.vocab_size):  # the load names the sizes
        return None
    ours = tokenizer_digest(tokenizer)
    if ours == saved.digest:
        return None
    named = describe_tokenizer(lambda name: getattr(config.data, name))
    listed = (f"this run's tokenizer {named} ({ours[:SHOWN_DIGEST]}) is not the checkpoint's {saved.named} "
              f"({saved.digest[:SHOWN_DIGEST]})")
    if config.checkpoint.override_data_on_resume:
        return (f"> note: resuming {saved.iteration_dir}: {listed}, as --override-data-on-resume allows; the token ids "
                f"no longer mean what the checkpoint's embedding learned")
    raise ConfigError(f"resuming {saved.iteration_dir}: {listed}, so its token ids would not mean what the checkpoint's "
                      f"embedding learned. Pass the checkpoint's tokenizer, or --override-data-on-resume to go on anyway")
