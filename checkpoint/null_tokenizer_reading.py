"""How the run that wrote a checkpoint read NullTokenizer's --vocab-size N: up to Megatron-LM core_v0.17 (and here
without core_v0.18's --null-tokenizer flags) N ids plus the end-of-document id N; from core_v0.18.0, N ids, the last
ending a document. A resume with the same N takes the checkpoint's reading (`NULL_TOKENIZER_KEY` of its metadata), so
--eod-mask-loss masks what the writing run masked."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from base.errors import ConfigError
from data.tokenizer import NullTokenizer, RunTokenizer

NULL_TOKENIZER_KEY = "null_tokenizer"  # metadata.json's (ours) and metadata_view's (Megatron-LM's) record


@dataclass(frozen=True)
class NullTokenizerReading:
    vocab_size: int  # --vocab-size as the writing run gave it
    ids: int  # the model's vocabulary
    eod_id: int
    written_by: str  # the reading's name in a start-up line

    def describe(self) -> str:
        padding = self.ids - self.vocab_size
        ids = (f"{self.vocab_size} ids and {padding} padding row{'s' * (padding > 1)} Megatron-Core's loss scores, "
               f"{self.ids} in all here" if padding > 0 else f"{self.ids} ids")
        return f"--vocab-size {self.vocab_size} as {self.written_by}: {ids}, {self.eod_id} ending a document"


def reading_of(tokenizer: RunTokenizer) -> Optional[NullTokenizerReading]:
    """The reading a NullTokenizer was built under, or None (the default reading, or another tokenizer)."""
    if not isinstance(tokenizer, NullTokenizer) or tokenizer.reading is None:
        return None
    return NullTokenizerReading(tokenizer.flag_vocab_size, tokenizer.vocab_size, tokenizer.eod_id, tokenizer.reading)


def null_tokenizer_record(tokenizer: RunTokenizer) -> dict:
    """What a save of ours records of a NullTokenizer read otherwise than by default (empty for the default)."""
    reading = reading_of(tokenizer)
    return {NULL_TOKENIZER_KEY: asdict(reading)} if reading is not None else {}


def saved_null_tokenizer(metadata: Optional[dict]) -> Optional[NullTokenizerReading]:
    """The reading a checkpoint's metadata records, or None (the default reading, or another tokenizer)."""
    record = (metadata or {}).get(NULL_TOKENIZER_KEY)
    return NullTokenizerReading(**record) if isinstance(record, dict) else None


def read_as_saved(reading: Optional[NullTokenizerReading], tokenizer: RunTokenizer, iteration_dir: Optional[Path],
                  asked_eod: Optional[int] = None) -> tuple[RunTokenizer, Optional[str]]:
    """This run's NullTokenizer read as the checkpoint's run read it (or as its own core_v0.18 flags ask, with no
    checkpoint's reading), and the start-up line naming that reading; a --vocab-size or --null-tokenizer-eod-id
    (`asked_eod`) other than the checkpoint's is refused in one line (its ids would mean other tokens)."""
    if not isinstance(tokenizer, NullTokenizer):
        return tokenizer, None
    if reading is None:
        own = reading_of(tokenizer)
        return tokenizer, (f"> --tokenizer-type NullTokenizer {own.describe()}: --null-tokenizer-eod-id and "
                           f"--null-tokenizer-pad-id are its flags" if own is not None else None)
    if tokenizer.flag_vocab_size != reading.vocab_size:
        raise ConfigError(f"--vocab-size {tokenizer.flag_vocab_size}: {iteration_dir} was written with --tokenizer-type "
                          f"NullTokenizer {reading.describe()}; pass --vocab-size {reading.vocab_size}",
                          flags=("--vocab-size",))
    if asked_eod is not None and asked_eod != reading.eod_id:
        raise ConfigError(f"--null-tokenizer-eod-id {asked_eod}: {iteration_dir} was written with --tokenizer-type "
                          f"NullTokenizer {reading.describe()}; pass --null-tokenizer-eod-id {reading.eod_id}",
                          flags=("--null-tokenizer-eod-id",))
    read = NullTokenizer(reading.vocab_size, ids=reading.ids, eod_id=reading.eod_id, reading=reading.written_by)
    return read, f"> --tokenizer-type NullTokenizer {reading.describe()}, the reading of {iteration_dir}"
