"""The checkpoint writer: staged tensors per file in, files on disk out.

Its input is what the save plan (checkpoint/save_plan.py) stages for one rank, a sequence of `StagedFile`s:
each a file name, its tensors by name (CPU copies, or views of the live optimizer partition that must not change
until the write returns) and its header metadata (JSON-able: a partition's fragment table, the records of the
slices it holds, a rank's RNG states). It writes each as a safetensors file into the staging directory, fsynced,
and returns each file's size and content hash; it knows nothing of models, optimizers or process groups. The
commit (metadata.json, `latest`, Megatron's tracker file) is the caller's, once every rank's write has finished
(checkpoint/ours/sharded.py), so a background writer can take the same input after staging the tensors to host memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import torch

from checkpoint.format import save_tensors
from checkpoint.integrity import hash_files


@dataclass
class StagedFile:
    """One file of a rank's share of a checkpoint, ready to write."""
    name: str
    tensors: dict[str, torch.Tensor]
    header: dict = field(default_factory=dict)
    # where metadata.json lists the file: ("model_files", [tp, name]), ("expert_model_files", [tp, ep, name,
    # [parameter names]]), ("optimizer_shards", [tp, dp, name]) or ("rng_files", [tp, dp, name])
    listing: tuple[str, list] = ("", [])
    holds: tuple[str, ...] = ()  # a model file's parameter names (metadata.json's pipeline stages list them)

    @property
    def nbytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in self.tensors.values())


def write_files(directory: Path, files: Iterable[StagedFile]) -> tuple[dict[str, int], dict[str, str], list]:
    """Write `files` into `directory` (one at a time, each dropped once written, so a lazily staged sequence holds
    one file's copies at a time); returns ({name: bytes on disk}, {name: content hash}, [(each file's listing,
    the parameter names it holds)])."""
    sizes: dict[str, int] = {}
    listings = []
    for staged in files:
        sizes[staged.name] = save_tensors(directory / staged.name, staged.tensors, staged.header)
        listings.append((staged.listing, staged.holds))
        del staged
    return sizes, hash_files(directory, sizes), listings  # hashed while still in the page cache
