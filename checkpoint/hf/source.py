"""A Hugging Face folder as a `GlobalStateSource`, so --init-from-hf loads like every format and a rank reads only its
shard's bytes by safetensors offset. The family's conversion, run once on per-row stand-in ids, says which folder row
each of our rows is; folders it cannot map by rows are read whole and served from memory.
"""

from __future__ import annotations

import functools
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from arguments.config import ModelConfig
from arguments.hf_config import CONFIG_FILE, read_hf_config, read_json_object
from base.errors import CheckpointError, ConfigError
from checkpoint.global_load import ResumePoint, load_from_source
from checkpoint.global_state import MODEL_KEY, GlobalStateSource, GlobalTensorInfo, SourceProgress
from checkpoint.hf import folders as hf
from checkpoint.hf.mapping import hf_mapping, read_whole_because
from checkpoint.integrity import read_header
from families.common.layout import EXPERT_BIAS
from parallel.sharding import record_of
from parallel.state import ParallelState
from zero.optimizer_state import CheckpointableOptimizer

SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
                      "F8_E5M2": torch.float8_e5m2}
_ROW_BITS = 32  # a stand-in id is (folder tensor index + 1) << _ROW_BITS | row; 0 is a padding row


@dataclass(frozen=True)
class StoredTensor:
    """One tensor of a safetensors file: its name there, where its data starts (absolute), its dtype and shape."""
    name: str
    path: Path
    start: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def safetensors_header(path: Path) -> tuple[dict[str, StoredTensor], int]:
    """The file's tensors by name and the header's size, after checking the header as safetensors does, before any
    tensor bytes are read."""
    try:
        header, _ = read_header(path, path.stat().st_size)
        with open(path, "rb") as file:
            length = struct.unpack("<Q", file.read(8))[0]
    except OSError as error:
        raise ConfigError(f"{path}: cannot be read ({error.strerror or error})") from None
    except CheckpointError as error:
        raise ConfigError(str(error)) from None
    base, tensors = 8 + length, {}
    for name, entry in header.items():
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise ConfigError(f"{path}: tensor {name!r} is {entry['dtype']}, which no model here loads (the weights are "
                              f"{', '.join(SAFETENSORS_DTYPES)})")
        tensors[name] = StoredTensor(name, path, base + entry["data_offsets"][0], dtype, tuple(entry["shape"]))
    return tensors, base


def safetensors_files(hf_dir: Path) -> Optional[list[Path]]:
    """The folder's safetensors files (one, or those its index names), or None for a pickle folder."""
    if (hf_dir / hf.SAFETENSORS_FILE).is_file():
        return [hf_dir / hf.SAFETENSORS_FILE]
    index = hf_dir / hf.SAFETENSORS_INDEX_FILE
    if not index.is_file():
        return None
    weight_map = read_json_object(index, "the safetensors index names the weight files").get("weight_map")
    if not isinstance(weight_map, dict):
        raise ConfigError(f"{index}: has no weight_map")
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or Path(name).name != name:  # only files beside the index
            raise ConfigError(f"{index}: maps {tensor!r} to {name!r}, which is not a file name in the folder")
        if not (hf_dir / name).is_file():
            raise ConfigError(f"{index}: maps {tensor!r} to {name}, which is not in the folder")
    return [hf_dir / name for name in sorted(set(weight_map.values()))]


def read_rows(stored: StoredTensor, rows: slice, columns: Optional[slice]) -> torch.Tensor:
    """Rows `rows` of `stored`, only `columns` of each where given: one read for whole rows, one per row otherwise."""
    shape, item = stored.shape, stored.dtype.itemsize
    if not shape:
        rows, columns = slice(0, 1), None
    row_elements = torch.Size(shape[1:]).numel()
    with open(stored.path, "rb") as file:
        if columns is None or (columns.start == 0 and columns.stop == shape[1]):
            data = os.pread(file.fileno(), (rows.stop - rows.start) * row_elements * item,
                            stored.start + rows.start * row_elements * item)
            out_shape = (rows.stop - rows.start, *shape[1:]) if shape else ()
        else:
            width = columns.stop - columns.start
            data = b"".join(os.pread(file.fileno(), width * item, stored.start + (row * row_elements + columns.start)
                                     * item) for row in range(rows.start, rows.stop))
            out_shape = (rows.stop - rows.start, width)
    if len(data) != torch.Size(out_shape).numel() * item:
        raise CheckpointError(f"{stored.path}: ends inside a tensor's data (the file is truncated)")
    return torch.frombuffer(bytearray(data), dtype=stored.dtype).reshape(out_shape) if data else \
        torch.empty(out_shape, dtype=stored.dtype)


@dataclass(frozen=True)
class Run:
    """Rows [start, start + count) of one of our tensors: rows [row, row + count) of a folder tensor (columns if
    `transposed`), or padding (`stored` None)."""
    start: int
    count: int
    stored: Optional[StoredTensor]
    row: int
    transposed: bool


def traced_runs(stored: dict[str, StoredTensor], transposed: set[str],
                convert: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
                ) -> dict[str, tuple[list[Run], tuple[int, ...]]]:
    """Each of our tensors as runs of folder rows, and its global shape: `convert` run on stand-ins of one id per row (a
    tensor of more dimensions numbered by its [-1, last] view)."""
    names = list(stored)
    stand_ins = {}
    for index, name in enumerate(names):
        shape = tuple(stored[name].shape)
        rows = shape[1] if name in transposed else math.prod(shape[:-1]) if len(shape) > 1 else (shape or (1,))[0]
        ids = ((index + 1) << _ROW_BITS) + torch.arange(rows)
        stand_ins[name] = ids.reshape(1, -1) if name in transposed else \
            ids.reshape(*shape[:-1], 1) if len(shape) > 1 else ids if shape else ids[0]
    out = {}
    for ours, traced in convert(stand_ins).items():
        if traced.dtype != torch.int64 or traced.dim() > 2 or (traced.dim() == 2 and traced.shape[1] != 1):
            raise ValueError(f"{ours} is not a reordering of rows")
        flat = traced.reshape(-1)
        index, row = (flat >> _ROW_BITS) - 1, flat & ((1 << _ROW_BITS) - 1)
        goes_on = (index[1:] == index[:-1]) & ((index[1:] < 0) | (row[1:] == row[:-1] + 1))
        starts = [0, *(torch.nonzero(~goes_on).reshape(-1) + 1).tolist()]
        runs: list[Run] = []
        trailing: Optional[tuple[int, ...]] = None
        for start, stop in zip(starts, [*starts[1:], flat.numel()]):
            at = int(index[start])
            tensor = stored[names[at]] if at >= 0 else None
            flipped = tensor is not None and names[at] in transposed
            if tensor is not None:
                theirs = (tensor.shape[0],) if flipped else tuple(tensor.shape[-1:] if len(tensor.shape) > 1 else ())
                if trailing not in (None, theirs):
                    raise ValueError(f"{ours} joins rows of different widths")
                trailing = theirs
            runs.append(Run(start, stop - start, tensor, int(row[start]), flipped))
        shape = (traced.shape[0], *trailing) if traced.dim() else ()
        out[ours] = (runs, shape)
    return out


def read_runs(runs: list[Run], rows: slice, read_run: Callable[[Run, slice], torch.Tensor]) -> torch.Tensor:
    """`rows` of one of our tensors: of each run they overlap, `read_run(run, its rows of the run's tensor)`."""
    pieces = []
    for run in runs:
        start, stop = max(rows.start, run.start), min(rows.stop, run.start + run.count)
        if start < stop:
            pieces.append(read_run(run, slice(start - run.start + run.row, stop - run.start + run.row)))
    return torch.cat(pieces) if len(pieces) > 1 else pieces[0]


class HFSource(GlobalStateSource):
    """A Hugging Face folder's weights under our names at their global shapes, read a region at a time."""

    format_name = "hugging face"

    def __init__(self, hf_dir: Path, runs: dict[str, tuple[list[Run], tuple[int, ...]]], header_bytes: int,
                 shift: Callable[[str, torch.Tensor], torch.Tensor], tied_head: Optional[StoredTensor]):
        self.path = hf_dir
        self._runs = runs
        self._shift = shift  # the gain shift of --apply-layernorm-1p, elementwise
        self._tied_head = tied_head  # a tied model's lm_head, compared with the embedding rows read
        self.bytes_read = header_bytes  # every file's header is read on every rank (the tensors' shapes)
        # torch.cat promotes pieces of several dtypes.
        self._dtypes = {name: functools.reduce(torch.promote_types, [run.stored.dtype for run in runs if run.stored])
                        for name, (runs, _) in runs.items()}

    def keys(self) -> tuple[str, ...]:
        return (MODEL_KEY,)

    def tensors(self, key: str) -> dict[str, GlobalTensorInfo]:
        return {name: GlobalTensorInfo(shape, self._dtypes[name]) for name, (_, shape) in self._runs.items()
                if not name.endswith(EXPERT_BIAS)}

    def expert_biases(self) -> Optional[dict[str, list]]:
        """DeepSeek-V3's and GLM-4.5's e_score_correction_bias, read whole by every rank."""
        return {name: self.read(MODEL_KEY, name, (slice(0, shape[0]),)).tolist()
                for name, (_, shape) in self._runs.items() if name.endswith(EXPERT_BIAS)} or None

    def whole(self) -> dict[str, torch.Tensor]:
        """Every tensor read whole (the vocabulary's padding rows zeros), as `load_hf_weights` gives them."""
        return {name: self.read(MODEL_KEY, name, tuple(slice(0, size) for size in shape))
                for name, (_, shape) in self._runs.items()}

    def read(self, key: str, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        runs, shape = self._runs[name]
        if not shape:  # a scalar
            return self._shift(name, self._read(runs[0], slice(0, 1), None, self._dtypes[name]))
        rows, rest = region[0], region[1:]
        values = read_runs(runs, rows, lambda run, theirs: self._read(run, theirs, rest[0] if rest else None,
                                                                      self._dtypes[name]))
        if name == "word_embeddings.weight" and self._tied_head is not None:
            self._check_tied(values, rows, rest)
        return self._shift(name, values)

    def _read(self, run: Run, rows: slice, columns: Optional[slice], dtype: torch.dtype) -> torch.Tensor:
        """`rows` of the run's folder tensor (columns for a transposed one), `columns` of our tensor's."""
        if run.stored is None:
            width = () if columns is None else (columns.stop - columns.start,)
            return torch.zeros((rows.stop - rows.start, *width), dtype=dtype)
        if run.transposed:  # our rows are its columns: read our columns' span of its rows, narrowed
            values = read_rows(run.stored, columns, rows).t()
        else:
            values = read_rows(run.stored, rows, columns)
        self.bytes_read += values.numel() * values.element_size()
        return values.reshape(-1) if not run.stored.shape else values

    def _check_tied(self, values: torch.Tensor, rows: slice, rest: tuple[slice, ...]) -> None:
        """Our output layer is the embedding: a folder's lm_head must equal it (the rows this rank reads)."""
        stop = min(rows.stop, self._tied_head.shape[0])
        head = read_rows(self._tied_head, slice(rows.start, stop), rest[0] if rest else None)
        self.bytes_read += head.numel() * head.element_size()
        if not torch.equal(head, values[:stop - rows.start]):
            raise CheckpointError(f"{self.path}: lm_head.weight differs from the token embedding: our output layer "
                                  f"is tied to the token embedding")

    def progress(self) -> SourceProgress:
        return SourceProgress(iteration=0)

    def not_carried(self) -> list[str]:
        return []


class WholeFolderSource(GlobalStateSource):
    """The families read whole, served from memory; `bytes_read` what it holds."""

    format_name = "hugging face (whole folder)"

    def __init__(self, hf_dir: Path, weights: dict[str, torch.Tensor]):
        self.path = hf_dir
        self._all = weights
        self._weights = {name: t for name, t in weights.items() if not name.endswith(EXPERT_BIAS)}
        self._biases = {name: t.tolist() for name, t in weights.items() if name.endswith(EXPERT_BIAS)}
        self.bytes_read = sum(t.numel() * t.element_size() for t in weights.values())

    def keys(self) -> tuple[str, ...]:
        return (MODEL_KEY,)

    def tensors(self, key: str) -> dict[str, GlobalTensorInfo]:
        return {name: GlobalTensorInfo(tuple(t.shape), t.dtype) for name, t in self._weights.items()}

    def read(self, key: str, name: str, region: tuple[slice, ...]) -> torch.Tensor:
        return self._weights[name][region]

    def whole(self) -> dict[str, torch.Tensor]:
        return self._all

    def expert_biases(self) -> Optional[dict[str, list]]:
        """DeepSeek-V3's e_score_correction_bias: the routers' expert bias, not a parameter."""
        return self._biases or None

    def progress(self) -> SourceProgress:
        return SourceProgress(iteration=0)

    def not_carried(self) -> list[str]:
        return []


def _check_fp8_is_declared(hf_dir: Path, stored: dict[str, StoredTensor]) -> None:
    """An FP8 tensor belongs to a quantized release whose config.json says how to scale it; unscaled it would read
    wrong."""
    fp8 = sorted(name for name, tensor in stored.items() if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2))
    if fp8 and "quantization_config" not in read_json_object(hf_dir / CONFIG_FILE, "the model's configuration"):
        raise ConfigError(f"{hf_dir}: {fp8[0]} is stored in FP8 ({len(fp8)} tensor{'s' * (len(fp8) > 1)}), but "
                          f"config.json has no quantization_config saying how its values are scaled; save the folder "
                          f"in 16 or 32 bits")


def open_hf_source(hf_dir: str | os.PathLike, model_config: ModelConfig, state: ParallelState,
                   held_experts: Optional[set[tuple[int, int]]] = None):
    """The folder as a source for `model_config` at this TP size, once its config and tensor shapes are checked."""
    hf.refuse_mtp(model_config, "--init-from-hf")
    hf.refuse_hybrid_layers(model_config, "--init-from-hf")
    hf_dir = Path(hf_dir)
    config = read_hf_config(hf_dir)
    files = safetensors_files(hf_dir)
    stored, header_bytes = {}, 0
    for path in files or ():
        tensors, size = safetensors_header(path)
        stored.update(tensors)
        header_bytes += size
    _check_fp8_is_declared(hf_dir, stored)
    # Experts saved fused are split in memory, so those folders are read whole.
    by_offset = files is not None and read_whole_because(config.family) is None \
        and not any(name.endswith(("experts.gate_up_proj", "experts.down_proj")) for name in stored)
    if not by_offset:
        return WholeFolderSource(hf_dir, hf.read_whole_folder(hf_dir, model_config, state, held_experts))
    mapping = hf_mapping(config.family, model_config, model_config.padded_vocab_size(state.tensor_parallel_size))
    # A name-only pass: an MoE family's refuses quantized weights and drops the MTP layers.
    stored = mapping.canonical(stored)
    mapping.check_config(config.fields, model_config, hf_dir / CONFIG_FILE)
    embedding, tied = mapping.embedding, mapping.tied
    meta = {name: torch.empty(t.shape, dtype=t.dtype, device="meta") for name, t in stored.items()}
    head = stored.get("lm_head.weight") if tied else None
    hf.check_tensors_fit({name: t for name, t in meta.items() if not (tied and name == "lm_head.weight")},
                         mapping.shapes, hf_dir, embedding, tied)
    if head is not None and head.shape != stored[embedding].shape:
        raise ConfigError(f"{hf_dir}: lm_head.weight has shape {list(head.shape)}, {embedding} "
                          f"{list(stored[embedding].shape)}: our output layer is tied to the token embedding")
    runs = traced_runs(stored, mapping.transposed, mapping.convert)
    return HFSource(hf_dir, runs, header_bytes, mapping.shift, head)


def load_hf_weights(hf_dir: str | os.PathLike, model_config: ModelConfig, state: ParallelState,
                    held_experts: Optional[set[tuple[int, int]]] = None) -> dict[str, torch.Tensor]:
    """A Hugging Face folder's weights, whole, under our names and layout, once checked against `model_config`; with
    `held_experts` the other experts are not read."""
    return open_hf_source(hf_dir, model_config, state, held_experts).whole()


_OUR_EXPERT = re.compile(r"^blocks\.(\d+)\.mlp\.experts\.(\d+)\.")


def initialize_from_hf(optimizer: CheckpointableOptimizer, model: nn.Module, hf_dir: str | os.PathLike,
                       model_config: ModelConfig, state: ParallelState, log=print) -> ResumePoint:
    """Start a run from a Hugging Face folder's weights (--init-from-hf), loaded as every checkpoint is: each rank reads
    its own shard's regions."""
    params = dict(model.named_parameters())
    held = {(int(match.group(1)), int(match.group(2))) for match in map(_OUR_EXPERT.match, params) if match}
    expert_parallel = any(record_of(param).is_expert for param in params.values())
    source = open_hf_source(hf_dir, model_config, state, held if expert_parallel else None)
    return load_from_source(source, model, optimizer, None, state, finetune=True, log=log)
