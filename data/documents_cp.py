"""Document masking under context parallelism: the masks of the whole sample, split as the tokens are.

Megatron-LM builds a sample's loss mask and position ids over the whole sequence (megatron/core/datasets/
gpt_dataset.py `_get_ltor_masks_and_position_ids`, in the dataset, before any rank sees it); then
`get_batch_on_this_cp_rank` (megatron/core/utils.py; megatron/training/utils.py before core_v0.13) views every
tensor of the batch - tokens, labels, loss_mask, position_ids, and attention_mask along its query dimension - as
[2CP, S / 2CP] along the sequence and keeps chunks r and 2CP-1-r on CP rank r. A token's mask and position
therefore travel with it, and a document that crosses a chunk boundary keeps its positions and its mask.

Here every CP rank reads the same micro-batch (parallel/context_parallel.py), so each builds the whole sample's
masks (data/documents.py) and keeps its chunks of the position ids and the loss mask. --reset-attention-mask's
[S, S] mask is not built: the CP attention (gpt/cp_attention.py) needs only each token's document, which it
compares between its queries and each block of keys it holds, so `document_ids` stays whole ([batch, S], global
order) on every rank. The goldfish loss's windows read the whole sample's labels before the split, as the fork
builds them in its dataset.
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
    """The masks of the whole micro-batch `inputs`/`labels` [batch, S], as CP rank `cp_rank` of `cp_size` holds
    them: its chunks of the position ids and loss mask ([batch, S / CP]), the whole sample's document ids."""
    whole = masking.masks(inputs, labels, dense_attention_mask=False)
    return DocumentMasks(position_ids=_chunks(whole.position_ids, cp_size, cp_rank),
                         loss_mask=_chunks(whole.loss_mask, cp_size, cp_rank),
                         document_ids=whole.document_ids)
