"""The first seconds of a new user (issue 34, point 5): `--help` and `--print-config` answer without
importing the compiler, and the commands the README gives work from any folder."""

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


def _editable_lines() -> list[str]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.strip().startswith("-e ")]


def _run_module_from(folder: Path, site_dir: Path, module: str, *args: str) -> subprocess.CompletedProcess:
    # site.addsitedir reads the .pth files an install leaves there, as the interpreter's own
    # site-packages would (a --prefix install is not on this interpreter's path by itself).
    code = (f"import runpy, site, sys; site.addsitedir({str(site_dir)!r}); sys.argv = [{module!r}, *{list(args)!r}]; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=300)


def test_the_readme_install_makes_the_module_commands_work_from_any_folder(tmp_path):
    """Issue 34, point 5: `python -m zero.plan` and `python -m data.preprocess` failed with
    ModuleNotFoundError outside the repository root. `pip install -r requirements.txt` (the README's
    first half) now also installs the repository in editable mode; here its `-e` line is installed
    into a scratch prefix (offline: this interpreter's setuptools builds it) and the commands run from
    a folder outside the repository."""
    editable = _editable_lines()
    assert editable == ["-e ."], editable
    prefix, elsewhere = tmp_path / "prefix", tmp_path / "elsewhere"
    elsewhere.mkdir()
    site_dir = prefix / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    before = _run_module_from(elsewhere, site_dir, "zero.plan", "--help")
    if before.returncode != 0:  # what the issue saw; where this interpreter's own environment was set up
        assert "ModuleNotFoundError" in before.stderr  # by `pip install -r requirements.txt` (CI), it already works
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                              "--no-build-isolation", "--prefix", str(prefix), *editable[0].split()],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-2000:]
    for module in ("zero.plan", "data.preprocess"):
        result = _run_module_from(elsewhere, site_dir, module, "--help")
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() and "Traceback" not in result.stderr
    assert not any(elsewhere.iterdir())  # nothing written where the command ran
