"""What went wrong inside torch.distributed.checkpoint (DCP), in one line.

DCP runs each step of a load or save on every rank and gathers the outcomes: a rank's exception comes back wrapped in
a `CheckpointException`, which derives from BaseException (torch/distributed/checkpoint/api.py), so an
`except Exception` lets it through with a traceback per rank. `DCP_FAILURES` is what a caller catches around a DCP
call, and `failure_line` the message to raise instead: the first failed rank's own exception, or, where that is a
`CheckpointError` of ours (a record whose CRC-32 does not match, checkpoint/torch_dist/dcp_reader.py), that error itself.
"""

from __future__ import annotations

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
