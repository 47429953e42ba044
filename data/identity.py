"""Which files a `--data-path` reads, as content, not as the string typed, so a resume can tell the same data from the
same words. A file's identity is its size and a sha256 of its first and last `SAMPLED_BYTES` (a change confined to the
middle goes unseen).
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional, Sequence

from data.gpt_dataset import parse_data_path
from data.indexed import data_file_path, index_file_path

SAMPLED_BYTES = 1 << 16


def file_identity(path: str) -> str:
    """`size:<bytes>:sha256:<digest of the first and last SAMPLED_BYTES>`; raises OSError."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest.update(f.read(SAMPLED_BYTES))
        if size > SAMPLED_BYTES:
            f.seek(max(SAMPLED_BYTES, size - SAMPLED_BYTES))
            digest.update(f.read(SAMPLED_BYTES))
    return f"size:{size}:sha256:{digest.hexdigest()}"


def data_identity(data_path: Sequence[str]) -> Optional[list[dict]]:
    """One entry per dataset of `--data-path`: its weight, the resolved prefix, and its files' identities. None for the
    embedded corpus or an unreadable file."""
    if not data_path:
        return None
    prefixes, weights = parse_data_path(data_path)
    try:
        return [{"weight": weight, "prefix": os.path.realpath(prefix),
                 "idx": file_identity(index_file_path(prefix)), "bin": file_identity(data_file_path(prefix))}
                for prefix, weight in zip(prefixes, weights or [None] * len(prefixes))]
    except OSError:
        return None


def same_data(saved: list[dict], ours: list[dict]) -> Optional[str]:
    """None when two identities name the same content and weights; else the first dataset that differs."""
    if len(saved) != len(ours):
        return f"{len(ours)} datasets, the checkpoint's {len(saved)}"
    for saved_entry, our_entry in zip(saved, ours):
        if saved_entry.get("weight") != our_entry["weight"]:
            return (f"weight {_weight(our_entry['weight'])} of {our_entry['prefix']}, the checkpoint's "
                    f"{_weight(saved_entry.get('weight'))}")
        if (saved_entry.get("idx"), saved_entry.get("bin")) != (our_entry["idx"], our_entry["bin"]):
            return (f"{our_entry['prefix']}.bin/.idx hold other content than the checkpoint's "
                    f"{saved_entry.get('prefix')}")
    return None


def _weight(weight: Optional[float]) -> str:
    return "by size (no weight given)" if weight is None else f"{weight:g}"
