"""scripts/bench/fp8_curves.py: every figure of its summary comes from the runs' metrics files, a run cut short is
compared with bf16 at the iteration it reached, and the curves are drawn by training.plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import fp8_curves  # noqa: E402


def test_a_run_cut_short_is_compared_with_bf16_where_it_stopped():
    base = {"iterations": 20, "losses": [10.0 - 0.25 * i for i in range(20)]}
    run = {"iterations": 12, "losses": [10.0 - 0.2 * i for i in range(12)]}
    got = fp8_curves.compare(run, base)
    assert got["at_iteration"] == 12
    assert got["final_loss"] == run["losses"][11] and got["bf16_final_loss"] == base["losses"][11]
    assert got["final_vs_bf16"] == pytest.approx(run["losses"][11] / base["losses"][11] - 1)
    assert got["mean_last_10"] == pytest.approx(sum(run["losses"][2:12]) / 10)
    assert got["mean_last_10_vs_bf16"] == pytest.approx(sum(run["losses"][2:12]) / sum(base["losses"][2:12]) - 1)


def test_the_runs_flags_name_format_and_recipe():
    assert fp8_curves.run_flags("bf16") == []
    assert fp8_curves.run_flags("mxfp8-hybrid") == ["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"]


@pytest.mark.slow
def test_two_iterations_of_bf16_and_mxfp8_summarized_from_their_metrics(tmp_path, corpus_cache_300):
    done = subprocess.run([sys.executable, str(ROOT / "scripts/bench/fp8_curves.py"), str(tmp_path), "--iterations",
                           "2", "--recipes", "mxfp8", "--jobs", "2", "--", "--data-cache-dir", corpus_cache_300,
                           "--tokenizer-vocab-size", "300"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary["runs"]) == ["bf16", "mxfp8-hybrid"]
    for name, run in summary["runs"].items():
        records = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        assert run["losses"] == [r["loss"] for r in records if "loss" in r and "split" not in r]
        assert run["at_iteration"] == 2 and run["final_loss"] == run["losses"][-1]
    bf16, mxfp8 = summary["runs"]["bf16"], summary["runs"]["mxfp8-hybrid"]
    assert mxfp8["final_vs_bf16"] == pytest.approx(mxfp8["losses"][-1] / bf16["losses"][-1] - 1)
    assert mxfp8["losses"] != bf16["losses"]  # FP8 GEMMs ran
    assert mxfp8["guard"]["fp8_cast_values"] > 0 and bf16["guard"]["fp8_cast_values"] == 0
    assert "--fp8-recipe mxfp8: 16 linears in FP8" in (tmp_path / "mxfp8-hybrid.log").read_text()
    assert (tmp_path / "fp8-curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(summary["wall_s"]) == {"bf16", "mxfp8-hybrid"} and len(summary["load_average_after"]) == 3
