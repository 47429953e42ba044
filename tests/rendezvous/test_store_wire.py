"""The liveness threads' store client (rendezvous/store_wire.py): the calls mean what torch's TCPStore
client's mean, against torch's own server; and a call to a host that died but has not yet closed its
sockets fails without a word on stderr, where torch's client prints its C++ warning (seen in CI above
the survivor's one line, about one full suite in five, when rank 0, the store's host, was killed).

The protocol is torch's: pytorch/pytorch torch/csrc/distributed/c10d/TCPStore.cpp (`SendBuffer`:
the command byte, then uint64-length strings; `TCPStore::validate`, `ping`, `incrementValueBy`,
`compareSet`, `check`, `multiGet`; `TCPClient::receiveValue` logs "recvValue failed on {}: {}" with
C10D_WARNING before it rethrows) and TCPStoreBackend.hpp (`validationMagicNumber`, `QueryType`).
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest


@pytest.fixture
def torch_store():
    """torch's own server, in this process, and torch's client of it."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


@pytest.mark.smoke
def test_the_calls_mean_what_torchs_client_means(torch_store):
    from rendezvous.store_wire import WireStore

    wire = WireStore.connect("127.0.0.1", torch_store.port, timeout_s=10)
    try:
        assert wire.add("beat/1", 3) == 3
        assert torch_store.add("beat/1", 1) == 4  # the same key for both clients
        wire.set("beat/2", "-1")
        assert torch_store.get("beat/2") == b"-1"
        assert wire.compare_set("verdict", "", "") == b""  # creates it empty, as torch's does
        assert wire.compare_set("verdict", "", '{"silent": [1]}') == b'{"silent": [1]}'
        assert wire.compare_set("verdict", "", "other") == b'{"silent": [1]}'  # the first stands
        assert torch_store.compare_set("verdict", "", "") == b'{"silent": [1]}'
        assert wire.check(["beat/1", "beat/2"]) and not wire.check(["beat/1", "beat/3"])
        torch_store.set("beat/3", "7")
        # torch's set has no reply, so the server may read our next call (on another connection) before
        # it: a get on torch's connection is the round trip that orders the set first.
        assert torch_store.get("beat/3") == b"7"
        assert wire.multi_get(["beat/1", "beat/3"]) == [b"4", b"7"]
    finally:
        wire.close()


class DeadButOpenHost:
    """A store host as a SIGKILL leaves it for a few tens of milliseconds: it answered the client's
    validation and ping while alive; then its threads are gone, so a call gets no answer, until its
    kernel closes the connection (with the call unread: a reset)."""

    def __init__(self, close_after_s: float = 0.05):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.close_after_s = close_after_s
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        connection, _ = self.server.accept()
        self._read(connection, 5)  # validate: command byte and magic number
        command, nonce = struct.unpack("=BI", self._read(connection, 5))
        connection.sendall(struct.pack("=I", nonce))  # ping: alive
        connection.recv(1, socket.MSG_PEEK)  # the next call arrives, and nobody answers it
        time.sleep(self.close_after_s)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        connection.close()
        self.server.close()

    @staticmethod
    def _read(connection, size):
        data = b""
        while len(data) < size:
            data += connection.recv(size - len(data))
        return data


def test_a_call_to_a_host_dead_but_not_yet_closed_fails_without_a_word_on_stderr(capfd):
    """The client the liveness threads get (start_liveness's): torch's (the old code) printed its
    warning here, "recvValue failed on SocketImpl(...)" and a dozen frames, before it raised."""
    from rendezvous.store_wire import connect_store_client

    host = DeadButOpenHost()
    store = connect_store_client("127.0.0.1", host.port, 10)
    with pytest.raises((ConnectionError, RuntimeError)):  # torch's DistNetworkError is a RuntimeError
        store.add("beat/1", 1)
    host.thread.join(timeout=5)
    assert capfd.readouterr().err == ""


def test_a_server_that_does_not_answer_the_ping_is_a_mismatch_not_a_dead_store():
    from rendezvous.store_wire import WireMismatch, WireStore

    server = socket.create_server(("127.0.0.1", 0))

    def answer_wrongly():
        connection, _ = server.accept()
        connection.recv(10)
        connection.sendall(struct.pack("=I", 0xDEAD))
        connection.close()

    thread = threading.Thread(target=answer_wrongly, daemon=True)
    thread.start()
    try:
        with pytest.raises(WireMismatch):
            WireStore.connect("127.0.0.1", server.getsockname()[1], timeout_s=5)
    finally:
        thread.join(timeout=5)
        server.close()
