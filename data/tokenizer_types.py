"""Megatron's --tokenizer-type names: which are read here, which files each needs, and why the others are refused; one
table for training and preprocessing alike.
"""

from __future__ import annotations

from typing import Optional

from data.sentencepiece_tokenizer import SENTENCEPIECE_TYPES

GPT2_BPE = "GPT2BPETokenizer"
HUGGING_FACE = "HuggingFaceTokenizer"
NULL = "NullTokenizer"
TOKENIZER_TYPES = (GPT2_BPE, HUGGING_FACE, NULL, *SENTENCEPIECE_TYPES)
# Other programs' names for a Hugging Face tokenizer (Megatron-DeepSpeed's, ALCF's fork's).
TOKENIZER_TYPE_ALIASES = {"PretrainedFromHF": HUGGING_FACE, "HFTokenizer": HUGGING_FACE}

# tiktoken types are refused (an approximation is no substitute); Llama 3's and Mistral's releases ship a
# tokenizer.json.
_TIKTOKEN = ("a tiktoken model is not read here (Megatron reads it with the tiktoken library, not installed with "
             "this project): save it as a tokenizer.json (transformers' tokenizer.save_pretrained) and give "
             "--tokenizer-type HuggingFaceTokenizer --tokenizer-file DIR")
# Megatron-LM's (and its forks') other tokenizer types: known, and refused with what to use.
OTHER_TOKENIZER_TYPES = {name: _TIKTOKEN for name in ("TikTokenizer", "Llama3Tokenizer", "MistralTokenizer")}
OTHER_TOKENIZER_TYPES.update({
    name: "a BERT, multimodal or fine-tuning tokenizer does not pretrain a GPT: use GPT2BPETokenizer, "
          "HuggingFaceTokenizer or NullTokenizer"
    for name in ("BertWordPieceLowerCase", "BertWordPieceCase", "MultimodalTokenizer", "NullMultimodalTokenizer",
                 "SFTTokenizer")})


def tokenizer_type_name(name: str) -> str:
    """--tokenizer-type's value, other programs' names (PretrainedFromHF) read as ours."""
    return TOKENIZER_TYPE_ALIASES.get(name, name)


def tokenizer_type_problem(tokenizer_type: Optional[str], model: Optional[str], vocab_file: Optional[str]) -> \
        Optional[str]:
    """Why --tokenizer-type cannot work with the files given (one line), or None. `model` is --tokenizer-model;
    NullTokenizer's --vocab-size is checked where its default is known."""
    if tokenizer_type in OTHER_TOKENIZER_TYPES:
        return f"--tokenizer-type {tokenizer_type}: {OTHER_TOKENIZER_TYPES[tokenizer_type]}"
    if tokenizer_type not in (None, *TOKENIZER_TYPES):
        return f"--tokenizer-type {tokenizer_type!r} is not one of {', '.join(TOKENIZER_TYPES)}"
    if tokenizer_type == GPT2_BPE and not vocab_file:
        return ("--tokenizer-type GPT2BPETokenizer needs --vocab-file and --merge-file (GPT-2's gpt2-vocab.json and "
                "gpt2-merges.txt; nothing is downloaded here)")
    if tokenizer_type == HUGGING_FACE and not model:
        return ("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model: a tokenizer.json, or a folder "
                "holding one (nothing is downloaded here)")
    if tokenizer_type in SENTENCEPIECE_TYPES and not model:
        return (f"--tokenizer-type {tokenizer_type} needs --tokenizer-model: a SentencePiece .model file (nothing "
                f"is downloaded here)")
    return None
