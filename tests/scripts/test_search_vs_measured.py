"""scripts/bench/search_vs_measured.py: the search's flag lines train on 4 gloo ranks (the pipelined one with the
--pipeline-model-parallel-layout the search printed), and every figure reported comes from the runs' records."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_two_layouts_train_side_by_side_and_the_ratio_is_the_measured_one(tmp_path, corpus_cache, monkeypatch):
    """The script's `main` here, each layout's launch with its 4 ranks forked (tests/forked_runs.py: the same command
    line and records; a launcher and 4 fresh interpreters a layout took most of the test's time importing torch).
    tests/scripts/test_layout_fuzz.py runs scripts/timed_launch.py's launch itself."""
    import scripts.bench.search_vs_measured as search_vs_measured
    import scripts.timed_launch
    from tests.forked_runs import forked_launch

    monkeypatch.setattr(scripts.timed_launch, "launch", forked_launch)  # what step_times calls
    out = tmp_path / "search.json"
    assert search_vs_measured.main(["--rounds", "1", "--iterations", "2", "--skip", "1", "--layouts", "2", "--output",
                                    str(out), "--data-cache-dir", corpus_cache]) == 0
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
