"""scripts/ by purpose: launchers at the top, benchmarks in bench/, tools in tools/, the paper's kit in zero_paper/;
a script one folder down still finds the repository from any working folder."""

import subprocess
from pathlib import Path

import pytest

from tests.user_folder import bare_venv, clean_env

ROOT = Path(__file__).resolve().parents[2]
LAUNCHERS = {"launch.py", "timed_launch.py", "launch_single_node.sh", "launch_multi_node.sh", "slurm_dgx2.sbatch",
             "gpu_lease.sh", "gpu_smoke.sh"}


def test_the_top_of_scripts_holds_the_launchers_and_three_folders():
    tracked = subprocess.run(["git", "ls-files", "scripts"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    top = {Path(name).parts[1] for name in tracked}
    assert top == LAUNCHERS | {"bench", "tools", "zero_paper"}, sorted(top - LAUNCHERS)


@pytest.mark.parametrize("script", ["scripts/bench/benchmark_saved_bytes.py", "scripts/tools/layout_fuzz.py"])
def test_a_script_in_a_folder_runs_from_another_folder(script, tmp_path):
    """Each imports `scripts.bench.*` or `scripts.timed_launch`: in a virtualenv without this repository on its
    path, only the root the script finds from its own folder provides them."""
    python = bare_venv(tmp_path / "venv") / "python"
    done = subprocess.run([str(python), str(ROOT / script), "--help"], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]
