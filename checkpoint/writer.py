"""The checkpoint writer: staged tensors per file in, fsynced safetensors files out, with each file's size and content
hash. It knows nothing of models or process groups; the commit (metadata.json, `latest`) is the caller's once every rank
has written.
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
    """One file of a rank's share of a checkpoint; its tensors may view the live partition, unchanged until written."""
    name: str
    tensors: dict[str, torch.Tensor]
    header: dict = field(default_factory=dict)
    # Where metadata.json lists the file, e.g. ("model_files", [tp, name]).
    listing: tuple[str, list] = ("", [])
    holds: tuple[str, ...] = ()  # a model file's parameter names (metadata.json's pipeline stages list them)

    @property
    def nbytes(self) -> int:
        return sum(tensor.numel() * tensor.element_size() for tensor in self.tensors.values())


def write_files(directory: Path, files: Iterable[StagedFile]) -> tuple[dict[str, int], dict[str, str], list]:
    """Write `files` one at a time (each dropped once written, so a lazy sequence holds one file's copies); returns
    (sizes, content hashes, listings)."""
    sizes: dict[str, int] = {}
    listings = []
    for staged in files:
        sizes[staged.name] = save_tensors(directory / staged.name, staged.tensors, staged.header)
        listings.append((staged.listing, staged.holds))
        del staged
    return sizes, hash_files(directory, sizes), listings  # hashed while still in the page cache
