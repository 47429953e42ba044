"""Which run a save or a metrics record belongs to. `run_id` names the lineage (new at a fresh start or --finetune, kept
by resumes) and `launch_id` this launch; a run only removes saves and records of its own lineage, which also keeps its
sample order.
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
    sample_order: str = APPENDABLE_ORDER

    def fields(self) -> dict[str, str]:
        """The keys every save's metadata and every metrics record carry."""
        return {"run_id": self.run_id, "launch_id": self.launch_id}

    def metadata_fields(self) -> dict[str, str]:
        return {**self.fields(), SAMPLE_ORDER_KEY: self.sample_order}


def identity_on_start(resumed_metadata: Optional[dict], finetune: bool, fresh_run_id: str,
                      launch_id: str, fresh_order: str = APPENDABLE_ORDER) -> RunIdentity:
    """A resume keeps its checkpoint's lineage and sample order; a fresh start, a fine-tune or a checkpoint without one
    takes `fresh_run_id` (made by rank 0) and `fresh_order`."""
    saved = (resumed_metadata or {}).get("run_id")
    resumed = resumed_metadata is not None and not finetune
    keeps_lineage = resumed and isinstance(saved, str)
    order = resumed_metadata.get(SAMPLE_ORDER_KEY, APPENDABLE_ORDER) if resumed else fresh_order
    if order not in SAMPLE_ORDERS:
        raise CheckpointError(f"the checkpoint's {SAMPLE_ORDER_KEY} {order!r} is none of {', '.join(SAMPLE_ORDERS)}")
    return RunIdentity(saved if keeps_lineage else fresh_run_id, launch_id, order)
