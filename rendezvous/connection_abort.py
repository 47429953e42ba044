"""The abort of an in-process restart on gloo: shutdown(2) of this process's TCP connections, except to the rendezvous
stores, so every peer blocked in a collective with it fails at once. gloo's abort and destroy_process_group do not
unblock a peer while a forked data-loader worker holds the sockets. Linux only."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Iterable

ESTABLISHED = "01"


def shut_down_connections(keep_ports: Iterable[int]) -> int:
    """Shut down this process's established TCP connections whose ports are not in `keep_ports`; how many."""
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
            continue
    return count


def _socket_descriptors() -> dict[str, int]:
    """socket inode -> one of this process's descriptors for it."""
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
    """(inode, local port, remote port) of every established TCP connection here."""
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
