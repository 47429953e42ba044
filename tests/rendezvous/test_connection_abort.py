"""rendezvous/connection_abort.py: an in-process restart's abort ends this process's TCP connections, even those a
forked child (a data-loader worker) still holds, and leaves the rendezvous store's alone.

Run in a child process of its own: the abort acts on every connection of the process that calls it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = r"""
import os, socket, sys, time
sys.path.insert(0, sys.argv[1])
from rendezvous.connection_abort import shut_down_connections

def pair():
    server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
    client = socket.create_connection(server.getsockname()); accepted, _ = server.accept()
    return server.getsockname()[1], client, accepted

_, collective, peer = pair()
store_port, store_client, store_server_side = pair()
child = os.fork()
if child == 0:  # a forked worker: holds copies of every descriptor, never closes them
    time.sleep(30)
    os._exit(0)
shut = shut_down_connections([store_port])
peer.settimeout(5)
print(shut, peer.recv(1) == b"", store_client.send(b"x"), store_server_side.recv(1) == b"x")
os.kill(child, 9)
"""


def test_the_abort_ends_a_connection_a_forked_child_still_holds_and_keeps_the_stores():
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    # both ends of the collective pair live in this process (2 shut down); the peer reads end-of-file at once
    # although the child keeps its descriptors open; the store's connection still carries data
    assert done.stdout.split() == ["2", "True", "1", "True"], done.stdout
