"""The run's tokenizer and its train/valid/test loaders, sized from the resolved run settings."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from arguments.checkpoint_config import SAMPLE_ORDER_NAMES
from data.corpus import prepare_default_corpus
from data.corpus_list import build_corpus_list_datasets
from data.data_config import DataConfig
from data.fim import FIMConfig, FIMDataset, FIMTokenizer, FIMTransform
from data.gpt_dataset import APPENDABLE_ORDER, GPTDataset, build_train_valid_test_datasets
from data.megatron_order import MEGATRON_ORDER, MegatronOrderGPTDataset
from data.mock import build_mock_datasets
from data.per_split import DataSources, build_per_split_datasets, describe_sources
from data.sampler import CYCLIC, build_data_loader
from data.tokenizer import RunTokenizer, load_named_tokenizer, load_tokenizer
from gpt.model_config import ModelConfig
from parallel.state import ParallelState
from training.run_settings import RunSettings

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "zero-gpt"


@dataclass
class DataSplits:
    make_train_loader: Callable[[int], Iterable[dict]]  # consumed samples -> the rest of the data
    make_valid_loader: Optional[Callable[[], Iterable[dict]]]
    make_test_loader: Optional[Callable[[], Iterable[dict]]]
    summary: str = ""  # the data line: which blend each split reads, and its samples


def corpus_cache_dir(data: DataConfig) -> Optional[str]:
    """Where the embedded corpus is prepared; None when the user's data is used."""
    return None if data.user_data else str(data.data_cache_dir or DEFAULT_CACHE_DIR)


def load_tokenizer_and_data_sources(data: DataConfig, model: ModelConfig) -> tuple[RunTokenizer, DataSources]:
    """The user's tokenizer and data, else the embedded corpus and its tokenizer."""
    tokenizer = load_named_tokenizer(data.tokenizer_type, data.tokenizer_file, data.vocab_file, data.merge_file,
                                     model.vocab_size, data.newer_null_tokenizer, data.null_tokenizer_eod_id)
    if data.user_data:
        return tokenizer, data.sources()
    if data.mock_data and tokenizer is not None:
        return tokenizer, DataSources()  # build_data makes Megatron's mock documents with this tokenizer's ids
    corpus = prepare_default_corpus(corpus_cache_dir(data), data.tokenizer_vocab_size, tokenizer=tokenizer)
    if tokenizer is None:
        tokenizer = load_tokenizer(tokenizer_file=os.path.join(corpus.tokenizer_dir, "tokenizer.json"))
    if data.mock_data:  # mock data: the corpus's tokenizer only
        return tokenizer, DataSources()
    return tokenizer, DataSources(blend=(corpus.data_prefix,), blend_source="the embedded corpus")


class KeptAcrossRestarts:
    """What an in-process restart keeps between incarnations: the tokenizer and data sources."""

    def __init__(self) -> None:
        self._loaded: Optional[tuple[RunTokenizer, DataSources]] = None

    def tokenizer_and_data_sources(self, data: DataConfig, model: ModelConfig) -> tuple[RunTokenizer, DataSources]:
        if self._loaded is None:
            self._loaded = load_tokenizer_and_data_sources(data, model)
        return self._loaded


def sample_dataset_class(order: str, sources: DataSources) -> type[GPTDataset]:
    """The dataset reading the run's sample order."""
    return MegatronOrderGPTDataset if order == MEGATRON_ORDER and len(sources.blend) == 1 else GPTDataset


def build_datasets(settings: RunSettings, sources: DataSources, tokenizer: Optional[RunTokenizer], order: str,
                   num_samples: tuple[Optional[int], int, int]) -> tuple:
    """(train, valid, test, what they read) with `num_samples` of each split (None: one epoch)."""
    config, training = settings.config, settings.config.training
    if config.data.mock_data:
        if tokenizer is None:
            raise ValueError("--mock-data's documents need the run's tokenizer (its vocabulary and end-of-document id)")
        train_set, valid_set, test_set = build_mock_datasets(
            config.model.seq_length, training.seed, num_samples, tokenizer.vocab_size,
            tokenizer.eod_id, corpus_cache_dir(config.data))
        return train_set, valid_set, test_set, f"Megatron-Core's mock documents (--mock-data), split {config.data.split}"
    if sources.file_list is not None:
        # ALCF's --data-file-list: prefixes grouped by corpus
        datasets = build_corpus_list_datasets(
            sources.file_list, config.data.split, config.model.seq_length, training.seed, num_samples,
            shuffle=config.data.shuffle_sample_in_corpus, blended=config.data.blend_sample_in_corpus,
            cache_dir=config.data.data_cache_dir, vocab_size=settings.vocab_size)
        return (*datasets, describe_sources(sources, config.data.split))
    if sources.per_split is not None:
        # --train/valid/test-data-path: one blend per split, each prefix read whole
        datasets = build_per_split_datasets(
            sources.per_split, config.model.seq_length, training.seed, num_samples,
            cache_dir=config.data.data_cache_dir, vocab_size=settings.vocab_size)
        return (*datasets, describe_sources(sources, config.data.split))
    # --data-cache-path holds the index caches, else they go beside the data
    dataset_class = sample_dataset_class(order, sources)
    datasets = build_train_valid_test_datasets(
        list(sources.blend), config.data.split, config.model.seq_length, training.seed, num_samples,
        cache_dir=config.data.data_cache_dir, vocab_size=settings.vocab_size, dataset_class=dataset_class)
    return (*datasets, f"{describe_sources(sources, config.data.split)}, {SAMPLE_ORDER_NAMES[dataset_class.order]}")


def cyclic_order_clause(data: DataConfig, sources: DataSources, train_set, one_epoch: Optional[int],
                        run_samples: int) -> str:
    """The data line's words on --dataloader-type cyclic, whose training permutation spans one epoch of the split
    whatever --train-iters asks; the clause says where that is not Megatron-LM's order."""
    built = len(train_set) if train_set is not None else 0
    if one_epoch is not None and built == one_epoch:
        span = f"one epoch of the split's data, {built:,} samples,"
        if not isinstance(train_set, MegatronOrderGPTDataset):
            blended = sources.file_list is not None or sources.per_split is not None or len(sources.blend or ()) > 1
            differs = (f"Megatron-LM's permutes a blend's {run_samples:,} samples, the run's" if blended
                       else "its samples are this project's order")
        elif run_samples > built:
            differs = (f"the run's {run_samples:,} samples pass one epoch, and Megatron-LM's permutes all the "
                       "whole epochs its GPTDataset builds for them")
        else:
            differs = None
    else:
        span = (f"{built:,} samples (one epoch of the split's data holds less than a micro-batch per data-parallel "
                "rank),")
        differs = "Megatron-LM's permutes the whole epochs its dataset builds for the run's samples"
    sharding = ("each data-parallel rank its own bucket" if data.data_sharding
                else "--no-data-sharding: the whole split, each rank every data-parallel-size-th index")
    return (f"; read by Megatron-LM's cyclic sampler (--dataloader-type cyclic: a torch.randperm seeded with the epoch "
            f"number, {sharding}), every split; its training permutation spans {span} whatever --train-iters asks, "
            "so a continued run reads what the uninterrupted one reads, "
            + ("in Megatron-LM's order" if differs is None else f"not in Megatron-LM's order ({differs})")
            + "; each evaluation starts its split's order again where Megatron-LM's goes on")


def sharded_cyclic_resize_note(data: DataConfig, saved_data_parallel_size: Optional[int],
                               data_parallel_size: int) -> Optional[str]:
    """The start line of a cyclic-sampler resume at another DP size (some samples read again, as in Megatron-LM)."""
    if data.dataloader_type != CYCLIC or not data.data_sharding or saved_data_parallel_size is None \
            or saved_data_parallel_size == data_parallel_size:
        return None
    return (f"> note: --dataloader-type cyclic resumed at data-parallel size {data_parallel_size}, the checkpoint's "
            f"{saved_data_parallel_size}: each rank's bucket follows that size, so the rest of the current epoch reads "
            "some samples again and skips others, as Megatron-LM does; --no-data-sharding keeps one order at any size")


def build_data(settings: RunSettings, state: ParallelState, sources: DataSources,
               tokenizer: Optional[RunTokenizer] = None, order: str = APPENDABLE_ORDER,
               start: tuple[int, int] = (0, 0)) -> DataSplits:
    """Datasets sized for the run continued from `start` (iteration, consumed samples) and loaders that start at a
    number of consumed samples."""
    config, batch = settings.config, settings.batch
    training = config.training
    eval_samples = training.eval_batches * batch.global_batch_size
    # an upcycled run continues more samples than its iterations' batches: it reads past --train-iters' batches
    run_samples = max(batch.consumed_after(training.train_iters),
                      batch.consumed_after(max(training.train_iters - start[0], 0), start[1]))
    cyclic = config.data.dataloader_type == CYCLIC
    # the cyclic sampler's dataset length must not follow --train-iters
    train_set, valid_set, test_set, summary = build_datasets(
        settings, sources, tokenizer, order, (None if cyclic else run_samples, eval_samples, eval_samples))
    micro_step = batch.micro_batch_size * state.data_parallel_size
    one_epoch = len(train_set) if cyclic and train_set is not None else None
    if one_epoch is not None and one_epoch < micro_step:  # too little data for one micro-batch per rank
        train_set, valid_set, test_set, summary = build_datasets(
            settings, sources, tokenizer, order, (micro_step, eval_samples, eval_samples))
    counts = ", ".join(f"{name} {len(dataset):,}" if dataset is not None else f"{name} none"
                       for name, dataset in zip(("train", "valid", "test"), (train_set, valid_set, test_set)))
    summary = f"> data: {summary}; samples of {config.model.seq_length + 1} tokens: {counts}"
    if cyclic:
        summary += cyclic_order_clause(config.data, sources, train_set, one_epoch, run_samples)

    if config.data.fim.fim_data:
        if tokenizer is None:
            raise ValueError("--fim-data needs the run's tokenizer (it detokenizes and retokenizes samples)")
        d = config.data.fim
        transform = FIMTransform(FIMConfig(
            rate=d.fim_rate, spm_rate=d.fim_spm_rate, split_sample=d.fim_split_sample,
            fragment_rate=d.fim_fragment_rate, no_prefix=d.fim_no_prefix, prefix_token=d.fim_prefix_token,
            middle_token=d.fim_middle_token, suffix_token=d.fim_suffix_token, pad_token=d.fim_pad_token,
            eod_token=d.fim_eod_token), FIMTokenizer(tokenizer))
        train_set, valid_set, test_set = (None if ds is None else FIMDataset(ds, transform, training.seed)
                                          for ds in (train_set, valid_set, test_set))

    def loader(dataset, consumed_samples=0):
        return build_data_loader(dataset, consumed_samples=consumed_samples,
                                 micro_batch_size=batch.micro_batch_size, dp_rank=state.data_parallel_rank,
                                 dp_size=state.data_parallel_size, num_workers=config.data.num_workers,
                                 dataloader_type=config.data.dataloader_type,
                                 data_sharding=config.data.data_sharding)

    return DataSplits(
        make_train_loader=lambda consumed_samples: loader(train_set, consumed_samples),
        make_valid_loader=(lambda: loader(valid_set)) if valid_set is not None else None,
        make_test_loader=(lambda: loader(test_set)) if test_set is not None else None,
        summary=summary,
    )
