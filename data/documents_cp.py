"""Document masking under context parallelism: each CP rank builds the whole sample's masks and keeps its chunks of the
position ids and loss mask (r and 2CP-1-r, as Megatron's get_batch_on_this_cp_rank splits them); the document ids stay
whole for the CP attention.
"""

from __future__ import annotations

from typing import Optional

import torch

from data.documents import DocumentMasking, DocumentMasks
from parallel.context_parallel import take_local_chunks


def _chunks(tensor: Optional[torch.Tensor], cp_size: int, cp_rank: int) -> Optional[torch.Tensor]:
    return None if tensor is None else take_local_chunks(tensor, cp_size, cp_rank, dim=1)


def masks_on_this_rank(masking: DocumentMasking, inputs: torch.Tensor, labels: torch.Tensor, cp_size: int,
                       cp_rank: int) -> DocumentMasks:
    """The whole micro-batch's masks as CP rank `cp_rank` holds them: its chunks of positions and loss mask, the whole
    document ids."""
    whole = masking.masks(inputs, labels, dense_attention_mask=False)
    return DocumentMasks(position_ids=_chunks(whole.position_ids, cp_size, cp_rank),
                         loss_mask=_chunks(whole.loss_mask, cp_size, cp_rank),
                         document_ids=whole.document_ids)
