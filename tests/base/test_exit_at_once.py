"""base/errors.py exit_at_once: a lost peer's one line is the process's last word on stderr."""

import subprocess
import sys
import textwrap

import pytest

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


# The main thread's work ends while a watchdog thread is between its line and its os._exit: it fails (a collective
# broken by the peers that gave up; uncaught, it would reach the silenced hook and end the process with status 1), or
# returns (status 0, or 2 with a second line). CI saw a continued rank exit with a status other than 3 after its line.
MAIN_THREAD_ENDS = textwrap.dedent("""
    import sys, threading, time
    import base.errors as errors

    class SlowStdout:  # holds the watchdog in exit_at_once, before its line, while the main thread ends
        def __init__(self, stream): self.stream = stream
        def write(self, text): return self.stream.write(text)
        def flush(self): time.sleep(1.0); self.stream.flush()

    def work():
        sys.stdout = SlowStdout(sys.stdout)
        watchdog = threading.Thread(target=errors.exit_at_once, daemon=True,
                                    args=("pretrain_gpt.py", errors.PeerLostError("this rank did not run for 9 s")))
        watchdog.start()
        errors._EXITING_AT_ONCE.wait()
        if sys.argv[1] == "raises":
            raise RuntimeError("Connection closed by peer")
        if sys.argv[1] == "refused":
            raise errors.ConfigError("a bad input every rank met")
        return 0

    sys.exit(errors.run_tool("pretrain_gpt.py", work))
""")


@pytest.mark.parametrize("how", ["raises", "refused", "returns"])
def test_the_main_thread_ending_meanwhile_leaves_the_watchdogs_line_and_status(how):
    done = subprocess.run([sys.executable, "-c", MAIN_THREAD_ENDS, how], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_PEER_LOST, done.stderr
    assert done.stderr == "pretrain_gpt.py: error: this rank did not run for 9 s\n", done.stderr
