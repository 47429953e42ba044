"""scripts/bench/benchmark_index.py: the synthetic corpus it writes, and its small mode with and without
megatron-core (CI installs only requirements.txt, so the comparison must step aside cleanly)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench" / "benchmark_index.py"
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
import benchmark_index  # noqa: E402


@pytest.mark.parametrize("source", benchmark_index.SOURCES, ids=lambda s: s.name)
def test_document_lengths_add_up_and_follow_the_source(source):
    tokens = 3_000_000
    lengths = benchmark_index.document_lengths(source, tokens, seed=5)
    assert lengths.sum() == tokens
    assert lengths.min() >= 1 and lengths.max() <= benchmark_index.LONGEST_DOCUMENT
    assert np.median(lengths) == pytest.approx(source.median_tokens, rel=0.25)


def run_small(tmp_path: Path, hide_megatron: bool) -> subprocess.CompletedProcess:
    """The script's --small mode in a fresh interpreter; `hide_megatron` makes its import fail there,
    as on a machine without requirements-bench.txt."""
    argv = [str(SCRIPT), "--small", "--json", str(tmp_path / "times.json")]
    code = ("import runpy, sys\n"
            + ("sys.modules['megatron'] = None\n" if hide_megatron else "")
            + f"sys.argv = {argv!r}\n"
            + f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                               cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    return completed


@pytest.mark.slow
def test_small_mode_without_megatron_times_ours_alone(tmp_path):
    completed = run_small(tmp_path, hide_megatron=True)
    assert "megatron-core is not installed" in completed.stderr
    lines = completed.stdout.strip().splitlines()
    assert lines[-1] == "ours/megatron index build ratio: skipped (megatron-core not installed)"
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| stage")]
    assert [row.split(" | ")[0].lstrip("| ") for row in rows] == list(benchmark_index.STAGES)
    assert all(row.endswith("| - | - |") for row in rows)
    times = json.loads((tmp_path / "times.json").read_text())["times_s"]
    assert all(impl == "ours" for impl in (key.split(" | ")[1] for key in times))
    assert all(len(values) == 2 and min(values) > 0 for values in times.values())


@pytest.mark.slow
def test_small_mode_against_megatron_checks_the_indices_and_reports_the_ratio(tmp_path):
    pytest.importorskip("megatron.core.datasets.helpers_cpp", reason="megatron-core is a benchmark-only peer")
    completed = run_small(tmp_path, hide_megatron=False)
    assert "sample index: identical" in completed.stderr
    times = json.loads((tmp_path / "times.json").read_text())["times_s"]
    ours = min(times["end-to-end build, cold cache | ours"])
    theirs = min(times["end-to-end build, cold cache | megatron"])
    last = completed.stdout.strip().splitlines()[-1]
    assert last == f"ours/megatron index build ratio: {ours / theirs:.2f}"
