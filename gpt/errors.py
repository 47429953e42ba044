"""The error every bad setting ends in; its own module so that gpt.config and zero.config can both raise
it without importing each other in a cycle (gpt.config re-exports it)."""


class ConfigError(ValueError):
    """A setting that cannot work. The message names the flag(s) involved."""
