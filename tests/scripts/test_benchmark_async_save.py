"""scripts/bench/benchmark_async_save.py's quick mode: a round trains without saves, with synchronous saves and with
--async-save, each figure comes from the runs' own lines, and what the saves added is a span less the same round's
run without saves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_quick_round_runs_each_mode_and_reads_its_saves_from_the_runs(tmp_path, corpus_cache):
    out = tmp_path / "async.json"
    completed = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "benchmark_async_save.py"), "--quick",
                                "--train-iters", "4", "--save-interval", "2", "--json", str(out), "--",
                                "--data-cache-dir", corpus_cache], capture_output=True, text=True, timeout=300,
                               cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:] + completed.stdout[-2000:]
    report = json.loads(out.read_text())
    runs = {run["mode"]: run for run in report["runs"]}
    assert [run["mode"] for run in report["runs"]] == ["none", "sync", "async"]
    assert runs["none"]["losses"] == runs["sync"]["losses"] == runs["async"]["losses"] and \
        len(runs["none"]["losses"]) == 4
    assert [save["mib"] > 0 for save in runs["sync"]["saves"]] == [True, True]
    assert [save["iteration"] for save in runs["async"]["saves"]] == [2, 4]
    assert runs["async"]["saves"][-1]["committed"] == "at the end of training"
    for save in runs["async"]["saves"]:
        assert save["staged_mib"] > 0 and save["written_mib"] > 0 and save["blocked_s"] >= save["staging_s"] >= 0
    for mode in ("sync", "async"):
        assert runs[mode]["added_s"] == pytest.approx(runs[mode]["span_s"] - runs["none"]["span_s"])
        assert report["added_s_median"][mode] == pytest.approx(runs[mode]["added_s"])
        assert len(runs[mode]["load_average_before"]) == 3
    assert completed.stdout.strip().splitlines()[-1].startswith("the saves added ")
