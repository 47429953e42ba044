"""Document masking: Megatron's --reset-position-ids, --reset-attention-mask and --eod-mask-loss.

A sample is seq_length + 1 tokens cut from documents laid end to end, each ending in the end-of-document (EOD) id.
Megatron-LM's `_get_ltor_masks_and_position_ids` (megatron/core/datasets/gpt_dataset.py; Megatron-DeepSpeed's
megatron/utils.py the same) builds from a sample's input tokens, for each EOD index i:

- --reset-position-ids: position ids restart after each EOD, `position_ids[(i + 1):] -= i + 1 - prev`;
- --reset-attention-mask: `attention_mask[0, (i + 1):, :(i + 1)] = 0` on the causal mask: block-diagonal, one
  block per document (an EOD belongs to the document it ends);
- --eod-mask-loss: `loss_mask[data == eod_token] = 0`, the EOD's prediction of the next document is not trained.

Megatron loops over the EODs per sample in the dataset; here they are vectorized per micro-batch, on the device,
by every stage that reads the micro-batch (training/pipeline_step.py), and only when a flag asks.

swiss-ai's fork adds the goldfish loss (--goldfish-loss --goldfish-k K --goldfish-h H; its gpt_dataset.py
`apply_goldfish`): the product of each window of H consecutive labels (int64, wrapping), modulo 1,000,003, indexes a
table of uniform floats drawn once from a CPU generator seeded 2971215073 (`_create_hash_table`); below 1/K the
window's last label gets no loss. About 1 in K tokens is never trained on, the first H-1 labels of a sample never
dropped; a dropped token leaves the loss's sum and its token count alike (masked_token_mean), as Megatron's loss_func."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

# swiss-ai's fork (megatron/core/datasets/gpt_dataset.py): _HASH_TABLE_SIZE and _create_hash_table's seed
GOLDFISH_HASH_TABLE_SIZE = 1_000_003
GOLDFISH_HASH_SEED = 2971215073
_GOLDFISH_TABLES: dict[torch.device, torch.Tensor] = {}


def goldfish_hash_table(device: torch.device) -> torch.Tensor:
    """The fork's table, drawn as it draws it on the dataset's device (the CPU: its __getitem__ runs in the data
    loader), then kept on `device` once per device."""
    device = torch.device(device)
    if device not in _GOLDFISH_TABLES:
        generator = torch.Generator(device="cpu")
        generator.manual_seed(GOLDFISH_HASH_SEED)
        _GOLDFISH_TABLES[device] = torch.rand(GOLDFISH_HASH_TABLE_SIZE, generator=generator).to(device)
    return _GOLDFISH_TABLES[device]


def goldfish_kept(labels: torch.Tensor, k: int, h: int) -> torch.Tensor:
    """[batch, seq] float, 0 where the goldfish loss drops the label (apply_goldfish on each sample's labels)."""
    labels = labels.long()
    hashed = goldfish_hash_table(labels.device)[labels.unfold(1, h, 1).prod(dim=-1) % GOLDFISH_HASH_TABLE_SIZE]
    kept = torch.ones(labels.shape, dtype=torch.float32, device=labels.device)
    kept[:, h - 1:][hashed < 1 / k] = 0.0
    return kept


@dataclass(frozen=True)
class DocumentMasks:
    """One micro-batch's masks; each None where its flag is off. position_ids [batch, seq] (long);
    attention_mask [batch, 1, seq, seq] (bool, True where the query row may attend to the key column, causal
    included: SDPA's convention, the inverse of Megatron's); loss_mask [batch, seq] (float, 1 where trained).
    document_ids [batch, whole seq] (long; --reset-attention-mask): each token's document, counted from 0 along
    the whole sample; context parallelism's attention builds its blocks' masks from it (data/documents_cp.py)
    where the [seq, seq] mask of the whole sample is not built."""
    position_ids: Optional[torch.Tensor] = None
    attention_mask: Optional[torch.Tensor] = None
    loss_mask: Optional[torch.Tensor] = None
    document_ids: Optional[torch.Tensor] = None


@dataclass(frozen=True)
class DocumentMasking:
    """The three flags, the goldfish loss's K and H (None: off) and the tokenizer's EOD id; `masks(inputs, labels)`
    builds a micro-batch's DocumentMasks."""
    eod_id: int
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    goldfish: Optional[tuple[int, int]] = None  # (k, h) with --goldfish-loss

    @classmethod
    def of(cls, eod_id: int, reset_position_ids: bool, reset_attention_mask: bool,
           eod_mask_loss: bool, goldfish: Optional[tuple[int, int]] = None) -> Optional["DocumentMasking"]:
        """The masking the flags ask for, or None when none is set (the default path: nothing is built)."""
        if not (reset_position_ids or reset_attention_mask or eod_mask_loss or goldfish):
            return None
        return cls(int(eod_id), reset_position_ids, reset_attention_mask, eod_mask_loss, goldfish)

    def masks(self, inputs: torch.Tensor, labels: Optional[torch.Tensor] = None,
              dense_attention_mask: bool = True) -> DocumentMasks:
        """The masks of `inputs` [batch, seq], the input tokens (Megatron builds them from `tokens`, text[:-1]);
        the goldfish loss reads `labels` [batch, seq] (text[1:]). `dense_attention_mask` False: --reset-attention-mask
        gives only the document ids, not the [seq, seq] mask (context parallelism builds its own per block)."""
        is_eod = inputs == self.eod_id
        seq = inputs.shape[1]
        index = torch.arange(seq, device=inputs.device)
        position_ids = attention_mask = loss_mask = document = None
        if self.reset_position_ids:
            # A document starts after the last EOD before it: start[i] = max over j < i of (j + 1 if EOD at j),
            # 0 for the first; the position is i - start[i].
            after_eod = torch.where(is_eod, index + 1, torch.zeros_like(index))
            start = torch.cummax(after_eod, dim=1).values
            start = torch.cat((torch.zeros_like(start[:, :1]), start[:, :-1]), dim=1)
            position_ids = index - start
        if self.reset_attention_mask:
            # The document of token i counts the EODs before it (an EOD belongs to the document it ends).
            document = torch.cumsum(is_eod, dim=1) - is_eod.long()
            if dense_attention_mask:
                causal = torch.ones(seq, seq, dtype=torch.bool, device=inputs.device).tril()
                attention_mask = ((document[:, :, None] == document[:, None, :]) & causal).unsqueeze(1)
        if self.eod_mask_loss:
            loss_mask = (~is_eod).float()
        if self.goldfish is not None:
            if labels is None:
                raise ValueError("the goldfish loss's mask needs the micro-batch's labels")
            kept = goldfish_kept(labels, *self.goldfish)
            loss_mask = kept if loss_mask is None else loss_mask * kept
        return DocumentMasks(position_ids, attention_mask, loss_mask, document)


def masked_token_mean(per_token_loss: torch.Tensor, documents: Optional[DocumentMasks]) -> torch.Tensor:
    """A micro-batch's loss from its per-token losses [batch, seq], in fp32: the mean, or with a loss mask
    Megatron-Core's reduction, sum(loss x mask) / max(sum(mask), 1) over the whole micro-batch (pretrain_gpt.py
    loss_func: `torch.sum(losses * loss_mask)` and `num_tokens = loss_mask.sum()`; schedules.py forward_step_calc_loss:
    `output_tensor /= torch.clamp(num_tokens, min=1)`, then `/= num_microbatches` as the callers here divide by the
    accumulation steps). Without a mask it is the exact expression the default path always computed."""
    if documents is None or documents.loss_mask is None:
        return per_token_loss.float().mean()
    loss_mask = documents.loss_mask
    return (per_token_loss.float() * loss_mask).sum() / loss_mask.sum().clamp(min=1.0)
