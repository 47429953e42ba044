"""The offline tools given a folder `--load` reads in another framework's format, and an export killed mid-write
(issue 79 item 5).

Before: scripts/tools/convert_to_hf.py (and zero_to_fp32.py, reshard_checkpoint.py) on a Megatron-LM torch_dist folder
said "format version None", on a DeepSpeed one "'global_step2' is not an iteration directory name"; now one line names
the format and the way over (a resume with --save writes this project's format), exit 2, nothing written;
convert_to_hf.py reads a Megatron-LM folder itself (tests/checkpoint/test_megatron_to_hf.py). And a SIGKILL
during an export left its hidden `.OUT.partial-<pid>` beside OUT_DIR for good; the next export on the host removes
the ones whose process is gone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.tools import convert_to_hf, reshard_checkpoint, zero_to_fp32
from tests.reliability_helpers import run_main, snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FOREIGN = {"megatron torch_dist": (FIXTURES / "megatron_tp1", "is Megatron-LM's torch_dist checkpoint"),
           "deepspeed": (FIXTURES / "deepspeed_checkpoints" / "megatron_deepspeed_zero1", "DeepSpeed's checkpoint")}
TOOLS = {"convert_to_hf": lambda ck, out: (convert_to_hf.main, [ck, out / "hf"]),
         "zero_to_fp32": lambda ck, out: (zero_to_fp32.main, [ck, out / "model.safetensors"]),
         "reshard_checkpoint": lambda ck, out: (reshard_checkpoint.main, [ck, out / "tp2",
                                                                           "--tensor-model-parallel-size", "2"])}


# scripts/tools/convert_to_hf.py reads Megatron-LM's torch_dist itself (tests/checkpoint/test_megatron_to_hf.py)
REFUSING = [(tool, kind) for tool in sorted(TOOLS) for kind in sorted(FOREIGN)
            if (tool, kind) != ("convert_to_hf", "megatron torch_dist")]


@pytest.mark.parametrize("tool, kind", REFUSING)
def test_a_tool_given_another_frameworks_checkpoint_says_so_in_one_line(tool, kind, tmp_path):
    folder, words = FOREIGN[kind]
    before = snapshot(folder)
    main, argv = TOOLS[tool](folder, tmp_path)
    outcome = run_main(main, argv)
    outcome.one_error_line(words, f"scripts/tools/{tool}.py does not read", "pretrain_gpt.py --load reads it")
    assert snapshot(folder) == before and list(tmp_path.iterdir()) == []


def test_an_export_killed_before_leaves_nothing_after_the_next(tmp_path):
    """The staging folder of an export whose process is gone (a SIGKILL) is removed by the next export on the
    host; one of a live process is not touched."""
    from checkpoint.hf.folders import read_hf_folder, write_hf_folder
    from tests.checkpoint.test_hf_checkpoint import HF_VOCAB, pretrain_config, random_hf_folder

    _, hf_state = read_hf_folder(random_hf_folder(tmp_path / "source"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    prefix = f".out.partial-{socket.gethostname()}-"
    killed, alive = tmp_path / f"{prefix}{gone.stdout.strip()}", tmp_path / f"{prefix}{os.getppid()}"
    for staging in (killed, alive):
        staging.mkdir()
        (staging / "model.safetensors").write_bytes(b"half")
    write_hf_folder(tmp_path / "out", hf_state, pretrain_config(HF_VOCAB).model)
    assert not killed.exists() and alive.exists() and (tmp_path / "out" / "config.json").is_file()
