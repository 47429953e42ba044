"""The checkpoint an offline tool reads: this project's format (and, for convert_to_hf.py, Megatron-LM's torch_dist), or
one line saying how to bring another over (resume from it with --save).
"""

from __future__ import annotations

import os
from pathlib import Path

from base.errors import CheckpointError
from checkpoint.format import resolve_checkpoint
from checkpoint.formats import MEGATRON, ZERO_GPT, CheckpointFormat, format_of, locate


def tool_checkpoint(checkpoint: str | os.PathLike, tool: str) -> Path:
    """`resolve_checkpoint` for a tool that reads this project's format alone."""
    return tool_checkpoint_and_format(checkpoint, tool)[0]


def tool_checkpoint_and_format(checkpoint: str | os.PathLike, tool: str, reads_megatron: bool = False
                               ) -> tuple[Path, CheckpointFormat]:
    """`resolve_checkpoint` for a tool, and the format found: ours, or torch_dist where `reads_megatron`."""
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
