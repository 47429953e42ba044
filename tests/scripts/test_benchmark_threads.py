"""scripts/bench/benchmark_threads.py: each thread count trains in every round, the order alternating, and each
figure is the median of the iteration times the run wrote, with the load average beside it."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "16",
              "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2",
              "--tokenizer-vocab-size", "300", "--device", "cpu"]


@pytest.mark.slow
def test_two_rounds_alternate_and_every_figure_comes_from_the_runs_records(tmp_path, corpus_cache_300):
    out = tmp_path / "threads.json"
    completed = subprocess.run([sys.executable, str(ROOT / "scripts/bench/benchmark_threads.py"), "--threads", "1",
                                "2", "--rounds", "2", "--train-iters", "3", "--json", str(out), "--", *TINY_MODEL,
                                "--data-cache-dir", corpus_cache_300],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [(row["round"], row["threads"]) for row in report["rows"]] == [(0, 1), (0, 2), (1, 2), (1, 1)]
    for row in report["rows"]:
        assert len(row["iteration_ms"]) == 3 and len(row["losses"]) == 3
        assert row["median_ms_after_first"] == pytest.approx(statistics.median(row["iteration_ms"][1:]))
        assert len(row["load_average_before"]) == len(row["load_average_after"]) == 3
    for threads in ("1", "2"):
        assert report["median_ms_by_threads"][threads] == pytest.approx(statistics.median(
            row["median_ms_after_first"] for row in report["rows"] if str(row["threads"]) == threads))
    assert report["losses_equal"] is True  # the thread count does not change the math here
    assert completed.stdout.strip().splitlines()[-1] == "losses equal across thread counts (5 decimals): True"
