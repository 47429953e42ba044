"""scripts/tools/deepspeed_checkpoint_fixtures.py writes tests/fixtures/deepspeed_checkpoints again, where DeepSpeed is
installed (requirements-bench.txt; CI installs only requirements.txt and reads the committed files): every tensor,
counter and recorded loss of the new files equals the committed ones', so the committed fixtures are what DeepSpeed
0.19's engine writes for the script's runs (a torch file's bytes differ between saves by its random serialization
id, so the files are compared by what they hold).

    DS_ACCELERATOR=cpu python -m pytest -n 0 tests/scripts/test_deepspeed_checkpoint_fixtures.py   # in the bench venv
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "tests" / "fixtures" / "deepspeed_checkpoints"


def read_case(folder: Path, case: str, universal: bool) -> tuple[dict, object]:
    from tests.checkpoint.test_deepspeed_checkpoints import source

    src = source(case, universal, folder)
    tensors = {key: {name: src.read(key, name, tuple(slice(0, d) for d in info.shape))
                     for name, info in src.tensors(key).items()} for key in src.keys()}
    return tensors, src.progress()


@pytest.mark.slow
def test_the_script_writes_again_what_the_committed_fixtures_hold(tmp_path):
    pytest.importorskip("deepspeed", reason="DeepSpeed is in requirements-bench.txt, not requirements.txt")
    out = tmp_path / "deepspeed_checkpoints"
    completed = subprocess.run([sys.executable, str(ROOT / "scripts/tools/deepspeed_checkpoint_fixtures.py"), "--out",
                                str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                               env=dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT)))
    assert completed.returncode == 0, completed.stderr[-3000:]
    new, old = (json.loads((folder / "losses.json").read_text()) for folder in (out, COMMITTED))
    assert new["cases"] == old["cases"]
    for name in ("tokens.bin", "tokens.idx"):
        assert (out / "data" / name).read_bytes() == (COMMITTED / "data" / name).read_bytes()
    for case, record in old["cases"].items():
        for universal in (False, True) if "deepspeed_resumed_from_universal" in record else (False,):
            (new_tensors, new_progress), (old_tensors, old_progress) = (read_case(folder, case, universal)
                                                                        for folder in (out, COMMITTED))
            assert new_progress == old_progress, (case, universal)
            for key, tensors in old_tensors.items():
                for name, tensor in tensors.items():
                    assert torch.equal(new_tensors[key][name], tensor), (case, universal, key, name)
