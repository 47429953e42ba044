"""The vocabulary a launch's model will have, known before its tokenizer is loaded: what `python -m zero.plan`,
`pretrain_gpt.py --dry-run` and the memory check before the build (planner/launch.py) plan with."""

from __future__ import annotations

from arguments.checkpoint_config import CheckpointConfig
from arguments.config_sources import PRESET
from data.data_config import DataConfig
from gpt.model_config import ModelConfig
from training.run_settings import model_vocabulary, tokenizer_size_from_flags


def launch_vocab(checkpoint: CheckpointConfig, data: DataConfig, model: ModelConfig, sources: dict) -> tuple[int, str]:
    """The model's vocabulary for a launch of `config`, before its tokenizer is loaded, and where it came from: what
    `pretrain_gpt.py` with the same flags builds (for the embedded corpus at most --tokenizer-vocab-size tokens)."""
    tokens = tokenizer_size_from_flags(data, model)
    if data.tokenizer_type == "NullTokenizer":
        source = f"--vocab-size {model.vocab_size}" + ("" if data.newer_null_tokenizer else
                                                        " plus the end-of-document id")
    elif tokens is None:
        from data.tokenizer import load_named_tokenizer

        tokens = load_named_tokenizer(data.tokenizer_type, data.tokenizer_file, data.vocab_file,
                                      data.merge_file).vocab_size
        source = "the tokenizer named by the flags"
    else:
        source = "the embedded corpus's tokenizer (--tokenizer-vocab-size)"
    vocab = model_vocabulary(checkpoint, data, model, sources, tokens)
    if checkpoint.init_from_hf:
        source = "the --init-from-hf folder's vocab_size"
    elif vocab != tokens:
        where = sources.get("vocab_size")
        source = (f"vocab_size of the preset {where.origin}" if where is not None and where.kind == PRESET
                  else "--vocab-size") + \
            f"; the embedded corpus's tokenizer uses at most its first {tokens:,} ids"
    return vocab, source
