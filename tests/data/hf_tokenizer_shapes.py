"""Tiny tokenizer folders in the shapes of the families users bring, built with `tokenizers` under a test's
tmp_path (nothing is downloaded): each a BPE trained on a few sentences, with its family's special tokens, the
post-processor that puts its bos before a text, and a tokenizer_config.json naming its eos_token, as the released
folders do (Llama 2 and Mistral: <s> ... </s>; Llama 3: <|begin_of_text|> ... <|end_of_text|>; Gemma: <bos> ...
<eos>; GPT-2: <|endoftext|> and no bos)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Pack my box with five dozen liquor jugs!",
             "How vexingly quick daft zebras jump.", "Sphinx of black quartz, judge my vow.",
             "Über café naïve façade — 東京 🎉", "def f(x):\n    return x * 2\n"]


@dataclass(frozen=True)
class Shape:
    name: str
    specials: tuple[str, ...]  # first in the vocabulary (ids 0, 1, ...), or after it (Llama 3's)
    bos: str | None
    eos: str
    metaspace: bool  # SentencePiece-converted (Llama 2, Mistral, Gemma): '▁' for spaces, bytes as <0xNN>
    tokenizer_class: str = "PreTrainedTokenizerFast"  # transformers' class, as the released tokenizer_config.json
    specials_last: bool = False
    prefix_space: bool = True  # a '▁' before the text (Llama 2, Mistral), or not (Gemma)


SHAPES = {shape.name: shape for shape in (
    Shape("gpt2", ("<|endoftext|>",), None, "<|endoftext|>", metaspace=False, tokenizer_class="GPT2Tokenizer"),
    Shape("llama2", ("<unk>", "<s>", "</s>"), "<s>", "</s>", metaspace=True, tokenizer_class="LlamaTokenizer"),
    Shape("mistral", ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"), "<s>", "</s>", metaspace=True,
          tokenizer_class="LlamaTokenizer"),
    Shape("llama3", ("<|begin_of_text|>", "<|end_of_text|>"), "<|begin_of_text|>", "<|end_of_text|>",
          metaspace=False, specials_last=True),
    Shape("gemma", ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"), "<bos>",
          "<eos>", metaspace=True, tokenizer_class="GemmaTokenizer", prefix_space=False),
)}


def _trained(shape: Shape) -> Tokenizer:
    if shape.metaspace:
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        if shape.prefix_space:
            tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        else:
            tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                               decoders.Strip(" ", 1, 0)])
        leading = [*shape.specials, *(f"<0x{byte:02X}>" for byte in range(256))]
        alphabet: list[str] = []
    else:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        leading = [] if shape.specials_last else list(shape.specials)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=len(leading) + 300, min_frequency=1, special_tokens=leading,
                                  initial_alphabet=alphabet, show_progress=False)
    tokenizer.train_from_iterator(SENTENCES * 4, trainer)
    if shape.metaspace:  # the byte pieces are ordinary vocabulary entries in SentencePiece-converted files
        tokenizer.add_special_tokens(list(shape.specials))
    elif shape.specials_last:
        tokenizer.add_special_tokens(list(shape.specials))
    return tokenizer


def build_tokenizer_folder(directory: Path, name: str) -> Path:
    """`directory` holding the shape's tokenizer.json and tokenizer_config.json."""
    shape = SHAPES[name]
    tokenizer = _trained(shape)
    if shape.bos is None:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{shape.bos} $A", pair=f"{shape.bos} $A {shape.bos} $B",
            special_tokens=[(shape.bos, tokenizer.token_to_id(shape.bos))])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"tokenizer_class": shape.tokenizer_class, "bos_token": shape.bos, "eos_token": shape.eos,
              "add_bos_token": shape.bos is not None, "add_eos_token": False}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return directory
