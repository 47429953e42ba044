"""The error every bad setting ends in; its own module so that gpt.config and zero.config can both raise
it without importing each other in a cycle (gpt.config re-exports it). Also how the command-line
tools report bad input."""

import sys
from typing import Callable


class ConfigError(ValueError):
    """A setting that cannot work. The message names the flag(s) involved."""


def run_tool(program: str, action: Callable[[], object], expected: tuple[type[BaseException], ...]) -> int:
    """Run a command-line tool's work: 0 on success; an `expected` error (bad input, a damaged
    checkpoint, a full disk) is one line `program: error: ...` on stderr and exit status 2."""
    try:
        action()
    except expected as error:
        message = " ".join(str(error).split())  # one line, whatever the exception held
        print(f"{program}: error: {message}", file=sys.stderr)
        return 2
    except KeyError as error:  # a metadata.json that parses but lacks an entry every save writes
        print(f"{program}: error: the checkpoint's metadata has no {error} entry; is it from another tool?",
              file=sys.stderr)
        return 2
    return 0
