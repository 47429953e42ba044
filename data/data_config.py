"""The data's section of the run's settings: what the run reads (blends, splits, the tokenizer's files), the
loader's order, document masking and fill-in-the-middle, with their refusal checks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from base.errors import ConfigError
from base.options import option, section
from data import DataError
from data.fim_settings import FIMSettings
from data.gpt_dataset import parse_split
from data.per_split import SPLIT_FLAGS, DataSources, data_sources
from data.sampler import DATALOADER_TYPES, SINGLE
from data.tokenizer_types import OTHER_TOKENIZER_TYPES, TOKENIZER_TYPES, tokenizer_type_name, tokenizer_type_problem

# The flags that name the tokenizer
TOKENIZER_FLAGS = ("--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file")
# The flags that name the data (data/per_split.py)
DATA_SOURCE_FLAGS = ("--data-path", "--data-args-path", *SPLIT_FLAGS, "--per-split-data-args-path", "--mock-data",
                     "--data-file-list")


def _flags_named(message: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """The flags of `flags` that `message` names (a flag followed by a space, a comma, a colon or its end)."""
    return tuple(flag for flag in flags if re.search(re.escape(flag) + r"(?![\w-])", message))


@dataclass(frozen=True)
class DataConfig:
    # Megatron's form: one prefix ("path/to/x_text_document"), or "weight prefix weight prefix ...".
    # Empty means the embedded default corpus (CPython's pydoc topics).
    data_path: list[str] = option(default_factory=list, nargs="+",
                                  help="a dataset prefix, or 'weight prefix weight prefix ...' to blend; "
                                       "omit to train on the embedded corpus",
                                  aliases={"--train-data": "DeepSpeed-Megatron"})
    split: str = option("969,30,1", help="train,valid,test ratio of documents")
    # data/per_split.py: Megatron-LM's other ways to name the data (get_blend_and_blend_per_split)
    data_args_path: Optional[str] = option(None, help="a file holding the --data-path list (prefixes, or weight/prefix "
                                                      "pairs, whitespace-separated), for lists too long to type")
    train_data_path: Optional[list[str]] = option(
        None, nargs="*", help="the training blend (a prefix, prefixes, or weight/prefix pairs, as --data-path), read "
                              "whole: no --split")
    valid_data_path: Optional[list[str]] = option(None, nargs="*", help="the validation blend, as --train-data-path "
                                                                        "(none: no validation)")
    test_data_path: Optional[list[str]] = option(None, nargs="*", help="the test blend, as --train-data-path (none: "
                                                                       "no test)")
    per_split_data_args_path: Optional[str] = option(
        None, help="a JSON file whose train, valid and test keys hold the per-split blends (a list, a string, or null)")
    # data/corpus_list.py: ALCF's Megatron-DeepSpeed fork's list of weighted prefixes by corpus
    data_file_list: Optional[str] = option(
        None, help="ALCF's fork: a file of 'weight prefix corpus' lines; each corpus's prefixes make one dataset, the "
                   "corpora blended by their samples, every prefix split by --split")
    shuffle_sample_in_corpus: bool = option(False, action="store_true",
                                            help="with --data-file-list: each corpus's samples read in a shuffled "
                                                 "order (ALCF's fork)")
    blend_sample_in_corpus: bool = option(False, action="store_true",
                                          help="with --data-file-list: each corpus's prefixes interleaved by their "
                                               "samples, not one after the other (ALCF's fork)")
    data_cache_dir: Optional[str] = option(None, help="where the embedded corpus and index caches go (default "
                                                      "~/.cache/zero-gpt)",
                                           aliases={"--data-cache-path": "Megatron-LM"})
    num_workers: int = option(0, help="data-loader worker processes")
    # data/sampler.py CyclicSampler: Megatron-LM's MegatronPretrainingRandomSampler
    dataloader_type: str = option(SINGLE, choices=DATALOADER_TYPES,
                                  help="single: each rank its slice of every global batch, in the dataset's order; "
                                       "cyclic: Megatron-LM's random sampler, a torch.randperm seeded with the epoch "
                                       "number, epoch after epoch")
    data_sharding: bool = option(True, help="with --dataloader-type cyclic, each data-parallel rank permutes its own "
                                            "contiguous bucket of the samples (Megatron-LM's default); "
                                            "--no-data-sharding: the whole dataset permuted, each rank taking every "
                                            "data-parallel-size-th index")
    # data/documents.py: Megatron-LM's get_ltor_masks_and_position_ids, from the tokenizer's end-of-document id
    reset_position_ids: bool = option(False, help="learned positions restart at 0 after each end-of-document token "
                                                  "(rotary positions do not, as in Megatron-LM)")
    reset_attention_mask: bool = option(False, help="a token attends only to its own document (block-diagonal "
                                                    "causal attention, split after each end-of-document token)")
    eod_mask_loss: bool = option(False, help="no loss where the input token is the end-of-document token (its "
                                             "prediction of the next document's first token)")
    # data/tokenizer.py load_named_tokenizer and data/documents.py: core_v0.18.0's NullTokenizer flags
    null_tokenizer_eod_id: Optional[int] = option(
        None, help="NullTokenizer's end-of-document id (default --vocab-size - 1); either NullTokenizer flag reads "
                   "--vocab-size N as N ids, as Megatron-LM core_v0.18 on does")
    null_tokenizer_pad_id: int = option(
        -1, help="NullTokenizer's pad id (-1: none): no loss where the label is it, and it is fed as token 0, as "
                 "Megatron-Core's GPTDataset does; one equal to the end-of-document id is dropped")
    allow_ambiguous_pad_tokens: bool = option(False, action="store_true",
                                              help="keep a pad id equal to the end-of-document id")
    # data/documents.py goldfish_kept: swiss-ai's Megatron-LM fork's goldfish loss (gpt_dataset.py apply_goldfish)
    goldfish_loss: bool = option(False, help="swiss-ai's goldfish loss: no loss on a token when the hash of the "
                                             "--goldfish-h labels ending at it falls below 1 / --goldfish-k")
    goldfish_k: int = option(50, help="with --goldfish-loss: about 1 in this many tokens gets no loss")
    goldfish_h: int = option(50, help="with --goldfish-loss: how many labels (the token's own and those before it) "
                                      "the hash reads")
    # data/mock.py
    mock_data: bool = option(False, help="train on Megatron's MockGPTDataset documents (token ids 1, 2, ... of "
                                         "random lengths, each ending in the end-of-document id) instead of data")
    fim: FIMSettings = section(FIMSettings)
    # None infers it from the files given (none: the embedded corpus's).
    tokenizer_type: Optional[str] = option(
        None, type=tokenizer_type_name, choices=(*TOKENIZER_TYPES, *OTHER_TOKENIZER_TYPES),
        help="Megatron-LM's: GPT2BPETokenizer (--vocab-file, --merge-file), HuggingFaceTokenizer (--tokenizer-model; "
             "BigScience's PretrainedFromHF), NullTokenizer (--vocab-size; data tokenized elsewhere), "
             "GPTSentencePieceTokenizer, Llama2Tokenizer, SentencePieceTokenizer (--tokenizer-model: a SentencePiece "
             ".model); Megatron's other types are refused with what to use; default: from the files given")
    tokenizer_file: Optional[str] = option(
        None, help="a tokenizers tokenizer.json (or, as --tokenizer-model, a folder holding one, or a SentencePiece "
                   "type's .model file); without --data-path "
                   "the embedded corpus is tokenized with it",
        aliases={"--tokenizer-model": "Megatron-LM", "--tokenizer-name-or-path": "BigScience's Megatron-DeepSpeed"})
    vocab_file: Optional[str] = option(None, flags=("--vocab-file", "--tokenizer-vocab-file"),
                                       help="GPT-2 style vocab.json (with --merge-file)")
    merge_file: Optional[str] = option(None, flags=("--merge-file", "--tokenizer-merge-file"),
                                       help="GPT-2 style merges.txt (with --vocab-file)")
    # Used only without --data-path.
    tokenizer_vocab_size: int = option(4096, help="vocabulary of the BPE trained on the embedded corpus")

    def sources(self) -> DataSources:
        """What the run reads: one blend split by --split, or one blend per split (data/per_split.py), the
        --data-args-path and --per-split-data-args-path files read; DataError in one line as Megatron-LM refuses."""
        return data_sources(self.data_path, self.data_args_path,
                            (self.train_data_path, self.valid_data_path, self.test_data_path),
                            self.per_split_data_args_path, self.mock_data, self.data_file_list)

    @property
    def newer_null_tokenizer(self) -> bool:
        """NullTokenizer under a flag only core_v0.18.0 on has: its reading of --vocab-size N as N ids."""
        return self.tokenizer_type == "NullTokenizer" and (self.null_tokenizer_eod_id is not None
                                                           or self.null_tokenizer_pad_id != -1)

    @property
    def user_data(self) -> bool:
        """The user names data (--data-path, a per-split blend, or their files): not the embedded corpus."""
        return bool(self.data_path or self.data_args_path or self.per_split_data_args_path or self.data_file_list
                    or any(paths is not None for paths in (self.train_data_path, self.valid_data_path,
                                                           self.test_data_path)))

    def validate(self) -> None:
        # The data files are opened later; their flags' syntax (and the list files) are read now, before any work.
        try:
            parse_split(self.split)
        except DataError as error:
            raise ConfigError(str(error), flags=("--split",)) from None
        try:
            self.sources()
        except DataError as error:
            raise ConfigError(str(error), flags=_flags_named(str(error), DATA_SOURCE_FLAGS)) from None
        self._validate_tokenizer()
        self.fim.validate(self.mock_data)
        if self.num_workers < 0:  # torch's DataLoader refuses it (as it does in Megatron-LM)
            raise ConfigError(f"--num-workers must be at least 0, got {self.num_workers}", flags=("--num-workers",))
        if self.tokenizer_vocab_size < 300:
            raise ConfigError(f"--tokenizer-vocab-size must be at least 300, got {self.tokenizer_vocab_size}",
                              flags=("--tokenizer-vocab-size",))

    def _validate_tokenizer(self) -> None:
        """The tokenizer's type and files, and what --data-path needs of them."""
        problem = tokenizer_type_problem(self.tokenizer_type, self.tokenizer_file, self.vocab_file)
        if problem:  # an unknown type is the flag's own fault; a known one's, its missing files' too
            flags = _flags_named(problem, TOKENIZER_FLAGS) if self.tokenizer_type in TOKENIZER_TYPES else \
                ("--tokenizer-type",)
            raise ConfigError(problem, flags=flags)
        if self.tokenizer_type == "NullTokenizer":
            if self.tokenizer_file or self.vocab_file or self.merge_file:
                raise ConfigError("--tokenizer-type NullTokenizer reads token ids as they are: drop --tokenizer-file, "
                                  "--vocab-file and --merge-file",
                                  flags=("--tokenizer-type", "--tokenizer-file", "--vocab-file", "--merge-file"))
            if not self.user_data and not self.mock_data:
                raise ConfigError("--tokenizer-type NullTokenizer needs --data-path (data tokenized elsewhere) or "
                                  "--mock-data; the "
                                  "embedded corpus is text and needs a real tokenizer",
                                  flags=("--tokenizer-type", "--data-path", "--mock-data"))
        elif self.user_data and not (self.tokenizer_file or self.vocab_file):
            raise ConfigError("--data-path needs the tokenizer it was prepared with: pass --tokenizer-file "
                              "(--tokenizer-model), --vocab-file and --merge-file, or --tokenizer-type NullTokenizer "
                              "with --vocab-size",
                              flags=("--data-path", "--tokenizer-file", "--vocab-file", "--merge-file", "--tokenizer-type",
                                     "--vocab-size"))
        if bool(self.vocab_file) != bool(self.merge_file):
            raise ConfigError("--vocab-file and --merge-file go together (GPT-2 style BPE files)",
                              flags=("--vocab-file", "--merge-file"))
        if self.tokenizer_file and self.vocab_file:
            raise ConfigError("pass either --tokenizer-file or --vocab-file/--merge-file, not both",
                              flags=("--tokenizer-file", "--vocab-file", "--merge-file"))

