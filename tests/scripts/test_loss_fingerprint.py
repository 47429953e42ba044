"""scripts/tools/loss_fingerprint.py, the check a refactor that must not change the math runs at two commits: one of its
runs end to end, as a user runs the script (it read runs/metrics.jsonl, which a run no longer writes by default,
and stopped on every run)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.test_layering import ROOT


def test_one_run_gives_each_iterations_loss_and_norm_exactly(tmp_path):
    out = tmp_path / "fingerprint.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts/tools/loss_fingerprint.py"), str(out), "default"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(out.read_text())
    assert list(runs) == ["default"] and [row[0] for row in runs["default"]] == [1, 2, 3]
    assert all(float(loss) > 0 and float(norm) > 0 for _, loss, norm in runs["default"])
