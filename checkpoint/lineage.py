"""Which run a save or a metrics record belongs to.

Runs share folders: several runs append to one metrics file, and `--overwrite-save` lets a new run
write into a save directory an old run left checkpoints in. Whatever a run removes -- the records a
resume redoes, the checkpoints `--keep-last` retires -- must be its own, so every save and every
record names its run:

- `run_id`, the lineage: a new uuid at a fresh start (and at `--finetune`, which starts a new sample
  sequence), kept by every resume, since a resumed run continues the same iterations;
- `launch_id`, this launch: a new uuid every start, so a lineage's launches can be told apart.

A lineage also reads its samples in one order, chosen at its start (arguments/config.py `sample_order`: Megatron-Core's
where the run writes Megatron-LM's torch_dist checkpoints, else this project's) and kept by every resume, since a
checkpoint's consumed-samples count is a position in the order it was trained in: each save of ours records it,
and a Megatron-LM checkpoint's is Megatron-Core's (checkpoint/torch_dist/resume.py).

A checkpoint saved before identities existed has no `run_id`; a run resuming it adopts a new lineage
(its own older saves and records then count as another run's: kept, never removed).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Optional

from base.errors import CheckpointError
from data.gpt_dataset import APPENDABLE_ORDER
from data.megatron_order import MEGATRON_ORDER

SAMPLE_ORDER_KEY = "sample_order"
SAMPLE_ORDERS = (APPENDABLE_ORDER, MEGATRON_ORDER)


def new_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class RunIdentity:
    run_id: str     # the lineage, kept across resumes
    launch_id: str  # this launch only
    sample_order: str = APPENDABLE_ORDER  # the lineage's (module docstring)

    def fields(self) -> dict[str, str]:
        """The keys every save's metadata and every metrics record carry."""
        return {"run_id": self.run_id, "launch_id": self.launch_id}

    def metadata_fields(self) -> dict[str, str]:
        """The keys every save's metadata carries."""
        return {**self.fields(), SAMPLE_ORDER_KEY: self.sample_order}


def identity_on_start(resumed_metadata: Optional[dict], finetune: bool, fresh_run_id: str,
                      launch_id: str, fresh_order: str = APPENDABLE_ORDER) -> RunIdentity:
    """The lineage of a resume is its checkpoint's; a fresh start, a fine-tuning start and a resume of
    a checkpoint without one take `fresh_run_id` (made once, by rank 0, so every rank agrees). The sample order of a
    resume is its checkpoint's (this project's where a save from before the key holds none), else `fresh_order`."""
    saved = (resumed_metadata or {}).get("run_id")
    resumed = resumed_metadata is not None and not finetune
    keeps_lineage = resumed and isinstance(saved, str)
    order = resumed_metadata.get(SAMPLE_ORDER_KEY, APPENDABLE_ORDER) if resumed else fresh_order
    if order not in SAMPLE_ORDERS:
        raise CheckpointError(f"the checkpoint's {SAMPLE_ORDER_KEY} {order!r} is none of {', '.join(SAMPLE_ORDERS)}")
    return RunIdentity(saved if keeps_lineage else fresh_run_id, launch_id, order)
