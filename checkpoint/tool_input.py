"""The checkpoint an offline tool (scripts/convert_to_hf.py, zero_to_fp32.py, reshard_checkpoint.py) reads: this
project's format (and, for convert_to_hf.py, Megatron-LM's torch_dist), or one line saying how to bring another
format over.

`--load` also reads a Megatron-LM torch_dist folder (checkpoint/megatron_resume.py) and a DeepSpeed one
(checkpoint/deepspeed_resume.py), and a user who trained from one reasonably hands it to the tools next; they read
this project's files (metadata.json's file table, safetensors), and before this such a folder was met with
"format version None" or "'global_step2' is not an iteration directory name". The way over is a run: one resumed
from the folder with --save (and no --ckpt-format torch_dist) writes this project's checkpoint, which every tool
reads.
"""

from __future__ import annotations

import os
from pathlib import Path

from base.errors import CheckpointError
from checkpoint.deepspeed_files import find_deepspeed_checkpoint
from checkpoint.format import resolve_checkpoint
from checkpoint.megatron_common import is_megatron_checkpoint


def tool_checkpoint(checkpoint: str | os.PathLike, tool: str, reads_megatron: bool = False) -> Path:
    """`resolve_checkpoint` for a tool: the iteration directory of this project's format (module docstring), or of
    Megatron-LM's torch_dist where the tool reads that too (`reads_megatron`: scripts/convert_to_hf.py, through
    checkpoint/megatron_hf.py)."""
    how = (f"pretrain_gpt.py --load reads it: resume it with the same flags and a --save (this project's format, "
           f"no --ckpt-format torch_dist) and give {tool} that folder")
    deepspeed = find_deepspeed_checkpoint(Path(checkpoint), False)
    if deepspeed is not None:
        raise CheckpointError(f"{checkpoint} is DeepSpeed's checkpoint ({deepspeed.path.name}), which {tool} does "
                              f"not read; {how}")
    iteration_dir = resolve_checkpoint(checkpoint)
    if is_megatron_checkpoint(iteration_dir) and not reads_megatron:
        raise CheckpointError(f"{iteration_dir} is a Megatron-LM torch_dist checkpoint, which {tool} does not read; "
                              f"{how}")
    return iteration_dir
