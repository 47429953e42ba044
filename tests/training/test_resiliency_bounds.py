"""Every fault-tolerance, flight-recorder and FP8 value the issue found ending in a traceback, a dead thread or a
fault that never comes is one line, exit 2, before any work, nothing written in the folders named (issue 79 item 3).

Before, in order: `--inprocess-active-world-size` above the launched processes was TooFewProcesses' traceback from
the first incarnation; `--flight-recorder-trace-buffer-size 10**12` a MemoryError (the ring's slots are allocated
at the start); `--fault-injector-fault-probabilities nan` random.choices' "Total of weights must be finite" after the
build; `--fault-injector-fault-delay 1e300` (and the MTTI and offset) killed the injector's thread
("timestamp out of range for platform time_t") and the run ended 0; `--fault-injector-delay-start-iteration -1`, or
one past the run, and `--fault-injector-num-ranks 0` planned a fault that never came; 1e300 seconds of
`--inprocess-*` or `--heartbeat-timeout-seconds` overflowed a wait; `--fp8-margin 64` ended in "int too big to
convert" at the first delayed-scaling cast. Megatron-Core's words where it refuses the same
(megatron/core/fault_injector.py: "Fault ranks must be between 0 and ...", "Number of fault types and fault
probabilities must match", random.sample's "Sample larger than population or is negative").
"""

from __future__ import annotations

import pytest

import pretrain_gpt
from tests.reliability_helpers import TINY, run_main, snapshot

INJECT = ["--fault-injector-ranks", "0", "--fault-injector-fault-types", "workload_exc"]
CASES = {
    "active world above the launch": (["--inprocess-restart", "--inprocess-active-world-size", "4"],
                                      "--inprocess-active-world-size 4 is more than the 1 launched process"),
    "a ring of 10**12 collectives": (["--flight-recorder-dump-path", "FR/", "--flight-recorder-trace-buffer-size",
                                      str(10**12)], "--flight-recorder-trace-buffer-size 1000000000000: a ring"),
    "NaN weights": (INJECT + ["--fault-injector-fault-probabilities", "nan", "--fault-injector-fault-delay", "9"],
                    "--fault-injector-fault-probabilities nan: finite, non-negative weights"),
    "a weight per type": (INJECT + ["--fault-injector-fault-probabilities", "1,1", "--fault-injector-fault-delay",
                                    "9"], "Number of fault types and fault probabilities must match"),
    "a delay of 1e300 s": (INJECT + ["--fault-injector-fault-delay", "1e300"],
                           "--fault-injector-fault-delay must be a number of seconds from 0 up to 31536000 s"),
    "an MTTI of 1e300 s": (INJECT + ["--fault-injector-mtti-seconds", "1e300"], "--fault-injector-mtti-seconds"),
    "an offset of 1e300 s": (INJECT + ["--fault-injector-mtti-seconds", "1", "--fault-injector-offset-seconds", "1e300"],
                         "--fault-injector-offset-seconds"),
    "a start iteration never reached": (INJECT + ["--fault-injector-delay-start-iteration", "-1",
                                                  "--fault-injector-fault-delay", "0"], "would never fire"),
    "a start iteration past the run": (INJECT + ["--fault-injector-delay-start-iteration", "2",
                                                 "--fault-injector-fault-delay", "0"], "never reaches it"),
    "no rank drawn": (["--fault-injector-num-ranks", "0", "--fault-injector-fault-types", "workload_exc",
                       "--fault-injector-fault-delay", "0"], "would never fire"),
    "a rank outside the world": (["--fault-injector-ranks", "1", "--fault-injector-fault-types", "workload_exc",
                                  "--fault-injector-fault-delay", "0"], "Fault ranks must be between 0 and 0"),
    "more ranks than the world": (["--fault-injector-num-ranks", "1", "--fault-injector-fault-types", "sigkill",
                                   "--fault-injector-fault-delay", "0"], "Sample larger than population"),
    "an in-process timeout of 1e300 s": (["--inprocess-barrier-timeout", "1e300"], "--inprocess-barrier-timeout"),
    "a heartbeat timeout of 1e300 s": (["--heartbeat-timeout-seconds", "1e300"], "--heartbeat-timeout-seconds"),
    "an FP8 margin past int64": (["--fp8-format", "hybrid", "--fp8-margin", "64"], "--fp8-margin 64"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_bad_resiliency_value_is_one_line_before_any_work(corpus_cache_300, tmp_path, name):
    flags, words = CASES[name]
    flags = [str(tmp_path / flag) if flag == "FR/" else flag for flag in flags]
    before = snapshot(tmp_path)
    outcome = run_main(pretrain_gpt.main, TINY + ["--data-cache-dir", corpus_cache_300, "--metrics-file",
                                                  tmp_path / "metrics.jsonl", "--save", tmp_path / "ck", "--load",
                                                  tmp_path / "ck", *flags])
    outcome.one_error_line(words)
    assert snapshot(tmp_path) == before and sorted(tmp_path.iterdir()) == []  # nothing created, nothing written
