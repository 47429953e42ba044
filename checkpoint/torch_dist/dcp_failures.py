"""What went wrong inside torch.distributed.checkpoint, in one line. DCP wraps a rank's exception in a BaseException
(`CheckpointException`), which `except Exception` lets through: callers catch `DCP_FAILURES` and raise `failure_line`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Union

from torch.distributed.checkpoint.api import CheckpointException

from base.errors import CheckpointError

DCP_FAILURES = (Exception, CheckpointException)


def innermost(error: BaseException) -> BaseException:
    """The exception a rank raised, unwrapped from DCP's CheckpointException (the lowest failed rank's)."""
    while isinstance(error, CheckpointException) and error.failures:
        wrapped = error.failures[min(error.failures)]
        error = wrapped[0] if isinstance(wrapped, tuple) else wrapped
    return error


def failure_line(error: BaseException) -> Union[CheckpointError, str]:
    """Our own CheckpointError where a rank raised one, else the rank's exception as one line."""
    inner = innermost(error)
    if isinstance(inner, CheckpointError):
        return inner
    text = " ".join(str(inner).split())
    return f"{type(inner).__name__}: {text[:240]}" if text else type(inner).__name__


PROBE_BYTES = 1 << 20


def os_cause(error: BaseException, directory: Path) -> str:
    """", the operating system says: <its error>" where a write into `directory` failed without an OSError (torch's zip
    writer loses the errno): a small probe write gives the OS's words; "" otherwise."""
    if isinstance(innermost(error), OSError):
        return ""
    probe = directory / ".write-probe"
    try:
        descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, bytes(PROBE_BYTES))
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as failure:
        return f", the operating system says: {failure.strerror or errno.errorcode.get(failure.errno, failure)}"
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return ""
