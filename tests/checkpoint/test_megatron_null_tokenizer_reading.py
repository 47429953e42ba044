"""NullTokenizer's --vocab-size as the Megatron-LM release that wrote a checkpoint read it (issue 114 item 2).

The releases' readings, from the source: core_v0.16.1 (and core_v0.17.x)
megatron/core/tokenizers/text/libraries/null_tokenizer.py NullTokenizer.__init__ keeps `_eod_id =
_vocab_size_without_eod` (= --vocab-size N) and its `vocab_size` is `_vocab_size_without_eod + 1`; from core_v0.18.0
the same __init__ takes `eod_id=None` and sets `_eod_id = ... self._vocab_size - 1`, `vocab_size` N as given, and
megatron/core/tokenizers/utils/build_tokenizer.py build_tokenizer passes `args.null_tokenizer_eod_id` where set
(megatron/training/config/training_config.py: `null_tokenizer_eod_id: int = None`, so 0.18's and 0.19's saved args
carry it). Megatron-Core's cross entropy scores every row of the padded vocabulary.

tests/fixtures/megatron_null019_eod_mask was written by core_v0.19.0's own pretrain_gpt.py
(scripts/tools/megatron_checkpoint_fixtures.py GPT_019_FIXTURES): the shared tiny GPT-2 flags, --vocab-size 127 (127 ids,
126 ending a document, 128 rows) and --eod-mask-loss, so Megatron masked the corpus's 126s and scored its ends (127)
as tokens; saved at iteration 2, its losses at 3 and 4 recorded.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest

from checkpoint.torch_dist.common import load_common, saved_args
from checkpoint.torch_dist.null_tokenizer import megatron_null_tokenizer, saved_vocabulary
from checkpoint.torch_dist.source import MegatronSource
from tests.checkpoint.test_megatron_checkpoint import (
    FIXTURES,
    data_workdir,
    iteration_dir,
    megatrons_losses,
    our_flags,
    record,
)

NAME = "megatron_null019_eod_mask"
READING = ("--vocab-size 127 as Megatron-LM core_v0.18 on reads it: 127 ids and 1 padding row Megatron-Core's loss "
           "scores, 128 in all here, 126 ending a document")


def test_the_fixture_is_megatron_lm_019s_gpt_run_with_eod_mask_loss():
    written = record(NAME)
    assert written["megatron_lm"] == "core_v0.19.0" and written["megatron_core"].startswith("0.19")
    assert "--eod-mask-loss" in written["flags"] and written["world_size"] == 1
    assert not (iteration_dir(NAME) / "common.pt").exists()  # 0.19 keeps the common state in the DCP files
    args = saved_args(load_common(iteration_dir(NAME)))
    assert (args.vocab_size, args.null_tokenizer_eod_id, args.padded_vocab_size) == (127, None, 128)
    assert sum(path.stat().st_size for path in (FIXTURES / NAME).rglob("*") if path.is_file()) < 600_000


def test_each_release_reads_vocab_size_its_own_way():
    """core_v0.16.1's args (no null_tokenizer_eod_id): N + 1 ids; core_v0.18 on: the saved rows, N - 1 ending a
    document unless the args name another."""
    older = SimpleNamespace(tokenizer_type="NullTokenizer", vocab_size=127, padded_vocab_size=128,
                            make_vocab_size_divisible_by=32, tensor_model_parallel_size=1)
    assert megatron_null_tokenizer(older) is None and saved_vocabulary(older) == 128
    assert MegatronSource(iteration_dir("megatron_tp1"))._real_rows == 128  # 0.16.1's fixture, as before
    newer = SimpleNamespace(**vars(older), null_tokenizer_eod_id=None)
    reading = megatron_null_tokenizer(newer)
    assert (reading.vocab_size, reading.ids, reading.eod_id) == (127, 128, 126)
    assert megatron_null_tokenizer(SimpleNamespace(**vars(older), null_tokenizer_eod_id=3)).eod_id == 3
    # 100 ids in 0.19's 128 rows: all scored there, so all are the vocabulary here
    padded = SimpleNamespace(**{**vars(newer), "vocab_size": 100})
    assert saved_vocabulary(padded) == 128
    assert MegatronSource(iteration_dir(NAME))._real_rows == 128
    assert megatron_null_tokenizer(SimpleNamespace(**{**vars(newer), "tokenizer_type": "GPT2BPETokenizer"})) is None


def _continue(tmp_path, flags, extra=()):
    import pretrain_gpt
    from tests.reliability_helpers import metrics_records, run_main

    checkpoint = shutil.copytree(FIXTURES / NAME, tmp_path / NAME, dirs_exist_ok=True)
    metrics = tmp_path / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    outcome = run_main(pretrain_gpt.main, flags + ["--load", checkpoint, "--device", "cpu", "--log-interval", "1",
                                                   "--data-cache-dir", tmp_path / "cache", "--metrics-file", metrics,
                                                   *extra])
    records = [r for r in metrics_records(metrics) if "loss" in r] if outcome.code == 0 else []
    return outcome, {r["iteration"]: r for r in records}


@pytest.mark.slow
def test_megatron_lm_019s_eod_masked_run_continues_to_its_next_losses(tmp_path, monkeypatch):
    """The same launch continues under Megatron-LM's masks: its gradients (grad norms at 3 and 4) and its logged
    losses, the masked sum over the token count (training/logged_loss.py), are Megatron's (fp32, 1e-6), with
    --calculate-per-token-loss too (that launch stopped after iteration 3)."""
    monkeypatch.chdir(data_workdir(tmp_path))
    outcome, records = _continue(tmp_path, our_flags(NAME))
    assert outcome.code == 0, outcome.err[-3000:]
    written = record(NAME)
    assert {i: records[i]["grad_norm"] for i in (3, 4)} == \
        pytest.approx({i: written["uninterrupted_grad_norms"][str(i)] for i in (3, 4)}, rel=1e-6, abs=0)
    expected = megatrons_losses(NAME)
    assert {i: records[i]["loss"] for i in (3, 4)} == pytest.approx({i: expected[i] for i in (3, 4)}, rel=1e-6, abs=0)
    assert f"> --tokenizer-type NullTokenizer {READING}, the reading of " in outcome.out
    outcome, records = _continue(tmp_path, our_flags(NAME), ["--calculate-per-token-loss", "--exit-interval", "3"])
    assert outcome.code == 0, outcome.err[-3000:]
    assert records[3]["loss"] == pytest.approx(expected[3], rel=1e-6, abs=0)


def test_another_vocab_size_than_the_checkpoints_is_refused_with_the_one_it_was_written_with(tmp_path, monkeypatch):
    monkeypatch.chdir(data_workdir(tmp_path))
    flags = our_flags(NAME)
    flags[flags.index("--vocab-size") + 1] = "126"  # the older reading's flag for 0.19's tokenizer: not this one's
    outcome, _ = _continue(tmp_path, flags)
    assert outcome.code == 2
    line = outcome.err.strip().splitlines()[-1]
    assert "--vocab-size 126:" in line and READING in line and line.endswith("pass --vocab-size 127")
    assert "vocabulary has" not in outcome.err


def test_our_save_of_the_continuation_records_the_reading_and_its_resume_takes_it(tmp_path):
    """A save of the continued run records the reading beside the tokenizer's digest (metadata.json checks it), so a
    resume of that save with the same flags reads --vocab-size the same way and its tokenizer is the save's."""
    from checkpoint.null_tokenizer_reading import read_as_saved, saved_null_tokenizer
    from checkpoint.schema import OPTIONAL
    from checkpoint.tokenizer_check import tokenizer_record
    from data.tokenizer import NullTokenizer, tokenizer_digest

    megatrons = megatron_null_tokenizer(saved_args(load_common(iteration_dir(NAME))))
    continued, _ = read_as_saved(megatrons, NullTokenizer(127), iteration_dir(NAME))
    assert (continued.vocab_size, continued.eod_id) == (128, 126)
    saved = tokenizer_record(continued)
    meaning, check = OPTIONAL["null_tokenizer"]
    assert check(saved["null_tokenizer"]) and not check({**saved["null_tokenizer"], "eod_id": "126"})
    resumed, line = read_as_saved(saved_null_tokenizer(saved), NullTokenizer(127), tmp_path)
    assert tokenizer_digest(resumed) == saved["tokenizer_digest"] != tokenizer_digest(NullTokenizer(127))
    assert READING in line
    # the default reading records nothing: saves of fresh runs are as before
    assert set(tokenizer_record(NullTokenizer(127))) == {"tokenizer_digest", "tokenizer_vocab_size"}
