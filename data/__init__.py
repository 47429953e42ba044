"""Data pipeline: tokenizer, Megatron-compatible indexed datasets, GPT samples, preprocessing."""


class DataError(ValueError):
    """Bad or unreadable data input, named with the file or option; one line on stderr and exit code 2."""
