"""What went wrong inside torch.distributed.checkpoint (DCP), in one line.

DCP runs each step of a load or save on every rank and gathers the outcomes: a rank's exception comes back wrapped in
a `CheckpointException`, which derives from BaseException (torch/distributed/checkpoint/api.py), so an
`except Exception` lets it through with a traceback per rank. `DCP_FAILURES` is what a caller catches around a DCP
call, and `failure_line` the message to raise instead: the first failed rank's own exception, or, where that is a
`CheckpointError` of ours (a record whose CRC-32 does not match, checkpoint/torch_dist/dcp_reader.py), that error itself.
`os_cause` finds the operating system's error behind a failed write that torch's zip writer reports without it.
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
    """", the operating system says: <its error>" where a write into `directory` failed without an OSError (torch's
    zip writer reports a short write as "unexpected pos 704 vs 598", the errno lost): a probe of PROBE_BYTES written
    there and removed gives the OS's own words (a full disk: "No space left on device"); "" where the failure was an
    OSError already or the probe writes."""
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
