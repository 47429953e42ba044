"""The liveness threads' store calls over a socket of our own, speaking torch's TCPStore protocol: torch's client prints
a dozen lines of C++ warnings when a call to a dying host fails, ours raises quietly. A server speaking another protocol
gets torch's client back."""

from __future__ import annotations

import os
import socket
import struct
import threading
from datetime import timedelta

# TCPStoreBackend.hpp's validationMagicNumber and QueryType.
VALIDATION_MAGIC = 0x3C85F7CE
VALIDATE, SET, COMPARE_SET, ADD, CHECK, MULTI_GET, PING = 0, 1, 2, 4, 5, 10, 13
CHECK_READY = 0
KEY_PREFIX = b"/"  # TCPStore::keyPrefix_


class WireMismatch(ConnectionError):
    """The server does not speak this module's protocol (another torch version)."""


def _string(value: bytes) -> bytes:
    return struct.pack("=Q", len(value)) + value


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


class WireStore:
    """torch's TCPStore client's add, set, compare_set, check and multi_get. A call to a stopped host blocks, as torch's
    does; a closed connection raises ConnectionError quietly."""

    def __init__(self, connection: socket.socket) -> None:
        self.socket = connection
        self._lock = threading.Lock()

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
        connection.settimeout(None)  # blocking, as torch's client: a stopped host is the watchdog's to notice
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
        """A missing key reads as b"" (torch's client would wait for it)."""
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
    try:
        return WireStore.connect(host, port, timeout_s)
    except WireMismatch:
        import torch.distributed as dist

        return dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
