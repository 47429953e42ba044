"""An explicit tokenizer beside `--init-from-hf` (issue 60, item 1): `--tokenizer-type NullTokenizer --vocab-size N`
with `--data-path` (data tokenized elsewhere) or `--mock-data` wins over the embedded corpus's BPE, and the folder's
vocab_size must hold its N + 1 ids (Megatron's NullTokenizer adds the end-of-document id N:
megatron/core/tokenizers/text/libraries/null_tokenizer.py). Before, every such launch stopped with "the run's
tokenizer has 4096 tokens" (the embedded corpus's --tokenizer-vocab-size taken for the tokenizer).

A Llama, a Mixtral and a Qwen2-MoE folder, each written by transformers' own save_pretrained, train so, and
iteration 1's logged loss is transformers' loss on that iteration's batch (the comparison of
tests/checkpoint/test_hf_folder_is_the_model.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import pretrain_gpt
from tests.checkpoint.test_hf_folder_is_the_model import POSITIONS, RUN, random_weights, transformers_loss
from tests.reliability_helpers import write_dataset

FOLDER_VOCAB = 260  # the folder's embedding rows
NULL_VOCAB = 200    # --vocab-size: the data's ids 0..199, the end-of-document id 200; rows 201..259 unused


def _save(model, path: Path) -> Path:
    random_weights(model, seed=7)
    model.save_pretrained(str(path))
    return path


def llama(path: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    return _save(LlamaForCausalLM(LlamaConfig(
        vocab_size=FOLDER_VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=POSITIONS, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)), path)


def mixtral(path: Path) -> Path:
    from transformers import MixtralConfig, MixtralForCausalLM

    return _save(MixtralForCausalLM(MixtralConfig(
        vocab_size=FOLDER_VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=POSITIONS, rms_norm_eps=1e-6, num_local_experts=4,
        num_experts_per_tok=2, bos_token_id=None, eos_token_id=None, pad_token_id=None)), path)


def qwen2_moe(path: Path) -> Path:
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    return _save(Qwen2MoeForCausalLM(Qwen2MoeConfig(
        vocab_size=FOLDER_VOCAB, hidden_size=32, intermediate_size=40, moe_intermediate_size=24,
        shared_expert_intermediate_size=20, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=POSITIONS, rms_norm_eps=1e-6, num_experts=4, num_experts_per_tok=2,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)), path)


FAMILIES = {"llama": llama, "mixtral": mixtral, "qwen2_moe": qwen2_moe}


@pytest.fixture(scope="module")
def pretokenized(tmp_path_factory) -> str:
    """Documents of ids below --vocab-size, as a corpus tokenized elsewhere holds them."""
    rng = np.random.default_rng(0)
    return write_dataset(tmp_path_factory.mktemp("data") / "pretokenized",
                         [rng.integers(0, NULL_VOCAB, int(rng.integers(20, 90))).tolist() for _ in range(30)])


@pytest.mark.slow
@pytest.mark.parametrize("source", ["data-path", "mock-data"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_null_tokenizer_beside_a_folder_trains_and_its_first_loss_is_transformers(
        family, source, pretokenized, tmp_path, monkeypatch, capsys):
    import training.prepare

    folder = FAMILIES[family](tmp_path / "hf")
    built = []
    build_data = training.prepare.build_data
    monkeypatch.setattr("training.prepare.build_data", lambda *args: built.append(build_data(*args)) or built[-1])
    data = ["--data-path", pretokenized] if source == "data-path" else ["--mock-data"]
    metrics = tmp_path / "m.jsonl"
    capsys.readouterr()
    assert pretrain_gpt.main(["--init-from-hf", str(folder), "--tokenizer-type", "NullTokenizer", "--vocab-size",
                              str(NULL_VOCAB), *data, *RUN, "--data-cache-dir", str(tmp_path / "cache"),
                              "--metrics-file", str(metrics)]) == 0
    out = capsys.readouterr().out
    assert (f"> the tokenizer is --tokenizer-type NullTokenizer (--vocab-size {NULL_VOCAB} on the command line): "
            f"ids 0-{NULL_VOCAB - 1} as the data holds them and the end-of-document id {NULL_VOCAB}, within the "
            f"folder's {FOLDER_VOCAB} rows") in out
    record = json.loads(metrics.read_text().splitlines()[0])
    assert record["iteration"] == 1
    tokens = next(iter(built[0].make_train_loader(0)))["tokens"]
    assert tokens.shape == (2, POSITIONS + 1) and int(tokens.max()) <= NULL_VOCAB
    theirs = transformers_loss(folder, tokens)
    assert math.isclose(record["loss"], theirs, rel_tol=1e-5), (record["loss"], theirs)


def test_a_null_tokenizer_larger_than_the_folder_is_one_line_before_any_data_work(tmp_path, capsys, monkeypatch):
    """--vocab-size N needs N + 1 rows: at N = vocab_size the end-of-document id has none."""
    monkeypatch.setattr("training.prepare.build_data", lambda *args: pytest.fail("data work started"))
    folder = llama(tmp_path / "hf")
    capsys.readouterr()
    assert pretrain_gpt.main(["--init-from-hf", str(folder), "--tokenizer-type", "NullTokenizer", "--vocab-size",
                              str(FOLDER_VOCAB), "--mock-data", *RUN, "--data-cache-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert (f"--vocab-size {FOLDER_VOCAB} on the command line with --tokenizer-type NullTokenizer makes "
            f"{FOLDER_VOCAB + 1} token ids (the end-of-document id is {FOLDER_VOCAB}), more than "
            f"{folder / 'config.json'}: vocab_size {FOLDER_VOCAB}: give --vocab-size at most {FOLDER_VOCAB - 1}") in err
