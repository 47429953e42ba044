"""swiss-ai's goldfish loss (--goldfish-loss --goldfish-k K --goldfish-h H, issue 54), against its Megatron-LM fork
(github:swiss-ai/Megatron-LM main, megatron/core/datasets/gpt_dataset.py):

- `_HASH_TABLE_SIZE = 1_000_003`; `_create_hash_table(device)`: `rng = torch.Generator(device=device);
  rng.manual_seed(2971215073); torch.rand(_HASH_TABLE_SIZE, device=device, generator=rng)` (the dataset's
  device: the CPU);
- `apply_goldfish(labels, goldfish_token_id, k, goldfish_hash_table, goldfish_context_width)`: `hashed_keys =
  goldfish_hash_table[labels.unfold(0, goldfish_context_width, 1).prod(dim=-1) % _HASH_TABLE_SIZE]`;
  `dropped_token_indices = (hashed_keys < 1 / k)`; `masked_labels[goldfish_context_width-1:][dropped_token_indices]
  = goldfish_token_id`;
- GPTDataset.__getitem__: after the EOD and padding masks, `loss_mask[goldfish_labels == self._goldfish_token_id]
  = 0.0`; pretrain_gpt.py loss_func then sums `losses * loss_mask` over `loss_mask.sum()` tokens;
- megatron/training/arguments.py: `--goldfish-k` and `--goldfish-h` default 50, asserted positive.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import pretrain_gpt
from arguments.parser import parse_config
from base.errors import ConfigError
from data.documents import DocumentMasking, goldfish_hash_table, goldfish_kept, masked_token_mean
from tests.training.test_document_masking_training import EOD, argv, records
from training.train_step import DataParallelTrainStep

SIZE = 1_000_003


def forks_table() -> torch.Tensor:
    """_create_hash_table(device='cpu'), transcribed."""
    rng = torch.Generator(device="cpu")
    rng.manual_seed(2971215073)
    return torch.rand(SIZE, device="cpu", generator=rng)


def forks_apply_goldfish(labels: torch.Tensor, k: int, h: int) -> torch.Tensor:
    """apply_goldfish, transcribed, on one sample's labels (1D); the goldfish token -2."""
    masked_labels = labels.clone()
    hashed_keys = forks_table()[labels.unfold(0, h, 1).prod(dim=-1) % SIZE]
    dropped_token_indices = (hashed_keys < 1 / k)
    masked_labels[h - 1:][dropped_token_indices] = -2
    return masked_labels


def by_hand(labels: list[int], k: int, h: int) -> list[float]:
    """The mask in plain Python: label i >= h-1 is dropped when the table's entry at the product of labels i-h+1..i,
    wrapped to a signed 64-bit integer (torch's int64 product), taken modulo 1,000,003 (Python's and torch's
    remainder: never negative), is below 1/k."""
    table = forks_table()
    kept = [1.0] * len(labels)
    for i in range(h - 1, len(labels)):
        product = 1
        for label in labels[i - h + 1:i + 1]:
            product *= label
        product = (product + 2 ** 63) % 2 ** 64 - 2 ** 63
        if table[product % SIZE].item() < 1 / k:
            kept[i] = 0.0
    return kept


def test_the_hash_table_is_the_forks():
    assert torch.equal(goldfish_hash_table(torch.device("cpu")), forks_table())


def test_a_small_sample_by_hand():
    """H 2, K 4 on twelve labels: every label from the second on is dropped exactly when its pair's product indexes
    a table entry below 1/4, the first never; a few are dropped and most kept."""
    labels = [5, 7, 11, 2, 3, 7, 11, 2, 9, 9, 4, 5]
    kept = goldfish_kept(torch.tensor([labels]), k=4, h=2)[0].tolist()
    assert kept == by_hand(labels, k=4, h=2)
    assert kept[0] == 1.0 and 0 < kept.count(0.0) < len(labels)
    # the same pair of labels decides the same way wherever it occurs: (7, 11) at 1-2 and 5-6, (11, 2) at 2-3 and 6-7
    assert kept[2] == kept[6] and kept[3] == kept[7]


def test_a_batch_equals_the_forks_apply_goldfish_per_sample_even_where_the_product_wraps():
    """Token ids of a 150k vocabulary over windows of 50 (the Apertus launch's H): their products leave int64 and
    wrap, in ours as in the fork's."""
    generator = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 150_000, (3, 300), generator=generator)
    for k, h in ((50, 50), (3, 5), (2, 1)):
        kept = goldfish_kept(labels, k=k, h=h)
        expected = torch.stack([(forks_apply_goldfish(row, k, h) != -2).float() for row in labels])
        assert torch.equal(kept, expected), (k, h)
    # about 1 in k dropped, the first h-1 of each sample never
    share = 1 - goldfish_kept(labels, k=3, h=5)[:, 4:].mean().item()
    assert 0.2 < share < 0.45
    assert goldfish_kept(labels, k=3, h=5)[:, :4].eq(1).all()
    assert by_hand(labels[0, :60].tolist(), k=3, h=5) == goldfish_kept(labels[:1, :60], k=3, h=5)[0].tolist()


def test_the_loss_mask_joins_the_eod_mask_and_the_loss_divides_by_the_tokens_kept():
    """GPTDataset.__getitem__ zeroes the goldfish labels' loss_mask after the EOD mask; loss_func divides the masked
    sum by loss_mask.sum()."""
    inputs = torch.tensor([[3, EOD, 5, 7, 11, 2, 3, 7]])
    labels = torch.tensor([[EOD, 5, 7, 11, 2, 3, 7, 11]])
    masks = DocumentMasking.of(EOD, False, False, True, (4, 2)).masks(inputs, labels)
    kept = by_hand(labels[0].tolist(), k=4, h=2)
    expected_mask = [keep * (token != EOD) for keep, token in zip(kept, inputs[0].tolist())]
    assert masks.loss_mask[0].tolist() == expected_mask
    losses = torch.arange(1.0, 9.0)[None]
    expected = sum(loss * m for loss, m in zip(losses[0].tolist(), expected_mask)) / sum(expected_mask)
    assert masked_token_mean(losses, masks).item() == pytest.approx(expected, rel=1e-6)
    alone = DocumentMasking.of(EOD, False, False, False, (4, 2)).masks(inputs, labels)
    assert alone.loss_mask[0].tolist() == kept and alone.position_ids is None and alone.attention_mask is None


def test_a_run_s_first_loss_leaves_the_dropped_tokens_out(tmp_path, monkeypatch):
    """--goldfish-loss --goldfish-k 3 --goldfish-h 2 --eod-mask-loss: the first iteration's logged loss is the plain
    per-token losses summed over the tokens the mask keeps (by hand) over their count, over all the micro-batches
    (Megatron-LM's training.py train_step); without --goldfish-loss it differs."""
    reference = {}
    original = DataParallelTrainStep.forward_backward

    def reference_first(self, accumulation_steps, measure_activations):
        if not reference:
            batches = [next(self.train_batches) for _ in range(accumulation_steps)]
            self.train_batches = itertools.chain(batches, self.train_batches)
            total = count = 0.0
            with torch.no_grad():
                for batch in batches:
                    tokens = batch["tokens"]
                    losses = self.model(tokens[:, :-1], tokens[:, 1:])
                    keep = torch.tensor([by_hand(row[1:].tolist(), k=3, h=2) for row in tokens]) * \
                        (tokens[:, :-1] != EOD)
                    assert 0 < keep.sum() < keep.numel()
                    total, count = total + (losses * keep).sum().item(), count + keep.sum().item()
            reference["loss"] = total / count
        return original(self, accumulation_steps, measure_activations)

    monkeypatch.setattr(DataParallelTrainStep, "forward_backward", reference_first)
    goldfish = ["--eod-mask-loss", "--goldfish-loss", "--goldfish-k", "3", "--goldfish-h", "2"]
    assert pretrain_gpt.main(argv(tmp_path, "goldfish", *goldfish)) == 0
    first = records(tmp_path, "goldfish")[0]["loss"]
    assert first == pytest.approx(reference["loss"], rel=1e-5)
    monkeypatch.setattr(DataParallelTrainStep, "forward_backward", original)
    assert pretrain_gpt.main(argv(tmp_path, "eod", "--eod-mask-loss")) == 0
    assert records(tmp_path, "eod")[0]["loss"] != pytest.approx(first, rel=1e-4)


def test_flags_defaults_and_refusals():
    data = parse_config(["--goldfish-loss"]).data
    assert (data.goldfish_loss, data.goldfish_k, data.goldfish_h) == (True, 50, 50)
    for argv_, match in ((["--goldfish-k", "0"], "--goldfish-k must be a positive integer, got 0"),
                         (["--goldfish-h", "-1"], "--goldfish-h must be a positive integer, got -1"),
                         (["--goldfish-h", "50", "--seq-length", "16", "--max-position-embeddings", "16"],
                          "--goldfish-h 50 is longer than a sample's 16 labels")):
        with pytest.raises(ConfigError, match=match) as error:
            parse_config(["--goldfish-loss", "--goldfish-h", "4", *argv_])
        assert "\n" not in str(error.value)


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [["--tensor-model-parallel-size", "2", "--sequence-parallel"],
                                      ["--pipeline-model-parallel-size", "2"]], ids=["tp2-sp", "pp2"])
def test_two_ranks_give_the_single_process_goldfish_losses(tmp_path, parallel):
    """Every pipeline stage builds the micro-batch's mask from its labels (training/evaluation.py
    split_micro_batch): training and validation losses at TP 2 and PP 2 are the single process's."""
    from tests.distributed import run_distributed
    from tests.training.test_document_masking_training import train_rank, validation_losses

    both = ["--eod-mask-loss", "--goldfish-loss", "--goldfish-k", "3", "--goldfish-h", "2", "--num-layers", "4",
            "--split", "90,10,0", "--eval-iters", "1", "--eval-interval", "2"]
    assert pretrain_gpt.main(argv(tmp_path, "single", *both)) == 0
    run_distributed(train_rank, 2, argv(tmp_path, "two", *both, *parallel), timeout=300)
    single, two = records(tmp_path, "single"), records(tmp_path, "two")
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in single], rel=1e-5)
    assert len(validation_losses(tmp_path, "single")) == 2
    assert validation_losses(tmp_path, "two") == pytest.approx(validation_losses(tmp_path, "single"), rel=1e-5)
