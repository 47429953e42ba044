"""The trunk's own rules: depth, widths, sequence, vocabulary, dropout and initialization."""

from __future__ import annotations

from base.errors import ConfigError
from base.options import flag_of_setting

# why a size of 0 is refused where Megatron-LM does not refuse it
_WHY_AT_LEAST_ONE = {
    "seq_length": ": a sample of no tokens (Megatron-LM's sample index divides the tokens by it: SIGFPE)",
    "ffn_hidden_size": ": an MLP 0 wide adds only its output bias (Megatron-LM builds it without a check, silently)",
}


def check_trunk(config) -> None:
    """ConfigError for the first trunk setting out of range."""
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "max_position_embeddings",
                 "make_vocab_size_divisible_by", "ffn_hidden_size", "kv_channels"):
        value = getattr(config, name)
        if value is not None and value < 1:  # None: the two sizes' defaults
            flag = flag_of_setting(type(config), name)
            raise ConfigError(f"{flag} must be at least 1, got {value}{_WHY_AT_LEAST_ONE.get(name, '')}",
                              flags=(flag,))
    # Megatron-LM asserts the division only where it derives the head width
    if config.kv_channels is None and config.hidden_size % config.num_attention_heads != 0:
        raise ConfigError(f"--hidden-size {config.hidden_size} is not divisible by --num-attention-heads "
                          f"{config.num_attention_heads}; choose sizes with hidden = heads x head_dim, or give "
                          f"each head's width with --kv-channels",
                          flags=("--hidden-size", "--num-attention-heads", "--kv-channels"))
    if config.seq_length > config.max_position_embeddings:
        raise ConfigError(f"--seq-length {config.seq_length} is larger than --max-position-embeddings "
                          f"{config.max_position_embeddings}; raise the latter or shorten the sequence",
                          flags=("--seq-length", "--max-position-embeddings"))
    if not 0.0 <= config.hidden_dropout < 1.0:
        raise ConfigError(f"--hidden-dropout must be in [0, 1), got {config.hidden_dropout}",
                          flags=("--hidden-dropout",))
    if config.init_method_std <= 0:
        raise ConfigError(f"--init-method-std must be positive, got {config.init_method_std}",
                          flags=("--init-method-std",))
    if config.vocab_size < 0:
        raise ConfigError(f"--vocab-size must be at least 1 (0 or none: the tokenizer's), got {config.vocab_size}",
                          flags=("--vocab-size",))


def check_trunk_tensor_parallel(config, tensor_parallel_size: int) -> None:
    """Each TP rank takes whole heads and equal slices of hidden and 4h."""
    for name, size in (("num_attention_heads", config.num_attention_heads), ("hidden_size", config.hidden_size),
                       ("ffn_hidden_size", config.ffn_size)):
        if size % tensor_parallel_size != 0:
            flag = flag_of_setting(type(config), name)
            raise ConfigError(f"{flag} {size} is not divisible by --tensor-model-parallel-size "
                              f"{tensor_parallel_size}; each tensor-parallel rank needs an equal share",
                              flags=(flag, "--tensor-model-parallel-size"))
