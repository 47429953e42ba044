"""Data pipeline: tokenizer, Megatron-compatible indexed datasets, GPT samples, preprocessing."""


class DataError(ValueError):
    """Bad or unreadable data input. The message names the file or option and what is wrong.

    The training program turns it into one line on stderr and exit code 2 before any work starts.
    """
