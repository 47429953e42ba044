"""scripts/launch.py's signal handler on its own, in a process of its own (it takes over SIGTERM, SIGINT and
SIGUSR1 for good): what the first signal does, and what a later one does while torchrun's agent waits for
the ranks. The end-to-end test, a signal through the launcher under PP 2 x DP 2 with a save and a resume,
is tests/training/test_reliability.py::test_sigusr1_to_the_launchers_process_group_saves_exits_zero_and_the_resume_continues_exactly.

torchrun's own handler (torch/distributed/elastic/multiprocessing/api.py, `_terminate_process_handler`)
raises SignalException on every signal it handles; the agent (agent/server/api.py, SimpleElasticAgent.run)
catches the first and waits for the ranks in `_shutdown`, and a second raise ends that wait early.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A stand-in rank: in a session of its own, as torchrun starts one; it records the signals it gets and
# stops at its SIGINT.
RANK = textwrap.dedent("""
    import json, signal, sys, time
    got = []
    def record(signum, frame):
        got.append(signal.Signals(signum).name)
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, record)
    print("ready", flush=True)
    deadline = time.monotonic() + 30
    while "SIGINT" not in got and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)  # anything sent after the SIGINT arrives too
    print(json.dumps(got), flush=True)
""")

# The launcher's side: the forwarder installed, one child, then the signals one after another.
LAUNCHER = textwrap.dedent("""
    import json, os, signal, subprocess, sys, time
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from scripts.launch import SignalForwarder

    rank = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True, stdout=subprocess.PIPE,
                            text=True)
    assert rank.stdout.readline() == "ready\\n"
    forwarder = SignalForwarder()
    raised = []
    for signum in (signal.SIGUSR1, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        try:
            os.kill(os.getpid(), signum)
            time.sleep(0.3)  # the handler runs within this
        except SignalException as received:
            raised.append(received.sigval.name)
    rank_got = json.loads(rank.stdout.readline())
    rank.wait(30)
    returned = SignalForwarder()  # a fresh one, whose first signal comes after torchrun returned
    returned.agent_done = True
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)
    except SignalException:
        raised.append("after the agent returned")
    print(json.dumps({"raised": raised, "rank_got": rank_got}))
""")


def test_the_first_signal_goes_to_torchruns_agent_a_second_ctrl_c_to_the_ranks_and_repeats_nowhere():
    """The first SIGUSR1 raises torchrun's SignalException (its agent forwards it and waits); the repeated
    SIGUSR1 and a SIGTERM after it raise nothing (a raise would end the agent's wait with the ranks still
    saving) and are not sent to the rank, which has had one from the agent; a later SIGINT, a second
    Ctrl-C, is sent to the rank's process group. Once torchrun has returned nothing raises."""
    launched = subprocess.run([sys.executable, "-c", LAUNCHER, RANK], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
    assert launched.returncode == 0, launched.stderr
    outcome = json.loads(launched.stdout.splitlines()[-1])
    assert outcome == {"raised": ["SIGUSR1"], "rank_got": ["SIGINT"]}, outcome
