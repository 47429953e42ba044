"""Input files checked before they are read: a regular file of a sane size, or a directory.

`open()` on a named pipe waits for a writer that may never come, and /dev/zero (or a typo'd path
that happens to be a device) never ends: either given as a config, a JSON or a definition file hung a
command instead of failing. A multi-gigabyte file where a config is expected is a wrong path, not a
config. So every command reads its small inputs through `read_text_file` / `read_json_file`, and
checks large ones (corpora, tokenizer files read by a library) with `check_input_file`, which stats
the path first and never opens anything that is not a regular file. Failures are one `ConfigError`
(or the caller's error class) naming the flag, the path and what it is instead.

Base floor: imports nothing of ours but base.errors.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Optional

from base.errors import ConfigError

MIB = 2**20
# Configs, DeepSpeed JSON, experiment definitions, launch files, reports' JSON inputs. The largest
# we write (a mini-reproduction summary, a 170B checkpoint's metadata) are a few MB; 64 MiB is ten
# times that and still reads in well under a second.
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
    """Why `path` is not a readable regular file ("no such file", "a named pipe (FIFO)", ...), or
    None when it is one. Symbolic links are followed, as open() would."""
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
    """`path` as a Path, if it is a regular file of at most `max_bytes` (None: any size); otherwise
    raise `error` naming `flag`."""
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
    """`path` as a Path, if it is an existing directory; otherwise raise `error` naming `flag`."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise error(f"{flag} {path}: no such directory") from None
    if not stat.S_ISDIR(mode):
        raise error(f"{flag} {path}: {_kind(mode) if not stat.S_ISREG(mode) else 'a file'}, not a directory")
    return Path(path)


def read_text_file(path: str | os.PathLike, flag: str, max_bytes: int = MAX_CONFIG_BYTES,
                   error: type[Exception] = ConfigError) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`. At most `max_bytes` + 1 bytes are
    read, so a file that grows while it is read (or a /proc file that reports size 0) is still bounded."""
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
    """The parsed JSON of a regular file (see `read_text_file`); empty, malformed or absurdly nested
    text is one `error` naming `flag` and `what` the file should have been."""
    text = read_text_file(path, flag, max_bytes, error)
    if not text.strip():
        raise error(f"{flag} {path}: the file is empty; expected {what}")
    try:
        return json.loads(text, **loads_options)
    except json.JSONDecodeError as failure:
        raise error(f"{flag} {path}: not valid JSON ({failure}); expected {what}") from None
    except RecursionError:
        raise error(f"{flag} {path}: nested too deeply to be {what}") from None
