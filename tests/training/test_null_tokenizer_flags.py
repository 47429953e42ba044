"""core_v0.18's NullTokenizer flags, --null-tokenizer-eod-id and --null-tokenizer-pad-id (issue 114).

Megatron-LM core_v0.19.0: megatron/training/config/training_config.py (`null_tokenizer_eod_id: int = None`,
`null_tokenizer_pad_id: int = -1`); megatron/core/tokenizers/utils/build_tokenizer.py build_tokenizer passes both to
megatron/core/tokenizers/text/libraries/null_tokenizer.py NullTokenizer.__init__ (`vocab_size` ids, `_eod_id` the
flag or `vocab_size - 1`). megatron/core/datasets/megatron_dataset.py MegatronDataset.__init__ takes `tokenizer.pad`
(the library's `pad_id`) and resets it to -1 where it is among the special tokens: MegatronTokenizerText has no
`special_tokens_dict` and NullTokenizer no `eos_id`, so only `eod` is checked; --allow-ambiguous-pad-tokens keeps it.
megatron/core/datasets/gpt_dataset.py GPTDataset.__getitem__ then zeroes the loss mask where labels == pad and maps
pad to 0 in tokens and labels, after _get_ltor_masks_and_position_ids read the tokens.
"""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest
import torch

import pretrain_gpt
from data.indexed import IndexedDatasetWriter
from tests.reliability_helpers import metrics_records, run_main
from training.train_step import DataParallelTrainStep

N = 255  # --vocab-size
EOD = 7  # --null-tokenizer-eod-id, neither N - 1 nor N
PAD = 3
COMMON = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
          "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
          "--train-iters", "1", "--seed", "1", "--log-interval", "1", "--eval-iters", "0", "--device", "cpu",
          "--hidden-dropout", "0", "--attention-dropout", "0", "--tokenizer-type", "NullTokenizer",
          "--vocab-size", str(N), "--split", "100,0,0"]


def documents(directory) -> str:
    """Documents starting with N - 1 and holding the pad id, each ending in EOD."""
    prefix = str(directory / "documents")
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:
        for _ in range(200):
            body = rng.integers(8, N - 1, rng.integers(1, 10))
            writer.add_document(np.concatenate(([N - 1], body, [PAD], rng.integers(8, N - 1, 2), [EOD])))
        writer.finalize()
    return prefix


def first_loss_and_reference(tmp_path, monkeypatch, reference_loss, *flags, common=COMMON, data_path=None):
    """The run's iteration-1 loss, `reference_loss(model, tokens)` of its micro-batches at the initial weights
    (taken from the run's own loader before the run uses them), the model's vocabulary, and the run's stdout.
    `common` and `data_path` (default: `documents`) for another tokenizer's run."""
    seen = {}
    original = DataParallelTrainStep.forward_backward

    def reference_first(self, accumulation_steps, measure_activations):
        if not seen and not next(self.model.parameters()).is_meta:  # not the planner's dry run
            batches = [next(self.train_batches) for _ in range(accumulation_steps)]
            self.train_batches = itertools.chain(batches, self.train_batches)
            with torch.no_grad():
                seen["loss"] = sum(reference_loss(self.model, b["tokens"]) for b in batches).item() / len(batches)
            seen["vocab"] = self.settings.vocab_size
        return original(self, accumulation_steps, measure_activations)

    monkeypatch.setattr(DataParallelTrainStep, "forward_backward", reference_first)
    metrics = tmp_path / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    outcome = run_main(pretrain_gpt.main, common + ["--data-path", data_path or documents(tmp_path), "--data-cache-dir",
                                                    tmp_path / "cache", "--metrics-file", metrics, *flags])
    assert outcome.code == 0, outcome.err[-2000:]
    loss = next(r["loss"] for r in metrics_records(metrics) if "loss" in r)
    return loss, seen["loss"], seen["vocab"], outcome.out


def masked_mean(model, inputs, labels, keep) -> torch.Tensor:
    losses = model(inputs, labels)  # [batch, seq]
    return (losses * keep).sum() / keep.sum()


def test_eod_id_flag_reads_n_ids_and_eod_mask_loss_masks_its_id(tmp_path, monkeypatch):
    def masked_at_eod(model, tokens):
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        assert (inputs == N - 1).any()  # the id the flag's absence would mask
        return masked_mean(model, inputs, labels, (inputs != EOD).float())

    loss, reference, vocab, out = first_loss_and_reference(
        tmp_path, monkeypatch, masked_at_eod, "--null-tokenizer-eod-id", EOD, "--eod-mask-loss")
    assert loss == pytest.approx(reference, rel=1e-5)
    assert vocab == N  # N ids, no end-of-document id N
    assert (f"> --tokenizer-type NullTokenizer --vocab-size {N} as Megatron-LM core_v0.18 on reads it: {N} ids, "
            f"{EOD} ending a document") in out
    assert "from core_v0.18.0 on it reads" not in out  # the older reading's note is not said


def test_pad_id_flag_masks_its_labels_and_feeds_token_zero(tmp_path, monkeypatch):
    def padded(model, tokens):
        inputs, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        keep = (labels != PAD).float()
        assert keep.min() == 0 and (inputs == PAD).any()
        inputs[inputs == PAD], labels[labels == PAD] = 0, 0
        return masked_mean(model, inputs, labels, keep)

    loss, reference, vocab, _ = first_loss_and_reference(tmp_path, monkeypatch, padded,
                                                         "--null-tokenizer-pad-id", PAD)
    assert loss == pytest.approx(reference, rel=1e-5)
    assert vocab == N  # either flag is core_v0.18's reading


def test_a_pad_id_equal_to_the_eod_id_is_dropped_unless_ambiguous_pad_tokens_are_allowed(tmp_path, monkeypatch):
    def plain(model, tokens):
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        return model(inputs, labels).mean()

    flags = ("--null-tokenizer-eod-id", EOD, "--null-tokenizer-pad-id", EOD)
    loss, reference, _, out = first_loss_and_reference(tmp_path, monkeypatch, plain, *flags)
    assert loss == pytest.approx(reference, rel=1e-5)
    assert [line for line in out.splitlines() if "--null-tokenizer-pad-id" in line and "end-of-document" in line] == [
        f"> --null-tokenizer-pad-id {EOD} is the end-of-document id: no pad id, as Megatron-Core's MegatronDataset "
        f"resets it (--allow-ambiguous-pad-tokens keeps it)"]

    def eod_as_pad(model, tokens):
        inputs, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        keep = (labels != EOD).float()
        inputs[inputs == EOD], labels[labels == EOD] = 0, 0
        return masked_mean(model, inputs, labels, keep)

    kept, reference, _, out = first_loss_and_reference(tmp_path, monkeypatch, eod_as_pad, *flags,
                                                       "--allow-ambiguous-pad-tokens")
    assert kept == pytest.approx(reference, rel=1e-5) and kept != pytest.approx(loss, rel=1e-3)
    assert "kept under --allow-ambiguous-pad-tokens" in out


def test_a_save_records_the_flags_reading_and_a_resume_without_them_reads_it_again(tmp_path):
    from checkpoint.null_tokenizer_reading import read_as_saved, saved_null_tokenizer
    from checkpoint.tokenizer_check import tokenizer_record
    from data.tokenizer import NullTokenizer, load_named_tokenizer, tokenizer_digest

    launched = load_named_tokenizer("NullTokenizer", None, None, None, N, newer_null=True, null_eod_id=EOD)
    assert (launched.vocab_size, launched.eod_id) == (N, EOD)
    saved = tokenizer_record(launched)
    resumed, line = read_as_saved(saved_null_tokenizer(saved), NullTokenizer(N), tmp_path)
    assert (resumed.vocab_size, resumed.eod_id) == (N, EOD)
    assert tokenizer_digest(resumed) == saved["tokenizer_digest"] != tokenizer_digest(NullTokenizer(N))
    assert f"{N} ids, {EOD} ending a document, the reading of {tmp_path}" in line
    again, _ = read_as_saved(saved_null_tokenizer(saved), launched, tmp_path, asked_eod=EOD)  # the same flags
    assert tokenizer_digest(again) == saved["tokenizer_digest"]
    with pytest.raises(Exception, match=f"--null-tokenizer-eod-id {N - 1}: .* pass --null-tokenizer-eod-id {EOD}$"):
        read_as_saved(saved_null_tokenizer(saved), launched, tmp_path, asked_eod=N - 1)


def test_a_load_of_megatron_lm_019s_checkpoint_checks_the_eod_id_against_its_args(tmp_path, monkeypatch):
    """tests/fixtures/megatron_null019_eod_mask: core_v0.19.0's args, --vocab-size 127, null_tokenizer_eod_id None
    (126 ends a document)."""
    from tests.checkpoint.test_megatron_checkpoint import data_workdir, our_flags
    from tests.checkpoint.test_megatron_null_tokenizer_reading import NAME, READING, _continue

    monkeypatch.chdir(data_workdir(tmp_path))
    outcome, _ = _continue(tmp_path, our_flags(NAME), ["--null-tokenizer-eod-id", "5"])
    assert outcome.code == 2
    line = outcome.err.strip().splitlines()[-1]
    assert "--null-tokenizer-eod-id 5:" in line and READING in line and line.endswith("pass --null-tokenizer-eod-id 126")
    outcome, _ = _continue(tmp_path, our_flags(NAME), ["--null-tokenizer-eod-id", "126", "--exit-interval", "3"])
    assert outcome.code == 0, outcome.err[-2000:]
    assert f"> --tokenizer-type NullTokenizer {READING}, the reading of " in outcome.out


EOD_ID_FIXTURE = "megatron_null019_eod_id"  # core_v0.19.0's pretrain_gpt.py: --null-tokenizer-eod-id 5 --eod-mask-loss


def _continue_fixture(tmp_path, extra=()):
    from tests.checkpoint.test_megatron_checkpoint import FIXTURES, our_flags

    checkpoint = shutil.copytree(FIXTURES / EOD_ID_FIXTURE, tmp_path / EOD_ID_FIXTURE, dirs_exist_ok=True)
    metrics = tmp_path / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    outcome = run_main(pretrain_gpt.main, our_flags(EOD_ID_FIXTURE) + [
        "--load", checkpoint, "--device", "cpu", "--log-interval", "1", "--data-cache-dir", tmp_path / "cache",
        "--metrics-file", metrics, *extra])
    assert outcome.code == 0, outcome.err[-3000:]
    return outcome, {r["iteration"]: r for r in metrics_records(metrics) if "loss" in r}


@pytest.mark.slow
def test_megatron_lm_019s_run_with_an_eod_id_continues_to_its_next_losses(tmp_path, monkeypatch):
    """tests/fixtures/megatron_null019_eod_id (scripts/tools/megatron_checkpoint_fixtures.py GPT_019_FIXTURES):
    Megatron-LM's own loop, --vocab-size 127 (128 rows), 5 ending a document and masked; continued here at its
    iteration-4 loss and grad norms, and under --calculate-per-token-loss at its iteration-3 loss (the logged loss
    under a mask is otherwise the mean of the micro-batches' masked means)."""
    from checkpoint.torch_dist.common import load_common, saved_args
    from tests.checkpoint.test_megatron_checkpoint import FIXTURES, data_workdir, megatrons_losses, record

    written = record(EOD_ID_FIXTURE)
    assert written["megatron_lm"] == "core_v0.19.0" and "--null-tokenizer-eod-id" in written["flags"]
    assert saved_args(load_common(FIXTURES / EOD_ID_FIXTURE / "iter_0000002")).null_tokenizer_eod_id == 5
    assert sum(path.stat().st_size for path in (FIXTURES / EOD_ID_FIXTURE).rglob("*") if path.is_file()) < 600_000
    monkeypatch.chdir(data_workdir(tmp_path))
    outcome, records = _continue_fixture(tmp_path)
    assert {i: records[i]["grad_norm"] for i in (3, 4)} == \
        pytest.approx({i: written["uninterrupted_grad_norms"][str(i)] for i in (3, 4)}, rel=1e-6, abs=0)
    expected = megatrons_losses(EOD_ID_FIXTURE)
    assert records[4]["loss"] == pytest.approx(expected[4], rel=1e-6, abs=0)
    assert "128 in all here, 5 ending a document, the reading of " in outcome.out
    _, records = _continue_fixture(tmp_path, ["--calculate-per-token-loss", "--exit-interval", "3"])
    assert records[3]["loss"] == pytest.approx(expected[3], rel=1e-6, abs=0)
