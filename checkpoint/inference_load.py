"""A checkpoint's model, weights and tokenizer with no optimizer (python -m training.generate), on one process or
tensor-parallel, through the loader's doors: the format told once, the model from what it records, weights read as
global tensors. DeepSpeed folders are refused, saying how to bring them over.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import nn

from base.errors import CheckpointError
from base.options import replace_settings
from checkpoint.format import has_checkpoint, read_metadata, resolve_checkpoint
from checkpoint.formats import MEGATRON, format_of, locate
from checkpoint.global_load import check_fits, parameter_records
from checkpoint.global_state import MODEL_KEY, GlobalStateSource
from checkpoint.inside import inside
from checkpoint.router_state import biased_routers, check_expert_biases, restore_expert_biases
from checkpoint.schema import recorded_model
from gpt.model_config import ModelConfig
from parallel.state import ParallelState

CONFIG_FILE = "config.json"  # a Hugging Face folder's


@dataclass(frozen=True)
class InferenceCheckpoint:
    """What a generation reads: the model to build, its tokenizer folder (None: none held), and a line on what was
    found."""
    model: ModelConfig
    tokenizer_dir: Optional[Path]
    described: str
    path: Path
    format_name: str  # "hf", "megatron", "ours": which source `open_source` makes
    tokenizer_type: Optional[str] = None  # the run's --tokenizer-type (a SentencePiece type reads tokenizer.model)

    def tokenizer_files(self) -> dict[str, Path]:
        """The tokenizer files beside the weights, by the settings that name them."""
        from arguments.hf_folder import folder_tokenizer

        return folder_tokenizer(self.tokenizer_dir) if self.tokenizer_dir is not None else {}


def is_hf_folder(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and not has_checkpoint(path)


def inference_path(load: Optional[str], pretrained: Optional[str]) -> Path:
    """The checkpoint a generation reads: --load's, else the --init-from-hf folder, which must be one."""
    if pretrained is not None and not is_hf_folder(Path(pretrained)):
        raise CheckpointError(f"--init-from-hf {pretrained}: no Hugging Face folder there (no config.json); "
                              f"give another checkpoint as --load")
    return Path(load if load is not None else pretrained)


def inference_checkpoint(path: str | os.PathLike, verify: bool = True) -> InferenceCheckpoint:
    """The checkpoint `path` names; its files verified unless `verify` is False."""
    path = Path(path)
    if is_hf_folder(path):
        return _hf_checkpoint(path)
    located = locate(path, False)
    if located is not None:
        raise CheckpointError(f"{path} is {located[0].name} checkpoint ({located[1].name}), which generation does not "
                              f"read; pretrain_gpt.py --load reads it: resume it with a --save (this project's format) "
                              f"and generate from that folder")
    iteration_dir = resolve_checkpoint(path)
    if format_of(iteration_dir) is MEGATRON:
        return _megatron_checkpoint(iteration_dir)
    return _our_checkpoint(iteration_dir, verify)


def _our_checkpoint(iteration_dir: Path, verify: bool) -> InferenceCheckpoint:
    from checkpoint.integrity import verify_or_raise

    metadata = read_metadata(iteration_dir)
    verify_or_raise(iteration_dir, metadata, check_content=verify)
    tokenizer = metadata.get("tokenizer")
    return InferenceCheckpoint(recorded_model(metadata["config"]["model"]),
                               inside(iteration_dir, tokenizer) if tokenizer is not None else None,
                               f"{iteration_dir}: iteration {metadata['iteration']}, saved at TP "
                               f"{metadata['tensor_parallel_size']}", iteration_dir, "ours",
                               metadata["config"].get("data", {}).get("tokenizer_type"))


def _megatron_checkpoint(iteration_dir: Path) -> InferenceCheckpoint:
    from checkpoint.megatron_hf import megatron_settings
    from checkpoint.torch_dist.common import load_common
    from checkpoint.torch_dist.resume import verify_megatron

    verify_megatron(iteration_dir)
    common = load_common(iteration_dir)
    return InferenceCheckpoint(megatron_settings(common)[0], None,  # Megatron-LM saves no tokenizer
                               f"{iteration_dir}: Megatron-LM torch_dist, iteration {common['iteration']}",
                               iteration_dir, "megatron")


def _hf_checkpoint(folder: Path) -> InferenceCheckpoint:
    from arguments.hf_config import read_hf_config
    from arguments.hf_folder import folder_tokenizer
    from arguments.parser import parse_arguments

    # The embedding has config.json's vocab_size rows whatever the tokenizer.
    model = parse_arguments(["--init-from-hf", str(folder)]).config.model
    model = replace_settings(model, vocab_size=read_hf_config(folder).vocab_size)
    return InferenceCheckpoint(model, folder if folder_tokenizer(folder) else None,
                               f"{folder}: a Hugging Face folder", folder, "hf")


@contextlib.contextmanager
def open_source(checkpoint: InferenceCheckpoint, state: ParallelState) -> Iterator[GlobalStateSource]:
    """The checkpoint's tensors as global tensors by this project's names."""
    if checkpoint.format_name == "hf":
        from checkpoint.hf.source import open_hf_source

        yield open_hf_source(checkpoint.path, checkpoint.model, state)
    elif checkpoint.format_name == "megatron":
        from checkpoint.torch_dist.source import MegatronSource

        yield MegatronSource(checkpoint.path)
    else:
        from checkpoint.ours.source import ZeroGptSource

        with ZeroGptSource(checkpoint.path) as source:
            yield source


@torch.no_grad()
def load_model_weights(source: GlobalStateSource, model: nn.Module, state: ParallelState) -> None:
    """Every parameter of this rank's `model` read from `source` (whole, or this rank's TP slice) once the checkpoint is
    checked to fit, and the routers' expert biases."""
    records = parameter_records(model)
    key = "master" if "master" in source.keys() else MODEL_KEY
    check_fits(source, key, records, state)
    biases = source.expert_biases()
    check_expert_biases(biases, biased_routers(model), str(source.path), source.saves_expert_bias)
    for name, (param, record) in records.items():
        region, local = list(record.region), [slice(0, size) for size in record.local_shape]
        if record.real_rows is not None:  # the vocabulary's padding rows: the model's own (never scored)
            rows = region[0]
            stop = min(rows.stop, record.real_rows)
            if stop <= rows.start:  # this rank's slice is padding only
                continue
            region[0], local[0] = slice(rows.start, stop), slice(0, stop - rows.start)
        param[tuple(local)] = source.read(key, name, tuple(region)).reshape(param[tuple(local)].shape)
    restore_expert_biases(model, biases, state.device)
