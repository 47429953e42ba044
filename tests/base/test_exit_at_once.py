"""base/errors.py exit_at_once: a lost peer's one line is the process's last word on stderr."""

import subprocess
import sys
import textwrap

from base.errors import EXIT_PEER_LOST

# A thread that fails while the process ends: multiprocessing's resource sharer reports through
# sys.excepthook (resource_sharer.py `_serve`), a plain thread through threading.excepthook. CI saw the
# former's 20-line traceback below a continued rank's line (test_peer_loss.py, stopped rank 1).
SCRIPT = textwrap.dedent("""
    import sys, threading, time
    import base.errors as errors

    ready = threading.Event()

    def resource_sharer_like():
        ready.wait()
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            sys.excepthook(*sys.exc_info())

    def plain_thread():
        ready.wait()
        raise ConnectionResetError(104, "Connection reset by peer")

    for target in (resource_sharer_like, plain_thread):
        threading.Thread(target=target, daemon=True).start()

    def record_then_wait(status):  # the threads fail between the line and the exit
        ready.set()
        time.sleep(0.5)

    errors._record_exit_status = record_then_wait
    errors.exit_at_once("pretrain_gpt.py", errors.PeerLostError("rank 0 stopped answering"))
""")


def test_a_thread_failing_after_the_line_prints_nothing():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_PEER_LOST, done.stderr
    assert done.stderr == "pretrain_gpt.py: error: rank 0 stopped answering\n", done.stderr
