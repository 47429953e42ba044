"""Issue 49, point 6: under plain torchrun a run's one-line error is not the last thing printed. The
README and docs/launching.md tell a Megatron-LM script to put scripts/launch.py in torchrun's place; this checks
the reason docs/launching.md gives still holds in the installed torch, and that the launcher keeps the one line last.

torch 2.13: `torch/distributed/launcher/api.py` `launch_agent` raises `ChildFailedError` whenever the
agent's result `is_failed()` (any rank exiting non-zero, with or without an error file), and
`torch/distributed/run.py` `main`, wrapped in `record` (`torch/distributed/elastic/multiprocessing/errors/
__init__.py`), re-raises it, so Python prints its traceback with the failure table. A rank has no exit
status the agent treats otherwise: only 0 counts as success, which would hide the failure from the job.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BAD_FLAG_LINE = ("pretrain_gpt.py: error: unrecognized arguments: --no-such-flag (--no-such-flag: no flag of that "
                 "name or near it (python pretrain_gpt.py --help lists them))")


def launch(launcher: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *launcher, "--standalone", "--nproc_per_node", "1",
                           str(REPO / "pretrain_gpt.py"), "--no-such-flag"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_the_docs_put_launch_py_in_torchruns_place_and_its_reason_holds(tmp_path):
    advice = "From a Megatron-LM script, put `python scripts/launch.py` in the place of `torchrun`"
    readme, page = (" ".join((REPO / name).read_text().split()) for name in ("README.md", "docs/launching.md"))
    assert advice in readme and advice in page
    assert "about 30 lines of torchrun's `ChildFailedError` traceback and exit 1" in page

    plain = launch(["-m", "torch.distributed.run"], tmp_path)
    lines = plain.stderr.strip().splitlines()
    assert plain.returncode == 1 and BAD_FLAG_LINE in lines, plain.stderr
    after = lines[lines.index(BAD_FLAG_LINE) + 1:]
    assert 25 <= len(after) <= 45 and any("ChildFailedError" in line for line in after), plain.stderr

    launched = launch([str(REPO / "scripts" / "launch.py")], tmp_path)
    assert launched.returncode == 2 and launched.stderr.splitlines() == [BAD_FLAG_LINE], launched.stderr
