"""Which run a save or a metrics record belongs to.

Runs share folders: several runs append to one metrics file, and `--overwrite-save` lets a new run
write into a save directory an old run left checkpoints in. Whatever a run removes -- the records a
resume redoes, the checkpoints `--keep-last` retires -- must be its own, so every save and every
record names its run:

- `run_id`, the lineage: a new uuid at a fresh start (and at `--finetune`, which starts a new sample
  sequence), kept by every resume, since a resumed run continues the same iterations;
- `launch_id`, this launch: a new uuid every start, so a lineage's launches can be told apart.

A checkpoint saved before identities existed has no `run_id`; a run resuming it adopts a new lineage
(its own older saves and records then count as another run's: kept, never removed).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Optional


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class RunIdentity:
    run_id: str     # the lineage, kept across resumes
    launch_id: str  # this launch only

    def fields(self) -> dict[str, str]:
        """The keys every save's metadata and every metrics record carry."""
        return {"run_id": self.run_id, "launch_id": self.launch_id}


def identity_on_start(resumed_metadata: Optional[dict], finetune: bool, fresh_run_id: str,
                      launch_id: str) -> RunIdentity:
    """The lineage of a resume is its checkpoint's; a fresh start, a fine-tuning start and a resume of
    a checkpoint without one take `fresh_run_id` (made once, by rank 0, so every rank agrees)."""
    saved = (resumed_metadata or {}).get("run_id")
    keeps_lineage = resumed_metadata is not None and not finetune and isinstance(saved, str)
    return RunIdentity(saved if keeps_lineage else fresh_run_id, launch_id)
