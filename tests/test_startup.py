"""The first seconds of a new user (issue 34, point 5): `--help` and `--print-config` answer without
importing the compiler. tests/test_from_any_folder.py installs the repository as the README does and runs
its commands from another folder."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Imported by torch.compiler.disable and torch.compile only: 1.5 s idle, about 6 s on a loaded machine,
# which made `--help` take 15 s. A wall-clock bound would be flaky on a shared machine; the import is not.
COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "sympy")


@pytest.mark.parametrize("flag", ["--help", "--print-config"])
def test_help_and_print_config_do_not_import_the_compiler(tmp_path, flag):
    result = subprocess.run([sys.executable, "-X", "importtime", str(REPO / "pretrain_gpt.py"), flag],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "torch" in imported  # the profile was read: torch itself is still imported
    assert not imported & set(COMPILER_MODULES), sorted(imported & set(COMPILER_MODULES))
