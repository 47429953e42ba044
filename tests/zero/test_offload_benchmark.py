"""scripts/bench/benchmark_host_adam.py runs and reports what it times (DeepSpeed is not installed in the test
environment, so it says so and times ours alone)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_host_adam_benchmark_prints_medians_and_the_load():
    result = subprocess.run([sys.executable, "scripts/bench/benchmark_host_adam.py", "--numel", "4096", "--rounds", "2",
                             "--steps", "1", "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "partition 4,096 fp32 elements, 1 thread(s), 2 rounds x 1 steps" in result.stdout
    assert "load average" in result.stdout and "load average after" in result.stdout
    for kind in ("fused", "foreach"):
        assert f"  {kind:<10} median " in result.stdout
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        assert "DeepSpeedCPUAdam is not available" in result.stderr


def test_the_benchmark_refuses_a_count_below_one():
    result = subprocess.run([sys.executable, "scripts/bench/benchmark_host_adam.py", "--rounds", "0"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--rounds must be at least 1, got 0" in result.stderr
