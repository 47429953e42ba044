"""scripts/search_vs_measured.py: the search's flag lines train on 4 gloo ranks (the pipelined one with the
--pipeline-model-parallel-layout the search printed), and every figure reported comes from the runs' records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_two_layouts_train_side_by_side_and_the_ratio_is_the_measured_one(tmp_path, corpus_cache):
    out = tmp_path / "search.json"
    completed = subprocess.run([sys.executable, str(ROOT / "scripts" / "search_vs_measured.py"), "--rounds", "1",
                                "--iterations", "2", "--skip", "1", "--layouts", "2", "--output", str(out),
                                "--data-cache-dir", corpus_cache],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {row["layout"]: row for row in report["layouts"]}
    assert sorted(rows) == ["1", "2"] and report["rounds"] == 1
    # the top pick and the best pipelined layout (the top pick itself on this box) among them, trained with the
    # split the search priced
    assert any(row["pp"] == 2 and "--pipeline-model-parallel-layout 'Et|tL'" in row["flags"] for row in rows.values())
    assert all(row["steady_steps"] == 1 and row["measured_s"] > 0 and row["predicted_s"] > 0 for row in rows.values())
    fastest = min(rows.values(), key=lambda row: row["measured_s"])
    assert report["top_pick_over_fastest"] == pytest.approx(rows["1"]["measured_s"] / fastest["measured_s"], rel=1e-3)
    assert report["measured_ranking"][0] == fastest["layout"] and len(report["load_average"]) == 2
