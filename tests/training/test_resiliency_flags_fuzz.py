"""Generated values for every fault-tolerance, flight-recorder and fault-injector flag, each ending in one line and
exit 2 before any work, or in a clean run (issue 79 item 7, as tests/training/test_bad_inputs_fuzz.py does for the
other flags).

NaN, infinities, 1e300, tiny and negative numbers, integers past int64, text and empty values for
each numeric flag, and malformed lists for the injector's rank, type and weight lists; the injector's own flags
beside an injector that is on (on rank 0, workload_exc, a delay of an hour: it is armed and never fires within the
run), the others alone. Each
runs through pretrain_gpt.main in this process and must exit 2 with exactly one stderr line and no traceback, or run
to its end (exit 0; exit 1 only as the injector's own one line), writing nothing when it is refused.
"""

from __future__ import annotations

import pytest

import pretrain_gpt
from tests.reliability_helpers import TINY, run_main, snapshot

SECONDS_FLAGS = ["--fault-injector-fault-delay", "--fault-injector-mtti-seconds", "--fault-injector-offset-seconds",
                 "--heartbeat-timeout-seconds", "--inprocess-heartbeat-interval", "--inprocess-heartbeat-timeout",
                 "--inprocess-barrier-timeout", "--inprocess-completion-timeout"]
COUNT_FLAGS = ["--fault-injector-num-ranks", "--fault-injector-delay-start-iteration", "--fault-injector-seed",
               "--inprocess-max-iterations", "--inprocess-active-world-size", "--flight-recorder-trace-buffer-size",
               "--ft-num-warmup-iters"]
LIST_FLAGS = ["--fault-injector-ranks", "--fault-injector-fault-types", "--fault-injector-fault-probabilities"]
NUMBERS = ["nan", "inf", "-inf", "1e300", "-1", "0", "1e-300", str(10**30), "x", ""]
LISTS = ["", ",", "0,", "0,,0", "-1", "1e9", "nan", "workload_exc,", "WORKLOAD_EXC", "0.5,nan"]
INJECTOR_ON = ["--fault-injector-ranks", "0", "--fault-injector-fault-types", "workload_exc",
               "--fault-injector-fault-delay", "3600"]


def _without(flags: list[str], flag: str) -> list[str]:
    """`flags` less `flag` and its value (the fuzzed value replaces it)."""
    if flag not in flags:
        return flags
    at = flags.index(flag)
    return flags[:at] + flags[at + 2:]


def cases() -> list[tuple[str, list[str]]]:
    """The injector's own flags beside an injector that is on (alone they are not read), the others alone."""
    found = []
    for flag in SECONDS_FLAGS + COUNT_FLAGS:
        beside = _without(INJECTOR_ON, flag) if flag.startswith("--fault-injector") else []
        for value in NUMBERS:
            found.append((f"{flag}={value!r}{' beside the injector' if beside else ''}", beside + [f"{flag}={value}"]))
    for flag in LIST_FLAGS:
        for value in LISTS:
            found.append((f"{flag}={value!r} beside the injector",
                          _without(INJECTOR_ON, flag) + [f"{flag}={value}"]))
    return found


CASES = cases()


def test_there_are_enough_cases():
    assert len(CASES) >= 170 and len({name for name, _ in CASES}) == len(CASES)


# a thread that dies (the injector's, on a wait it cannot take) is only a warning under pytest: an error here
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("name,flags", CASES, ids=[name for name, _ in CASES])
def test_a_resiliency_value_is_one_line_or_a_clean_run(corpus_cache_300, tmp_path, name, flags):
    work = tmp_path / "out"
    outcome = run_main(pretrain_gpt.main, TINY + ["--data-cache-dir", corpus_cache_300, "--metrics-file",
                                                  work / "metrics.jsonl", "--save", work / "ck", *flags])
    assert "Traceback" not in outcome.err, (name, outcome.err[-3000:])
    assert outcome.code in (0, 1, 2), (name, outcome.code, outcome.err[-3000:])
    if outcome.code == 2:
        assert len(outcome.err_lines) == 1 and ": error: " in outcome.err, (name, outcome.err)
        assert snapshot(tmp_path) == {} and not work.exists(), name  # refused before anything was created
    elif outcome.code == 1:  # only the injector's own fault ends a run with 1
        assert len(outcome.err_lines) == 1 and "fault injector" in outcome.err, (name, outcome.err)
    else:
        assert outcome.err == "", (name, outcome.err)
