"""Document masking's masks (data/documents.py) are Megatron-LM's, and the masked loss is Megatron-Core's reduction.

The reference below is a transcription of Megatron-LM's `_get_ltor_masks_and_position_ids`
(megatron/core/datasets/gpt_dataset.py at d98e8a64; Megatron-DeepSpeed's megatron/utils.py
get_ltor_masks_and_position_ids is the same loop), run per sample; ours is vectorized over the micro-batch."""

import pytest
import torch

from data.documents import DocumentMasking, DocumentMasks, masked_token_mean

EOD = 7


def megatron_masks(data: torch.Tensor, eod_token: int, reset_position_ids: bool, reset_attention_mask: bool,
                   eod_mask_loss: bool):
    """Megatron-LM's _get_ltor_masks_and_position_ids with create_attention_mask=True, line for line."""
    seq_length = data.numel()
    attention_mask = torch.tril(torch.ones((seq_length, seq_length))).unsqueeze(0)
    loss_mask = torch.ones(seq_length, dtype=torch.float)
    if eod_mask_loss:
        loss_mask[data == eod_token] = 0.0
    position_ids = torch.arange(seq_length, dtype=torch.long)
    if reset_position_ids:
        position_ids = position_ids.clone()
    if reset_position_ids or reset_attention_mask:
        eod_index = position_ids[data == eod_token]
        if reset_position_ids:
            eod_index = eod_index.clone()
        prev_index = 0
        for j in range(eod_index.numel()):
            i = eod_index[j]
            if reset_attention_mask:
                attention_mask[0, (i + 1):, :(i + 1)] = 0
            if reset_position_ids:
                position_ids[(i + 1):] -= i + 1 - prev_index
                prev_index = i + 1
    attention_mask = attention_mask < 0.5
    return attention_mask, loss_mask, position_ids


@pytest.mark.parametrize("flags", [(True, False, False), (False, True, False), (False, False, True),
                                   (True, True, True)])
def test_masks_equal_megatrons_per_sample_loop(flags):
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 10, (6, 40), generator=generator)  # about one EOD in ten
    tokens[0, 0] = tokens[0, -1] = EOD      # an EOD first and last
    tokens[1] = EOD                         # nothing but EODs
    tokens[2][tokens[2] == EOD] = 0         # no EOD at all
    masks = DocumentMasking.of(EOD, *flags).masks(tokens)
    reset_position_ids, reset_attention_mask, eod_mask_loss = flags
    for row, sample in enumerate(tokens):
        attention_mask, loss_mask, position_ids = megatron_masks(sample, EOD, *flags)
        if reset_position_ids:
            assert torch.equal(masks.position_ids[row], position_ids), row
        if reset_attention_mask:  # ours says where attention is allowed (SDPA), Megatron's where it is masked
            assert torch.equal(masks.attention_mask[row], ~attention_mask), row
        if eod_mask_loss:
            assert torch.equal(masks.loss_mask[row], loss_mask), row
    assert (masks.position_ids is None) != reset_position_ids
    assert (masks.attention_mask is None) != reset_attention_mask
    assert (masks.loss_mask is None) != eod_mask_loss


def test_no_flag_builds_nothing():
    assert DocumentMasking.of(EOD, False, False, False) is None


def test_masked_loss_is_megatron_cores_sum_over_num_tokens():
    """pretrain_gpt.py loss_func: sum(losses * loss_mask) and num_tokens = loss_mask.sum() over the micro-batch;
    schedules.py forward_step_calc_loss divides by torch.clamp(num_tokens, min=1)."""
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    assert masked_token_mean(losses, DocumentMasks(loss_mask=mask)).item() == pytest.approx((1 + 3 + 6) / 3)
    assert masked_token_mean(losses, DocumentMasks(loss_mask=torch.zeros(2, 3))).item() == 0.0
    assert masked_token_mean(losses, None).item() == pytest.approx(3.5)


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_ranks_hold_their_chunks_of_the_whole_samples_masks(cp):
    """data/documents_cp.py, as Megatron-LM's get_batch_on_this_cp_rank splits loss_mask and position_ids: rank r's
    position ids and loss mask are chunks r and 2CP-1-r of the whole sample's (a document's positions go on across
    a chunk's edge), and the document ids stay whole; the dense [S, S] mask is not built."""
    from data.documents_cp import masks_on_this_rank
    from parallel.context_parallel import take_local_chunks

    tokens = torch.randint(0, 10, (3, 24), generator=torch.Generator().manual_seed(1))
    masking = DocumentMasking.of(EOD, True, True, True)
    whole = masking.masks(tokens)
    for rank in range(cp):
        local = masks_on_this_rank(masking, tokens, tokens, cp, rank)
        assert torch.equal(local.position_ids, take_local_chunks(whole.position_ids, cp, rank))
        assert torch.equal(local.loss_mask, take_local_chunks(whole.loss_mask, cp, rank))
        assert torch.equal(local.document_ids, whole.document_ids) and local.attention_mask is None
    # the document ids say what the dense mask says: same document and not later
    same = whole.document_ids[:, :, None] == whole.document_ids[:, None, :]
    assert torch.equal(whole.attention_mask[:, 0], same & torch.ones(24, 24, dtype=torch.bool).tril())
