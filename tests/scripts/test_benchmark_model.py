"""scripts/bench/benchmark_model.py: its quick mode runs both models, and the figures it prints follow from
the times it measured (tokens/s from the best round, the ratio from the two tokens/s)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_quick_mode_prints_the_table_the_profile_and_the_ratio_last(tmp_path):
    out = tmp_path / "model.json"
    completed = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "benchmark_model.py"), "--quick",
                                "--profile", "--profile-rounds", "1", "--json", str(out)],
                               capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.strip().splitlines()
    match = re.fullmatch(r"ours/hf tokens/s ratio: (\d+\.\d\d)", lines[-1])
    assert match, lines[-1]

    rows = {row["impl"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ours", "hf"}
    tokens_per_iteration = 4 * 64
    for row in rows.values():
        assert len(row["step_times_s"]) == len(row["cpu_times_s"]) == 6 and min(row["step_times_s"]) > 0
        assert row["tokens_per_s"] == pytest.approx(tokens_per_iteration / min(row["step_times_s"]))
        assert all(math.isfinite(loss) and 5 < loss < 15 for loss in row["losses"])  # near ln(50257)
    assert match.group(1) == f"{rows['ours']['tokens_per_s'] / rows['hf']['tokens_per_s']:.2f}"

    table = {line.split(" | ")[0].lstrip("| "): line for line in lines if line.startswith("| ours") or line.startswith("| hf")}
    for impl, row in rows.items():
        assert f"| {row['tokens_per_s']:,.1f} |" in table[impl]
    cpu_line = next(line for line in lines if line.startswith("ours/hf by median CPU time per iteration: "))
    median = {impl: sorted(row["cpu_times_s"])[2:4] for impl, row in rows.items()}  # six rounds: the middle two
    assert cpu_line.endswith(f"{sum(median['hf']) / sum(median['ours']):.2f}")
    assert any(line.startswith("| total self CPU |") for line in lines)
    assert any(line.startswith("| aten::mm |") for line in lines)
