"""--enable-ft-package's parts without a launch (issue 69, item 5): the monitor's clock (resilience/ft_monitor.py), the
timeouts learned with --calc-ft-timeouts as Megatron-LM's ft_integration.py and nvidia-resiliency-ext's
timeouts_calc.py learn them, ft_launcher's timeout arguments in scripts/launch.py, the refusal without --save, and
the line a restart prints (resilience/restart_progress.py). The faults themselves: tests/scripts/test_restart_in_job.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resilience.fault_tolerance import FaultTolerance, merged, parse_section_timeouts
from resilience.ft_monitor import SectionClock
from resilience.restart_progress import RestartProgress
from tests.reliability_helpers import train

REPO = Path(__file__).resolve().parents[2]
NO_TIMEOUTS = {"setup": None, "step": None, "checkpointing": None, "out_of_section": None}


def test_the_clock_finds_the_open_section_past_its_timeout_and_out_of_section_time_only_after_warmup():
    clock = SectionClock({"step": 2.0, "setup": None, "out_of_section": 5.0}, warmup_iterations=2, now=0.0)
    clock.event("open setup", 0.0)
    assert clock.overrun(1000.0) is None  # no timeout: not watched (nvidia-resiliency-ext's default)
    clock.event("close setup", 1000.0)
    assert clock.overrun(1010.0) is None  # out of section, but still in the warm-up iterations
    clock.event("iterations 2", 1010.0)
    assert clock.overrun(1010.0) == ("out-of-section", 10.0, 5.0)
    clock.event("open step", 1010.0)
    assert clock.overrun(1011.9) is None
    assert clock.overrun(1012.5) == ("step", 2.5, 2.0)
    clock.event('timeouts {"step": 4.0}', 1012.5)  # learned timeouts replace the launcher's
    assert clock.overrun(1012.5) is None


def test_the_monitor_kills_its_rank_once_a_section_runs_past_its_timeout(tmp_path):
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    monitor = subprocess.Popen([sys.executable, str(REPO / "resilience" / "ft_monitor.py"), str(rank.pid), "3", "0",
                                json.dumps({"step": 0.3})], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        monitor.stdin.write("open step\n")
        monitor.stdin.flush()
        assert rank.wait(timeout=20) == -signal.SIGKILL
        assert monitor.wait(timeout=20) == 0
        line = monitor.stderr.read()
        assert line.startswith("pretrain_gpt.py: error: rank 3: its step section has run ") and \
            "over its 0.3 s timeout (--enable-ft-package)" in line, line
    finally:
        rank.kill()
        monitor.kill()


def test_timeouts_are_learned_as_megatron_learns_them_and_kept_for_the_next_start(tmp_path):
    """ft_integration.py `_maybe_update_timeouts`: the step after 16 iterations, setup after a loaded checkpoint,
    checkpointing after a save, out-of-section at the end when those were all seen; x5 (safety_factor), an even
    average with an earlier learned value (timeouts_calc.py `_get_merged_section_timeouts`)."""
    lines = []
    ft = FaultTolerance(0, str(tmp_path), calc_timeouts=True, warmup_iterations=0, timeouts=NO_TIMEOUTS,
                        log=lines.append)
    try:
        ft.checkpoint_loaded()
        for _ in range(15):
            ft.step_start()
            ft.step_end()
        ft.checkpointing_start()
        time.sleep(0.05)
        ft.checkpointing_end()
        assert ft.learned == {"setup", "checkpointing"}  # 15 iterations: not yet the step
        assert ft.timeouts["checkpointing"] == pytest.approx(5 * ft.times.longest["checkpointing"])
        assert ft.timeouts["checkpointing"] >= 0.25 and ft.timeouts["step"] is None
        ft.step_start()
        ft.step_end()
        ft.close()
        assert ft.learned == {"setup", "step", "checkpointing", "out_of_section"}
        assert ft.timeouts["step"] == pytest.approx(5 * ft.times.longest["step"])
    finally:
        ft.close(finished=False)
    saved = json.loads((tmp_path / "ft_state.json").read_text())
    assert saved["timeouts"] == ft.timeouts and "> FT: timeouts learned for" in lines[0]
    again = FaultTolerance(0, str(tmp_path), calc_timeouts=True, warmup_iterations=0, timeouts=NO_TIMEOUTS,
                           log=lines.append)
    again.close(finished=False)
    assert again.timeouts == ft.timeouts and again.learned == ft.learned
    assert merged(10.0, 20.0, current_learned=True) == 15.0 and merged(10.0, 20.0, current_learned=False) == 20.0


def test_ft_launchers_timeout_arguments_go_to_the_ranks_and_off_torchruns_arguments():
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from launch import take_ft_timeouts
    finally:
        sys.path.remove(str(REPO / "scripts"))
    rest, timeouts = take_ft_timeouts(["--max-restarts", "2", "--ft-rank_section_timeouts=setup:600,step:180",
                                       "--ft-rank-out-of-section-timeout", "300", "--nproc_per_node", "2",
                                       "pretrain_gpt.py", "--train-iters", "3"])
    assert rest == ["--max-restarts", "2", "--nproc_per_node", "2", "pretrain_gpt.py", "--train-iters", "3"]
    assert timeouts == {"setup": 600.0, "step": 180.0, "out_of_section": 300.0}
    assert parse_section_timeouts("setup:none,checkpointing:420") == {"setup": None, "checkpointing": 420.0}
    with pytest.raises(ValueError, match="section:seconds"):
        parse_section_timeouts("warmup:5")


def test_enable_ft_package_without_save_is_refused_in_one_line(corpus_cache, tmp_path):
    outcome = train(corpus_cache, tmp_path, "--enable-ft-package")
    outcome.one_error_line("--enable-ft-package needs --save", "ft_integration.setup")


def test_a_restart_says_which_iterations_were_redone_and_how_long_the_recovery_took(tmp_path):
    environ = {"TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "2"}
    first = RestartProgress(str(tmp_path), 0, environ, log=pytest.fail, clock=iter([10.0, 11.0, 12.0]).__next__)
    for iteration in (1, 2, 3):
        first.finished(iteration)
    lines = []
    restarted = RestartProgress(str(tmp_path), 1, {**environ, "TORCHELASTIC_RESTART_COUNT": "1"}, log=lines.append,
                                clock=iter([20.0, 21.5]).__next__)  # resumed from the checkpoint at iteration 1
    restarted.finished(2)
    assert lines == []  # not yet back where the fault found the job
    restarted.finished(3)
    assert lines == ["> recovered (torchrun restart 1 of 2): the previous incarnation had finished iteration 3, this "
                     "one resumed from the checkpoint at iteration 1: iterations 2-3 redone; 8.0 s from iteration 3's "
                     "end to the first iteration after the restart, 9.5 s to iteration 3 again"]
    assert json.loads((tmp_path / "restart_progress.json").read_text())["iteration"] == 3
    assert not os.path.exists(tmp_path / "restart_progress.tmp")
