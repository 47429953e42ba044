"""Input files checked before they are read: a regular file of a sane size, or a directory, so a FIFO, device or huge
wrong path fails in one line instead of hanging."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Optional

from base.errors import ConfigError

MIB = 2**20
# The largest config-like file we write is a few MB; 64 MiB is ten times that.
MAX_CONFIG_BYTES = 64 * MIB


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def irregularity(path: str | os.PathLike) -> Optional[str]:
    """Why `path` is not a readable regular file, or None."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "file not found"
    except NotADirectoryError:
        return "file not found (a part of the path is a file)"
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    return None if stat.S_ISREG(mode) else _kind(mode)


def check_input_file(path: str | os.PathLike, flag: str, max_bytes: Optional[int] = MAX_CONFIG_BYTES,
                     error: type[Exception] = ConfigError, fix: str = "give a regular file") -> Path:
    """`path` if it is a regular file of at most `max_bytes` (None: any size); else raise `error` naming `flag`."""
    reason = irregularity(path)
    if reason is not None:
        raise error(f"{flag} {path}: {reason}; {fix}")
    _check_size(path, flag, max_bytes, error)
    return Path(path)


def _check_size(path, flag: str, max_bytes: Optional[int], error: type[Exception]) -> None:
    size = os.stat(path).st_size
    if max_bytes is not None and size > max_bytes:
        raise error(f"{flag} {path}: {size:,} bytes, more than the {max_bytes // MIB} MiB such a file can be "
                    f"(the limit is MAX_CONFIG_BYTES in base/input_files.py); is it the right file?")


def check_input_directory(path: str | os.PathLike, flag: str, error: type[Exception] = ConfigError) -> Path:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise error(f"{flag} {path}: no such directory") from None
    if not stat.S_ISDIR(mode):
        raise error(f"{flag} {path}: {_kind(mode) if not stat.S_ISREG(mode) else 'a file'}, not a directory")
    return Path(path)


def read_text_file(path: str | os.PathLike, flag: str, max_bytes: int = MAX_CONFIG_BYTES,
                   error: type[Exception] = ConfigError) -> str:
    """The UTF-8 text of a regular file; at most `max_bytes` + 1 bytes are read, so a growing file stays bounded."""
    reason = irregularity(path)
    if reason is not None:
        raise error(f"{flag} {path}: cannot read it ({reason}); give a regular file")
    _check_size(path, flag, max_bytes, error)
    try:
        with open(path, "rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as failure:
        raise error(f"{flag} {path}: cannot read it ({failure.strerror or failure})") from None
    if len(data) > max_bytes:
        raise error(f"{flag} {path}: more than the {max_bytes // MIB} MiB such a file can be; is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as failure:
        raise error(f"{flag} {path}: not UTF-8 text ({failure.reason} at byte {failure.start})") from None


def read_json_file(path: str | os.PathLike, flag: str, max_bytes: int = MAX_CONFIG_BYTES,
                   error: type[Exception] = ConfigError, what: str = "JSON", **loads_options: Any) -> Any:
    """The parsed JSON of a regular file; empty, malformed or too nested text is one `error` naming `flag`."""
    text = read_text_file(path, flag, max_bytes, error)
    if not text.strip():
        raise error(f"{flag} {path}: the file is empty; expected {what}")
    try:
        return json.loads(text, **loads_options)
    except json.JSONDecodeError as failure:
        raise error(f"{flag} {path}: not valid JSON ({failure}); expected {what}") from None
    except RecursionError:
        raise error(f"{flag} {path}: nested too deeply to be {what}") from None
