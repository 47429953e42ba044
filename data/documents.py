"""Document masking: Megatron's --reset-position-ids, --reset-attention-mask and --eod-mask-loss, as its
_get_ltor_masks_and_position_ids builds them, vectorized per micro-batch on the device; Megatron-Core's pad id rule;
and swiss-ai's goldfish loss (--goldfish-loss), which drops about 1 in K labels by a hash of the H labels before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

GOLDFISH_HASH_TABLE_SIZE = 1_000_003
GOLDFISH_HASH_SEED = 2971215073
_GOLDFISH_TABLES: dict[torch.device, torch.Tensor] = {}


def goldfish_hash_table(device: torch.device) -> torch.Tensor:
    """The fork's table, drawn on the CPU as it draws it, then kept on `device`."""
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
    """One micro-batch's masks, None where off: position_ids [batch, seq]; attention_mask [batch, 1, seq, seq] bool,
    True where attending (SDPA's convention); loss_mask [batch, seq] float; document_ids [batch, seq] for context
    parallelism."""
    position_ids: Optional[torch.Tensor] = None
    attention_mask: Optional[torch.Tensor] = None
    loss_mask: Optional[torch.Tensor] = None
    document_ids: Optional[torch.Tensor] = None


def megatron_pad_id(pad_id: Optional[int], named: str, eod_id: int, allow_ambiguous: bool, from_flag: bool
                    ) -> tuple[Optional[int], Optional[str]]:
    """The pad id Megatron-Core's MegatronDataset keeps (None: none) and the start-up line saying so: it drops a pad
    equal to the eod (to that check a text tokenizer's special tokens are its eos and eod: it has no
    special_tokens_dict) unless --allow-ambiguous-pad-tokens. A pad the user did not name (`from_flag`) is said."""
    if pad_id is None:
        return None, None
    if pad_id == eod_id and not allow_ambiguous:
        return None, (f"> {named} is the end-of-document id: no pad id, as Megatron-Core's MegatronDataset resets "
                      f"it (--allow-ambiguous-pad-tokens keeps it)")
    kept = f"no loss where the label is {pad_id}, fed as token 0, as Megatron-Core's GPTDataset"
    if pad_id == eod_id:
        return pad_id, f"> {named} is the end-of-document id; kept under --allow-ambiguous-pad-tokens: {kept}"
    return pad_id, None if from_flag else f"> {named}: {kept}"


@dataclass(frozen=True)
class DocumentMasking:
    """The three flags, the goldfish K and H, the EOD id and the pad id; `masks(inputs, labels)` builds a
    micro-batch's masks, `unpadded` feeds token 0 for the pad id, as Megatron-Core's GPTDataset.__getitem__."""
    eod_id: int
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False
    goldfish: Optional[tuple[int, int]] = None  # (k, h) with --goldfish-loss
    pad_id: Optional[int] = None  # megatron_pad_id's

    @property
    def masks_loss(self) -> bool:
        """Whether each micro-batch carries a loss mask (--eod-mask-loss, --goldfish-loss, a pad id)."""
        return self.eod_mask_loss or self.goldfish is not None or self.pad_id is not None

    @classmethod
    def of(cls, eod_id: int, reset_position_ids: bool, reset_attention_mask: bool,
           eod_mask_loss: bool, goldfish: Optional[tuple[int, int]] = None,
           pad_id: Optional[int] = None) -> Optional["DocumentMasking"]:
        """The masking the flags ask for, or None when none is set (the default path: nothing is built)."""
        if not (reset_position_ids or reset_attention_mask or eod_mask_loss or goldfish or pad_id is not None):
            return None
        return cls(int(eod_id), reset_position_ids, reset_attention_mask, eod_mask_loss, goldfish, pad_id)

    def unpadded(self, tokens: torch.Tensor) -> torch.Tensor:
        """`tokens` with the pad id as 0, which the embedding (and the loss, masked there) can read."""
        return tokens if self.pad_id is None else tokens.masked_fill(tokens == self.pad_id, 0)

    def masks(self, inputs: torch.Tensor, labels: Optional[torch.Tensor] = None,
              dense_attention_mask: bool = True) -> DocumentMasks:
        """The masks of input tokens `inputs` [batch, seq]; goldfish reads `labels`. `dense_attention_mask` False:
        document ids only, no [seq, seq] mask."""
        is_eod = inputs == self.eod_id
        seq = inputs.shape[1]
        index = torch.arange(seq, device=inputs.device)
        position_ids = attention_mask = loss_mask = document = None
        if self.reset_position_ids:
            # A document starts after the last EOD before it; the position is i - start[i].
            after_eod = torch.where(is_eod, index + 1, torch.zeros_like(index))
            start = torch.cummax(after_eod, dim=1).values
            start = torch.cat((torch.zeros_like(start[:, :1]), start[:, :-1]), dim=1)
            position_ids = index - start
        if self.reset_attention_mask:
            # An EOD belongs to the document it ends.
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
        if self.pad_id is not None:
            if labels is None:
                raise ValueError("the pad id's mask needs the micro-batch's labels")
            unpadded = (labels != self.pad_id).float()
            loss_mask = unpadded if loss_mask is None else loss_mask * unpadded
        return DocumentMasks(position_ids, attention_mask, loss_mask, document)


def masked_token_mean(per_token_loss: torch.Tensor, documents: Optional[DocumentMasks]) -> torch.Tensor:
    """A micro-batch's loss in fp32: the mean, or with a loss mask Megatron-Core's sum(loss x mask) / max(sum(mask), 1).
    """
    if documents is None or documents.loss_mask is None:
        return per_token_loss.float().mean()
    loss_mask = documents.loss_mask
    return (per_token_loss.float() * loss_mask).sum() / loss_mask.sum().clamp(min=1.0)
