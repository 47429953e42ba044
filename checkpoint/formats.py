"""The one door that tells which format a checkpoint is in: an ordered registry of the formats `--load` reads.

Each entry knows how to recognise its checkpoints and names the module that resumes from them. That module
(its "handler", imported only when a checkpoint of the format is met: Megatron-LM's pulls in DCP) defines
`check_start(config, state, path, log, batch) -> (kept schedule, metadata)`, run on every rank before any work,
and `load_resume(path, model, optimizer, rng, state, model_config, *, load_optimizer, load_rng, finetune)`, the
load into the built model (checkpoint/global_load.py's `load_from_source` under each). The order decides: DeepSpeed's
first (a save directory whose `latest` names one of its tag folders, or that folder), then Megatron-LM's torch_dist
(an iteration directory whose metadata.json is Megatron-Core's), then this project's own. Each format is a package
(checkpoint/ours/, torch_dist/, deepspeed/; its handler is the package's resume.py) over the core beside this file: a
new read-only format is one package and one entry here (docs/layout.md).
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
    handler: str                    # the module with check_start and load_resume (module docstring)
    # from what --load names (and --universal-checkpoint): the folder to read and a note on how it was named, for a
    # format whose save directories point at their checkpoints their own way; None: the project's pointer files
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
    """The format --save writes: Megatron-LM's torch_dist layout with --ckpt-format torch_dist where that layout
    holds the run (arguments/config.py megatron_format_unwritten says what it does not), else this project's."""
    torch_dist = config.checkpoint.ckpt_format == "torch_dist" and config.megatron_format_unwritten() is None
    return MEGATRON if torch_dist else ZERO_GPT


# The weights a fresh run starts from instead of its initializer (--init-from-hf): a Hugging Face folder, read as a
# GlobalStateSource each rank reads its own shard of; the package is imported only when a run asks for it.
PRETRAINED_HANDLER = "checkpoint.hf.source"


def initialize_from_pretrained(optimizer, model, folder, model_config, state) -> None:
    """Fill the built model and its optimizer's master from the pretrained `folder` (--init-from-hf)."""
    importlib.import_module(PRETRAINED_HANDLER).initialize_from_hf(optimizer, model, folder, model_config, state)


def pretrained_vocab_size(folder) -> int:
    """The embedding rows of the pretrained `folder` (--init-from-hf: its config.json's vocab_size)."""
    from arguments.hf_config import read_hf_config

    return read_hf_config(folder).vocab_size
