"""The checkpoint an offline tool (scripts/tools/convert_to_hf.py, zero_to_fp32.py, reshard_checkpoint.py) reads: this
project's format (and, for convert_to_hf.py, Megatron-LM's torch_dist), or one line saying how to bring another
format over.

`--load` also reads a Megatron-LM torch_dist folder (checkpoint/torch_dist/resume.py) and a DeepSpeed one
(checkpoint/deepspeed/resume.py), and a user who trained from one reasonably hands it to the tools next; they read
this project's files (metadata.json's file table, safetensors), and before this such a folder was met with
"format version None" or "'global_step2' is not an iteration directory name". The way over is a run: one resumed
from the folder with --save (and no --ckpt-format torch_dist) writes this project's checkpoint, which every tool
reads.
"""

from __future__ import annotations

import os
from pathlib import Path

from base.errors import CheckpointError
from checkpoint.format import resolve_checkpoint
from checkpoint.formats import MEGATRON, ZERO_GPT, CheckpointFormat, format_of, locate


def tool_checkpoint(checkpoint: str | os.PathLike, tool: str) -> Path:
    """`resolve_checkpoint` for a tool that reads this project's format alone (module docstring)."""
    return tool_checkpoint_and_format(checkpoint, tool)[0]


def tool_checkpoint_and_format(checkpoint: str | os.PathLike, tool: str, reads_megatron: bool = False
                               ) -> tuple[Path, CheckpointFormat]:
    """`resolve_checkpoint` for a tool, and the format it found: this project's (module docstring), or Megatron-LM's
    torch_dist where the tool reads that too (`reads_megatron`: scripts/tools/convert_to_hf.py, through
    checkpoint/megatron_hf.py)."""
    how = (f"pretrain_gpt.py --load reads it: resume it with the same flags and a --save (this project's format, "
           f"no --ckpt-format torch_dist) and give {tool} that folder")
    located = locate(Path(checkpoint), False)
    if located is not None:
        fmt, folder, _ = located
        raise CheckpointError(f"{checkpoint} is {fmt.name} checkpoint ({folder.name}), which {tool} does not read; "
                              f"{how}")
    iteration_dir = resolve_checkpoint(checkpoint)
    fmt = format_of(iteration_dir)
    if fmt is not ZERO_GPT and not (fmt is MEGATRON and reads_megatron):
        raise CheckpointError(f"{iteration_dir} is {fmt.name} checkpoint, which {tool} does not read; {how}")
    return iteration_dir, fmt
