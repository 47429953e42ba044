"""The abort of an in-process restart on gloo: this process's collective connections shut down, so that every
peer blocked in a collective with it fails at once.

nvidia-resiliency-ext's `AbortTorchDistributed` calls `abort()` on each NCCL backend, then
`destroy_process_group()`. Neither unblocks a gloo peer: `ProcessGroupGloo.abort()` in torch 2.13 leaves a wait in
progress waiting, and destroying the group closes its sockets only once nothing refers to them, while a
forked data-loader worker (data/sampler.py) holds a copy of every socket the rank had when it was forked
(measured: after destroy_process_group on the failed rank, a peer blocked in its all-reduce was still blocked 30 s
later). shutdown(2) ends the connection itself, whoever else holds a descriptor of it: the peer reads "Connection
closed by peer" at once, fails its own collective, and aborts in turn.

Which sockets: this process's established TCP connections (Linux's /proc/self/fd and /proc/net/tcp{,6}) but those
to or from the rendezvous stores (`keep_ports`), which outlive the groups. Elsewhere than Linux nothing is shut
down and a blocked peer waits for --distributed-timeout-minutes.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterable

ESTABLISHED = "01"


def shut_down_connections(keep_ports: Iterable[int]) -> int:
    """Shut down this process's established TCP connections whose local or remote port is not in `keep_ports`;
    how many."""
    keep = set(keep_ports)
    descriptors = _socket_descriptors()
    count = 0
    for inode, local_port, remote_port in _established():
        fd = descriptors.get(inode)
        if fd is None or local_port in keep or remote_port in keep:
            continue
        try:
            with socket.socket(fileno=os.dup(fd)) as duplicate:  # closing the duplicate leaves `fd` to its owner
                duplicate.shutdown(socket.SHUT_RDWR)
            count += 1
        except OSError:
            continue  # closed meanwhile
    return count


def _socket_descriptors() -> dict[str, int]:
    """socket inode -> one of this process's descriptors of it."""
    found: dict[str, int] = {}
    directory = Path("/proc/self/fd")
    if not directory.exists():
        return found
    for entry in directory.iterdir():
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            found[target[len("socket:["):-1]] = int(entry.name)
    return found


def _established() -> list[tuple[str, int, int]]:
    """(inode, local port, remote port) of every established TCP connection in this network namespace."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == ESTABLISHED:
                rows.append((fields[9], int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)))
    return rows
