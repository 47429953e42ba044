"""The one door that tells which format a checkpoint is in: an ordered registry of the formats `--load` reads. Each
entry recognises its checkpoints and names a handler module (imported on demand) with `check_start` and `load_resume`;
DeepSpeed's is asked first, then Megatron-LM's torch_dist, then ours.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from checkpoint.deepspeed.files import find_deepspeed_checkpoint
from checkpoint.torch_dist.common import is_megatron_checkpoint


@dataclass(frozen=True)
class CheckpointFormat:
    name: str                       # in messages: "<name> checkpoint"
    holds: Callable[[Path], bool]   # whether a checkpoint folder (resolved) is of this format, by its content
    handler: str
    # From --load (and --universal-checkpoint): the folder to read and how it was named; None: our pointer files.
    locate: Optional[Callable[[Path, bool], Optional[tuple[Path, Optional[str]]]]] = None

    def module(self):
        return importlib.import_module(self.handler)


def _locate_deepspeed(load: Path, universal: bool) -> Optional[tuple[Path, Optional[str]]]:
    found = find_deepspeed_checkpoint(load, universal)
    return None if found is None else (found.path, found.named_by)


DEEPSPEED = CheckpointFormat("DeepSpeed's", lambda path: find_deepspeed_checkpoint(path, False) is not None,
                             "checkpoint.deepspeed.resume", _locate_deepspeed)
MEGATRON = CheckpointFormat("Megatron-LM's torch_dist", is_megatron_checkpoint, "checkpoint.torch_dist.resume")
ZERO_GPT = CheckpointFormat("this project's", lambda path: True, "checkpoint.ours.resume")
FORMATS = (DEEPSPEED, MEGATRON, ZERO_GPT)  # in the order they are asked; ours, the last, takes the rest


def locate(load: Path, universal: bool) -> Optional[tuple[CheckpointFormat, Path, Optional[str]]]:
    """The first format that finds its checkpoint from `load` its own way: (it, the folder, how it was named)."""
    for fmt in FORMATS:
        found = fmt.locate(load, universal) if fmt.locate is not None else None
        if found is not None:
            return fmt, *found
    return None


def format_of(path: Path) -> CheckpointFormat:
    """The format of the checkpoint folder `path` (resolved: an iteration directory or a tag folder)."""
    return next(fmt for fmt in FORMATS if fmt.holds(Path(path)))


def format_named(name: str) -> CheckpointFormat:
    return next(fmt for fmt in FORMATS if fmt.name == name)


def writer_for(config) -> CheckpointFormat:
    """The format --save writes: Megatron-LM's torch_dist with --ckpt-format torch_dist where it holds the run, else
    ours."""
    torch_dist = config.checkpoint.ckpt_format == "torch_dist" and config.megatron_format_unwritten() is None
    return MEGATRON if torch_dist else ZERO_GPT


# --init-from-hf reads a Hugging Face folder; the package is imported only when asked for.
PRETRAINED_HANDLER = "checkpoint.hf.source"


def initialize_from_pretrained(optimizer, model, folder, model_config, state) -> None:
    """Fill the built model and its optimizer's master from the pretrained `folder` (--init-from-hf)."""
    importlib.import_module(PRETRAINED_HANDLER).initialize_from_hf(optimizer, model, folder, model_config, state)


def pretrained_vocab_size(folder) -> int:
    """The embedding rows of the pretrained `folder` (--init-from-hf: its config.json's vocab_size)."""
    from arguments.hf_config import read_hf_config

    return read_hf_config(folder).vocab_size
