"""--reset-position-ids, --reset-attention-mask and --eod-mask-loss in the model, on a two-document sample, against
references built by hand: the plain model run on each document separately, a hand-written list of positions, and
the hand-masked mean.

Megatron-LM's semantics (megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids): positions restart
after each EOD, a token attends only to its own document (the EOD belongs to the document it ends), the loss is 0
where the input token is the EOD. Positions reach the learned position embedding only: Megatron-Core's
GPTModel._preprocess calls `self.rotary_pos_emb(rotary_seq_len, ...)` for 'rope' (position_ids go to the embedding
and to mrope only), and Megatron-DeepSpeed's TransformerLanguageModel.forward `self.rotary_pos_emb(self.seq_length)`.
"""


import torch

from base.options import replace_settings
from data.documents import DocumentMasking, masked_token_mean
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from parallel.state import ParallelState

SINGLE = ParallelState(device=torch.device("cpu"))
EOD = 99
GPT2_CONFIG = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16,
                          max_position_embeddings=16, vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)
LLAMA_CONFIG = replace_settings(GPT2_CONFIG, normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
                                   num_query_groups=2)
FIRST = 6  # document A: inputs 0..5, its EOD at 5; document B: inputs 6..15


def sample() -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, EOD, (1, 17), generator=torch.Generator().manual_seed(3))
    tokens[0, FIRST - 1] = EOD
    return tokens[:, :-1], tokens[:, 1:]


def flagged(model, inputs, labels, *flags) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token losses and the micro-batch's loss with the flags (reset positions, reset attention, mask loss)."""
    masks = DocumentMasking.of(EOD, *flags).masks(inputs)
    per_token = model(inputs, labels, masks)
    return per_token, masked_token_mean(per_token, masks)


def separately(model, inputs, labels) -> torch.Tensor:
    """The plain model on document A alone, then on document B alone (its positions from 0)."""
    return torch.cat((model(inputs[:, :FIRST], labels[:, :FIRST]), model(inputs[:, FIRST:], labels[:, FIRST:])), 1)


def hand_masked_mean(per_token: torch.Tensor) -> torch.Tensor:
    keep = [position for position in range(per_token.shape[1]) if position != FIRST - 1]  # not the EOD's input
    return per_token[:, keep].mean()


def test_all_three_flags_are_each_document_run_alone_without_the_eods_loss():
    for config in (GPT2_CONFIG, LLAMA_CONFIG):
        model = build_gpt_model(config, SINGLE, seed=1).eval()
        inputs, labels = sample()
        per_token, loss = flagged(model, inputs, labels, True, True, True)
        reference = separately(model, inputs, labels)
        torch.testing.assert_close(per_token, reference, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loss, hand_masked_mean(reference), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(per_token[:, FIRST:], model(inputs, labels)[:, FIRST:], atol=1e-3)


def test_eod_mask_loss_alone_drops_only_the_eods_prediction():
    model = build_gpt_model(GPT2_CONFIG, SINGLE, seed=1).eval()
    inputs, labels = sample()
    per_token, loss = flagged(model, inputs, labels, False, False, True)
    plain = model(inputs, labels)
    torch.testing.assert_close(per_token, plain, rtol=0, atol=0)
    torch.testing.assert_close(loss, hand_masked_mean(plain), rtol=1e-6, atol=1e-6)


def test_reset_attention_mask_alone_keeps_the_positions_running():
    """Document B attends only to itself but at positions 6..15: the reference runs B alone on a copy of the model
    whose position table starts at row 6. Under rotary positions, whose q.k depends on position differences only,
    it is B run alone."""
    model = build_gpt_model(GPT2_CONFIG, SINGLE, seed=1).eval()
    inputs, labels = sample()
    per_token, _ = flagged(model, inputs, labels, False, True, False)
    shifted = build_gpt_model(GPT2_CONFIG, SINGLE, seed=1).eval()
    with torch.no_grad():
        table = shifted.position_embeddings.weight
        table[: 16 - FIRST] = table[FIRST:].clone()
    reference = torch.cat((model(inputs[:, :FIRST], labels[:, :FIRST]),
                           shifted(inputs[:, FIRST:], labels[:, FIRST:])), 1)
    torch.testing.assert_close(per_token, reference, rtol=1e-5, atol=1e-5)

    rotary = build_gpt_model(LLAMA_CONFIG, SINGLE, seed=1).eval()
    per_token, _ = flagged(rotary, inputs, labels, False, True, False)
    torch.testing.assert_close(per_token, separately(rotary, inputs, labels), rtol=1e-4, atol=1e-4)


def test_reset_position_ids_alone_restarts_learned_positions_and_leaves_rotary_ones():
    model = build_gpt_model(GPT2_CONFIG, SINGLE, seed=1).eval()
    inputs, labels = sample()
    per_token, _ = flagged(model, inputs, labels, True, False, False)
    by_hand = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
    hook = model.position_embeddings.register_forward_hook(
        lambda module, args, output: module.weight[by_hand])  # full attention, these positions
    try:
        reference = model(inputs, labels)
    finally:
        hook.remove()
    torch.testing.assert_close(per_token, reference, rtol=0, atol=0)
    assert not torch.allclose(per_token, model(inputs, labels), atol=1e-3)

    rotary = build_gpt_model(LLAMA_CONFIG, SINGLE, seed=1).eval()
    per_token, _ = flagged(rotary, inputs, labels, True, False, False)
    torch.testing.assert_close(per_token, rotary(inputs, labels), rtol=0, atol=0)
