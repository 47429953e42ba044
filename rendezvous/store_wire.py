"""The rendezvous store's calls that the liveness threads make (rendezvous/liveness.py), over a socket of
our own instead of torch's TCPStore client.

torch's client writes a dozen lines of C++ warnings to stderr whenever a call fails, before it raises
(torch/csrc/distributed/c10d/TCPStore.cpp, `TCPClient::receiveValue`: "recvValue failed on
SocketImpl(...)" and the frames). A store host killed by SIGKILL is silent for tens of milliseconds
before its kernel closes its sockets (the process's memory goes first), so a heartbeat that happens to
call in that window fails that way, above the one line naming the host. The same call made here fails
as a Python exception and prints nothing.

The protocol is torch's (TCPStore.cpp's `SendBuffer` and the commands, TCPStoreBackend.hpp's
`QueryType`): a command byte, then its arguments in the machine's byte order, strings as a uint64
length and the bytes. Keys carry TCPStore's "/" prefix, so that torch's clients see the same keys.
`WireStore.connect` checks that the server speaks it (validate, then a ping that must come back) and
raises WireMismatch otherwise: a torch whose protocol changed gets its own client back
(`connect_store_client`), not a store that looks dead.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from datetime import timedelta

# TCPStoreBackend.hpp: `validationMagicNumber` and `enum class QueryType : uint8_t`.
VALIDATION_MAGIC = 0x3C85F7CE
VALIDATE, SET, COMPARE_SET, ADD, CHECK, MULTI_GET, PING = 0, 1, 2, 4, 5, 10, 13
CHECK_READY = 0  # CheckResponseType::READY
KEY_PREFIX = b"/"  # TCPStore::keyPrefix_


class WireMismatch(ConnectionError):
    """The server did not answer the protocol this module speaks (another torch version)."""


def _string(value: bytes) -> bytes:
    return struct.pack("=Q", len(value)) + value


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


class WireStore:
    """add, set, compare_set, check and multi_get of torch's TCPStore client, with its semantics.
    A call to a stopped host blocks with no timeout, as torch's does (the liveness watchdog is what
    notices); a closed or reset connection raises ConnectionError and prints nothing."""

    def __init__(self, connection: socket.socket) -> None:
        self.socket = connection
        self._lock = threading.Lock()  # one call at a time: the heartbeat and the watchdog share it

    @classmethod
    def connect(cls, host: str, port: int, timeout_s: float) -> "WireStore":
        connection = socket.create_connection((host, port), timeout=timeout_s)
        store = cls(connection)
        try:
            connection.sendall(struct.pack("=BI", VALIDATE, VALIDATION_MAGIC))
            nonce = os.getpid() & 0xFFFFFFFF
            connection.sendall(struct.pack("=BI", PING, nonce))
            answered = struct.unpack("=I", store._receive(4))[0]
        except OSError as error:
            connection.close()
            raise WireMismatch(f"the store at {host}:{port} did not answer a ping: {error}") from None
        if answered != nonce:
            connection.close()
            raise WireMismatch(f"the store at {host}:{port} answered a ping with {answered}, not {nonce}")
        connection.settimeout(None)  # blocking, as torch's client: a stopped host is the watchdog's
        return store

    def add(self, key: str, amount: int) -> int:
        reply = self._call(struct.pack("=B", ADD) + _string(KEY_PREFIX + key.encode()) + struct.pack("=q", amount),
                           lambda: self._receive(8))
        return struct.unpack("=q", reply)[0]

    def set(self, key: str, value: str | bytes) -> None:
        self._call(struct.pack("=B", SET) + _string(KEY_PREFIX + key.encode()) + _string(_bytes(value)), None)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return self._call(struct.pack("=B", COMPARE_SET) + _string(KEY_PREFIX + key.encode())
                          + _string(_bytes(expected)) + _string(_bytes(desired)), self._receive_bytes)

    def check(self, keys: list[str]) -> bool:
        reply = self._call(self._keys_command(CHECK, keys), lambda: self._receive(1))
        return reply[0] == CHECK_READY

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """A missing key reads as b"" (torch's client waits for it first): the liveness checks first."""
        return self._call(self._keys_command(MULTI_GET, keys), lambda: [self._receive_bytes() for _ in keys])

    def close(self) -> None:
        self.socket.close()

    def _keys_command(self, command: int, keys: list[str]) -> bytes:
        return struct.pack("=BQ", command, len(keys)) + b"".join(_string(KEY_PREFIX + key.encode()) for key in keys)

    def _call(self, request: bytes, receive):
        with self._lock:
            self.socket.sendall(request)
            return receive() if receive is not None else None

    def _receive_bytes(self) -> bytes:
        return self._receive(struct.unpack("=Q", self._receive(8))[0])

    def _receive(self, size: int) -> bytes:
        received = b""
        while len(received) < size:
            chunk = self.socket.recv(size - len(received))
            if not chunk:
                raise ConnectionResetError("the store's host closed the connection")
            received += chunk
        return received


def connect_store_client(host: str, port: int, timeout_s: float):
    """A client of the store at host:port for the liveness threads: ours, or torch's where the server
    does not speak the protocol this module knows (its failed calls then print torch's warning)."""
    try:
        return WireStore.connect(host, port, timeout_s)
    except WireMismatch:
        import torch.distributed as dist

        return dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
