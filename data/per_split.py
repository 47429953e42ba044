"""Megatron-LM's data sources: one blend split by --split (--data-path, --data-args-path), or one blend per split
(--train/valid/test-data-path, --per-split-data-args-path), checked by Megatron-LM's exclusion rules. --split beside
per-split blends is not read, said at start-up (K2-V2's launches give both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from base.input_files import read_text_file
from data import DataError
from data.corpus_list import ListedDataset, read_data_file_list
from data.gpt_dataset import SPLIT_NAMES, blend_split, parse_data_path
from data.indexed import IndexedDataset
from data.token_range import check_token_ids

SPLIT_FLAGS = ("--train-data-path", "--valid-data-path", "--test-data-path")
Blend = tuple[str, ...]  # a blend list as typed: prefixes, or weight/prefix pairs


@dataclass(frozen=True)
class DataSources:
    """What the run reads, with the flag or file each list came from."""
    blend: Optional[Blend] = None  # --data-path's list, or --data-args-path's
    blend_source: str = "--data-path"
    per_split: Optional[tuple[Optional[Blend], Optional[Blend], Optional[Blend]]] = None  # train, valid, test
    per_split_source: tuple[str, str, str] = SPLIT_FLAGS
    file_list: Optional[tuple[ListedDataset, ...]] = None  # ALCF's --data-file-list (data/corpus_list.py)
    file_list_source: str = "--data-file-list"

    @property
    def given(self) -> bool:
        """Data of the user's (not the embedded corpus, not mock data)."""
        return self.blend is not None or self.per_split is not None or self.file_list is not None

    def training_blend(self) -> Optional[Blend]:
        """The training list, as weight/prefix pairs where weights are given."""
        if self.file_list is not None:
            return tuple(token for entry in self.file_list for token in (repr(entry.weight), entry.prefix))
        return self.per_split[0] if self.per_split is not None else self.blend

    def training_source(self) -> str:
        if self.file_list is not None:
            return self.file_list_source
        return self.per_split_source[0] if self.per_split is not None else self.blend_source


def read_data_args(path: str, flag: str = "--data-args-path") -> Blend:
    """A --data-args-path file: its whitespace-separated tokens."""
    tokens = tuple(read_text_file(path, flag, error=DataError).split())
    if not tokens:
        raise DataError(f"{flag} {path}: the file names no dataset (it should hold a --data-path list: prefixes, or "
                        f"weight/prefix pairs)")
    return tokens


def read_per_split_data_args(path: str) -> tuple[Optional[Blend], Optional[Blend], Optional[Blend]]:
    """A --per-split-data-args-path file: JSON `train`, `valid`, `test`, each a list of tokens, a string of them, or
    null."""
    flag = "--per-split-data-args-path"
    try:
        data = json.loads(read_text_file(path, flag, error=DataError))
    except json.JSONDecodeError as error:
        raise DataError(f"{flag} {path}: not valid JSON ({error})") from None
    missing = [name for name in SPLIT_NAMES if not isinstance(data, dict) or name not in data]
    if missing:
        raise DataError(f"{flag} {path}: needs a JSON object with the keys train, valid and test (Megatron-LM reads "
                        f"all three); missing {', '.join(missing)}")
    blends = []
    for name in SPLIT_NAMES:
        value = data[name]
        if isinstance(value, str):
            value = value.split()
        if value is not None and not (isinstance(value, list) and all(isinstance(token, str) for token in value)):
            raise DataError(f"{flag} {path}: {name} must be a list of strings, a string or null, got {value!r}")
        blends.append(None if value is None else tuple(value))
    return blends[0], blends[1], blends[2]


def data_sources(data_path: Sequence[str], data_args_path: Optional[str],
                 split_paths: tuple[Optional[Sequence[str]], ...], per_split_data_args_path: Optional[str],
                 mock_data: bool, data_file_list: Optional[str] = None) -> DataSources:
    """The data sources the flags name, read and checked as Megatron-LM checks them; DataError in one line."""
    per_split_given = [flag for flag, paths in zip(SPLIT_FLAGS, split_paths) if paths is not None]
    if data_path and data_args_path:
        raise DataError("--data-path and --data-args-path name the same list: give one (Megatron-LM asserts it)")
    if per_split_given and per_split_data_args_path:
        raise DataError(f"{', '.join(per_split_given)} and --per-split-data-args-path name the same blends: give one "
                        f"(Megatron-LM asserts it)")
    kinds = [name for name, given in (("--mock-data", mock_data), ("--data-path", bool(data_path or data_args_path)),
                                      ("per-split data", bool(per_split_given or per_split_data_args_path)),
                                      ("--data-file-list", bool(data_file_list)))
             if given]
    if len(kinds) > 1:
        why = ("ALCF's fork reads --data-file-list and leaves the other unread" if "--data-file-list" in kinds
               else "Megatron-LM asserts it")
        raise DataError(f"{' and '.join(kinds)}: a single data source must be provided ({why}); drop all but one")
    if per_split_given or per_split_data_args_path:
        if per_split_data_args_path:
            per_split = read_per_split_data_args(per_split_data_args_path)
            source = tuple(f"--per-split-data-args-path {per_split_data_args_path} ({name})" for name in SPLIT_NAMES)
        else:
            per_split = tuple(None if paths is None else tuple(paths) for paths in split_paths)
            source = SPLIT_FLAGS
        named = "--per-split-data-args-path" if per_split_data_args_path else ", ".join(per_split_given)
        for blend, flag in zip(per_split, source):
            if blend is not None:
                check_blend(blend, flag)
        if per_split[0] is None:
            raise DataError(f"{named} without a training blend: give --train-data-path (or the file's train list); "
                            f"the run's samples come from it")
        return DataSources(per_split=per_split, per_split_source=source)  # type: ignore[arg-type]
    if data_file_list:
        return DataSources(file_list=read_data_file_list(data_file_list),
                           file_list_source=f"--data-file-list {data_file_list}")
    if data_args_path:
        blend = read_data_args(data_args_path)
        source = f"--data-args-path {data_args_path}"
        check_blend(blend, source)
        return DataSources(blend=blend, blend_source=source)
    if data_path:
        check_blend(tuple(data_path), "--data-path")
        return DataSources(blend=tuple(data_path))
    return DataSources()


def build_per_split_datasets(per_split: Sequence[Optional[Blend]], seq_length: int, seed: int,
                             num_samples: tuple[Optional[int], Optional[int], Optional[int]],
                             cache_dir: Optional[str] = None,
                             vocab_size: Optional[int] = None
                             ) -> tuple[Optional[torch.utils.data.Dataset], ...]:
    """Train, valid and test datasets, one blend per split, as Megatron-Core builds `blend_per_split`; None for a split
    without a blend or samples. With `vocab_size`, every token id is checked below it."""
    opened: dict[str, IndexedDataset] = {}  # a prefix in several splits is opened and checked once
    datasets = []
    for blend, count, name in zip(per_split, num_samples, SPLIT_NAMES):
        if blend is None:
            datasets.append(None)
            continue
        prefixes, weights = parse_data_path(blend)
        members = []
        for prefix, weight in zip(prefixes, weights or [None] * len(prefixes)):
            if prefix not in opened:
                opened[prefix] = IndexedDataset(prefix)
                if vocab_size is not None:
                    check_token_ids(opened[prefix], vocab_size)
            indexed = opened[prefix]
            if indexed.num_documents == 0:
                raise DataError(f"{prefix}: no documents, in the {name} blend; remove it from the blend or add data")
            members.append((indexed, (0, indexed.num_documents), weight))
        datasets.append(blend_split(members, weights is not None, count, seq_length, seed, name, cache_dir))
    return tuple(datasets)


def check_blend(blend: Sequence[str], flag: str) -> None:
    """A blend list's syntax, as one line naming where it came from."""
    try:
        parse_data_path(blend)
    except DataError as error:
        raise DataError(str(error).replace("--data-path", flag, 1)) from None


def describe_sources(sources: DataSources, split: str) -> str:
    """The data summary: which blend each split reads (said at start-up and by the planner)."""
    if sources.per_split is not None:
        parts = []
        for name, blend, source in zip(SPLIT_NAMES, sources.per_split, sources.per_split_source):
            if blend is None:
                parts.append(f"{name}: none")
                continue
            prefixes, weights = parse_data_path(blend)
            how = "" if len(prefixes) == 1 else (" weighted" if weights is not None else " blended by size")
            parts.append(f"{name}: {source}, {len(prefixes)} prefix{'es' if len(prefixes) > 1 else ''}{how}")
        return "one blend per split, each read whole (" + "; ".join(parts) + ")"
    if sources.file_list is not None:
        corpora = len({entry.corpus for entry in sources.file_list})
        return (f"{sources.file_list_source}, {len(sources.file_list)} weighted prefixes in {corpora} "
                f"corpus{'es' if corpora > 1 else ''} (ALCF's fork), split {split} into train/valid/test documents")
    if sources.blend is not None:
        prefixes, weights = parse_data_path(sources.blend)
        how = "" if len(prefixes) == 1 else (" weighted" if weights is not None else " blended by size")
        return (f"{sources.blend_source}, {len(prefixes)} prefix{'es' if len(prefixes) > 1 else ''}{how}, split "
                f"{split} into train/valid/test documents")
    return ""
