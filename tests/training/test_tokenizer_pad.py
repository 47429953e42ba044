"""Megatron-Core's pad rule for every tokenizer kind, not NullTokenizer's flag alone.

core_v0.19.0 (and core_v0.16.1): megatron/core/datasets/megatron_dataset.py MegatronDataset.__init__ takes
`tokenizer.pad`; megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py HuggingFaceTokenizer.pad_id is the
id of the pad_token transformers' AutoTokenizer declares (None without one), sentencepiece_tokenizer.py's pad_id the
model's pad piece outside legacy mode (-1 without one), and GPT2BPETokenizer's (megatron_hf_tokenizer.py, GPT-2's
tokenizer) none. A pad equal to eos/eod is reset unless --allow-ambiguous-pad-tokens; gpt_dataset.py
GPTDataset.__getitem__ gives no loss where the label is the pad and feeds it as token 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from data.documents import megatron_pad_id
from data.indexed import IndexedDatasetWriter
from data.tokenizer import load_tokenizer, megatron_pad
from tests.data.hf_tokenizer_shapes import build_tokenizer_folder
from tests.training.test_null_tokenizer_flags import COMMON, first_loss_and_reference, masked_mean


def gemma_folder(path, pad_token="<pad>"):
    """The Gemma-shaped folder with its released tokenizer_config.json's pad_token (ids: <pad> 0, <eos> 1)."""
    folder = build_tokenizer_folder(path, "gemma")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "pad_token": pad_token}))
    return folder


def test_the_pad_is_the_one_transformers_declares_and_none_where_megatron_core_has_none(tmp_path, sentencepiece_model):
    from transformers import AutoTokenizer

    from data.corpus import default_corpus_documents
    from data.sentencepiece_tokenizer import load_sentencepiece_tokenizer
    from tests.conftest import train_sentencepiece_model

    folder = gemma_folder(tmp_path / "gemma")
    assert megatron_pad(load_tokenizer(str(folder / "tokenizer.json")), -1)[0] == \
        AutoTokenizer.from_pretrained(str(folder)).pad_token_id == 0
    assert megatron_pad(load_tokenizer(str(build_tokenizer_folder(tmp_path / "llama3", "llama3") / "tokenizer.json")),
                        -1)[0] is None  # no pad_token declared
    assert megatron_pad(load_sentencepiece_tokenizer("Llama2Tokenizer", sentencepiece_model), -1)[0] is None  # -1
    padded = str(tmp_path / "padded.model")
    train_sentencepiece_model(padded, default_corpus_documents(), pad_id=3)
    assert megatron_pad(load_sentencepiece_tokenizer("Llama2Tokenizer", padded), -1)[0] == 3
    # a pad that is the end of document: reset, as MegatronDataset resets it, unless allowed
    eos = gemma_folder(tmp_path / "eos", pad_token="<eos>")
    pad, named = megatron_pad(load_tokenizer(str(eos / "tokenizer.json")), -1)
    assert megatron_pad_id(pad, named, 1, allow_ambiguous=False, from_flag=False)[0] is None
    assert megatron_pad_id(pad, named, 1, allow_ambiguous=True, from_flag=False)[0] == 1


def test_a_hugging_face_tokenizers_declared_pad_carries_no_loss(tmp_path, monkeypatch):
    folder = gemma_folder(tmp_path / "gemma")
    prefix = str(tmp_path / "documents")
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(prefix, np.uint16) as writer:  # <bos> text with a <pad> inside, <eos>
        for _ in range(200):
            writer.add_document(np.concatenate(([2], rng.integers(7, 300, rng.integers(1, 10)), [0],
                                               rng.integers(7, 300, 2), [1])))
        writer.finalize()
    common = [word for word in COMMON if word not in ("NullTokenizer", "--vocab-size", "255")]
    common[common.index("--tokenizer-type"):common.index("--tokenizer-type") + 1] = [
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(folder)]

    def unpadded(model, tokens):
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        keep = (labels != 0).float()
        assert keep.min() == 0
        return masked_mean(model, inputs, labels, keep)

    loss, reference, _, out = first_loss_and_reference(tmp_path, monkeypatch, unpadded, common=common,
                                                       data_path=prefix)
    assert loss == pytest.approx(reference, rel=1e-5)
    assert ("> the tokenizer's pad token (id 0): no loss where the label is 0, fed as token 0, as Megatron-Core's "
            "GPTDataset") in out
