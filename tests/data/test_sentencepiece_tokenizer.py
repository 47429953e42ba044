"""Megatron's SentencePiece tokenizer types give the ids the real pair gives, from the same .model.

The spec, read at these commits:
- Megatron-DeepSpeed (the replay corpus's Llama-2 launch), megatron/tokenizer/tokenizer.py at
  f4157bea69f3df8c6cb66f2ebcda66ba03d1288e: `_GPTSentencePieceTokenizer` (lines 471-508) keeps the model's
  pieces (`_populate_vocab`, 308-315; `vocab_size` is their number, 370-372), `tokenize` is the model's
  `encode_as_ids` with nothing added (484-485), `eod` is the model's eos id (502-504).
- Megatron-LM, megatron/training/tokenizer/tokenizer.py at 6cf285b23889ab4b6b225d2896b3ed1744685119:
  `_GPTSentencePieceTokenizer` (541-578) the same; `_Llama2Tokenizer` (581-628) the same vocabulary and eod,
  `tokenize(s, bos=True, eos=False)` puts the bos id first (597-605); `_SentencePieceTokenizer` (371-538)
  appends <CLS>, <SEP>, <EOD>, <MASK>, then the pad, bos and eos pieces (<PAD> where the model has no pad,
  id -1: `id_to_piece` raises IndexError), each missing one at the next id (398-437), its `eod` is <EOD>'s
  id (525-526), and `tokenize` (466-488) cuts the text at the earliest special piece and encodes between.
  The same class is in Megatron-DeepSpeed's file, lines 297-469.
What Megatron's tools/preprocess_data.py writes for a document is `tokenize(text)` then, with
--append-eod, the eod id: the embedded corpus prepared with such a tokenizer is checked against that.
"""

import pytest

from data import DataError
from data.corpus import default_corpus_documents
from data.indexed import IndexedDataset
from data.sentencepiece_tokenizer import SentencePieceTokenizer, load_sentencepiece_tokenizer
from data.tokenizer import load_named_tokenizer

TEXTS = ["Hello, world!", "def f(x):\n    return x ** 2  # 1234\n", "naïve café — 日本語 🎉", ""]
PIECES = 512  # the session model's (tests/conftest.py's sentencepiece_model)


@pytest.fixture(scope="module")
def processor(sentencepiece_model):
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=sentencepiece_model)


def test_gpt_sentencepiece_is_the_models_own_encoding(sentencepiece_model, processor):
    tokenizer = load_sentencepiece_tokenizer("GPTSentencePieceTokenizer", sentencepiece_model)
    assert [tokenizer.encode(text) for text in TEXTS] == [processor.encode(text) for text in TEXTS]
    assert tokenizer.encode_batch(TEXTS) == [processor.encode(text) for text in TEXTS]
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (PIECES, processor.eos_id()) == (512, 2)
    ids = tokenizer.encode(TEXTS[1])
    assert tokenizer.decode(ids) == processor.decode(ids)


def test_llama2_puts_bos_first(sentencepiece_model, processor):
    tokenizer = load_sentencepiece_tokenizer("Llama2Tokenizer", sentencepiece_model)
    expected = [[processor.bos_id(), *processor.encode(text)] for text in TEXTS]
    assert [tokenizer.encode(text) for text in TEXTS] == expected and tokenizer.encode_batch(TEXTS) == expected
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (PIECES, processor.eos_id())


def test_sentencepiece_adds_megatrons_special_pieces(sentencepiece_model, processor):
    tokenizer = load_sentencepiece_tokenizer("SentencePieceTokenizer", sentencepiece_model)
    # <CLS> 512, <SEP> 513, <EOD> 514, <MASK> 515, <PAD> 516 (no pad in the model); <s> and </s> are its 1 and 2
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (PIECES + 5, PIECES + 2)
    assert [tokenizer.encode(text) for text in TEXTS] == [processor.encode(text) for text in TEXTS]
    text = "a<EOD>b </s><MASK><CLS> c"
    expected = [*processor.encode("a"), 514, *processor.encode("b "), 2, 515, 512, *processor.encode(" c")]
    assert tokenizer.encode(text) == expected and tokenizer.encode_batch([text, ""]) == [expected, []]
    assert tokenizer.decode([*processor.encode("a"), 514, *processor.encode("b")]) == "a <EOD> b"


def test_the_corpus_is_each_document_tokenized_then_eod(sentencepiece_corpus, processor):
    """How a launch's dataset is made with such a tokenizer: the same door the tokenizer.json path uses."""
    documents = default_corpus_documents()
    dataset = IndexedDataset(sentencepiece_corpus.data_prefix)
    assert len(dataset) == len(documents) and sentencepiece_corpus.vocab_size == PIECES
    for index in (0, len(documents) // 2, len(documents) - 1):
        assert dataset[index].tolist() == processor.encode(documents[index]) + [processor.eos_id()]


@pytest.mark.parametrize("content, words", [
    (None, "file not found"),
    (b"", "an empty file, not a SentencePiece model"),
    (b"this is not a protobuf", "not a SentencePiece model"),
])
def test_a_missing_or_unreadable_model_is_one_error_naming_the_flag(tmp_path, content, words):
    path = tmp_path / "tokenizer.model"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(DataError, match=words) as error:
        load_sentencepiece_tokenizer("GPTSentencePieceTokenizer", str(path))
    assert str(error.value).startswith(f"--tokenizer-model {path}") and "\n" not in str(error.value)


def test_a_model_without_eos_has_no_end_of_document(tmp_path):
    from tests.conftest import train_sentencepiece_model

    path = tmp_path / "no-eos.model"
    train_sentencepiece_model(path, default_corpus_documents()[:200], vocab_size=400, eos_id=-1)
    with pytest.raises(DataError, match="no end-of-sentence piece"):
        load_sentencepiece_tokenizer("GPTSentencePieceTokenizer", str(path))
    assert SentencePieceTokenizer("SentencePieceTokenizer", path.read_bytes()).eod_id == 402  # <EOD> added


def test_a_model_without_a_sentencepiece_type_says_which_type_to_give(sentencepiece_model):
    """Before: "not a valid tokenizer.json" and the JSON parser's complaint, with no word of the types."""
    with pytest.raises(DataError, match="a SentencePiece model needs --tokenizer-type GPTSentencePieceTokenizer or "
                                        "Llama2Tokenizer or SentencePieceTokenizer"):
        load_named_tokenizer(None, sentencepiece_model, None, None)
