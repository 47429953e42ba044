#!/usr/bin/env python
"""Rewrite a checkpoint for another tensor-parallel size, offline.

    python scripts/tools/reshard_checkpoint.py runs/ckpt runs/ckpt_tp4 --tensor-model-parallel-size 4

A run loads any layout by itself (checkpoint/global_load.py); this hands a checkpoint already cut to tools that read
one TP rank's files. RNG states do not carry over; OUT is written atomically, as --save writes."""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script, the repo's packages are not on the path

import torch  # noqa: E402

from base.errors import ConfigError, OneLineArgumentParser, run_tool  # noqa: E402
from checkpoint.file_names import model_file, optimizer_file  # noqa: E402
from checkpoint.format import (  # noqa: E402
    METADATA_FILE,
    RECORDS,
    STAGING_SUFFIX,
    TOKENIZER_DIR,
    CheckpointError,
    commit,
    iteration_dir_name,
    metadata_text,
    read_metadata,
    remove_stale_saves,
    save_tensors,
    write_text_atomic,
)
from checkpoint.inside import folder_files  # noqa: E402
from checkpoint.integrity import hash_files, verify_or_raise  # noqa: E402
from checkpoint.ours.source import ZeroGptSource, saved_moment_dtypes  # noqa: E402
from checkpoint.output_paths import prepare_output_directory, refuse_inside_checkpoint  # noqa: E402
from checkpoint.save_directory import SaveDirectoryLock, holds_checkpoints  # noqa: E402
from checkpoint.tool_input import tool_checkpoint  # noqa: E402
from parallel.layers import padded_vocab_size  # noqa: E402
from zero.optimizer import PRECISION_DTYPES  # noqa: E402

# The parameters whose shape depends on the TP size beyond the split itself (vocabulary padding): a parameter
# table since the records says so itself (`real_rows`); one from before names none, and these are the two.
WORD_EMBEDDING = "word_embeddings.weight"
VOCABULARY = (WORD_EMBEDDING, "output_layer.weight")


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineArgumentParser(
        prog="reshard_checkpoint.py", description=__doc__.split("\n\n")[0],
        epilog="Memory: one new TP rank's slices of every optimizer state, read a region at a time; no GPU needed.")
    p.add_argument("checkpoint", metavar="CKPT",
                   help="a --save directory (its latest checkpoint) or one iter_NNNNNNN directory")
    p.add_argument("output", metavar="OUT",
                   help="a --save style directory to write into (created if missing; its 'latest' is replaced)")
    p.add_argument("--tensor-model-parallel-size", type=int, required=True, metavar="M",
                   help="the TP size the rewritten checkpoint is for")
    p.add_argument("--overwrite", action="store_true",
                   help="write into OUT although it holds checkpoints (a same-numbered one is replaced)")
    p.add_argument("--verify-checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="check each checkpoint file's content hash before reading it")
    return p.parse_args(argv)


# ---- the new layout ---------------------------------------------------------------------------

def check_splittable(metadata: dict, table: dict, tensor_parallel_size: int) -> None:
    """Each new TP rank must get whole attention heads and an equal slice of every split tensor."""
    heads = metadata["config"]["model"]["num_attention_heads"]
    if heads % tensor_parallel_size != 0:
        raise CheckpointError(f"--tensor-model-parallel-size {tensor_parallel_size} does not divide the model's "
                              f"{heads} attention heads; each TP rank needs whole heads")
    for name, entry in table.items():
        dim = entry["tensor_parallel_dim"]
        if dim is not None and entry["shape"][dim] % tensor_parallel_size != 0:
            raise CheckpointError(f"--tensor-model-parallel-size {tensor_parallel_size} does not divide "
                                  f"{name}'s dimension {dim} ({entry['shape'][dim]})")


def pads_vocabulary(name: str, entry: dict) -> bool:
    return entry.get("real_rows") is not None or name in VOCABULARY


def resharded_table(table: dict, vocabulary_rows: int) -> dict:
    """The parameter table with the vocabulary's new whole row count (the only shapes that change)."""
    if WORD_EMBEDDING not in table:
        raise CheckpointError(f"the checkpoint has no parameter {WORD_EMBEDDING}: not a GPT checkpoint of this repo")
    table = copy.deepcopy(table)
    for name, entry in table.items():
        if pads_vocabulary(name, entry):
            entry["shape"][0] = vocabulary_rows
    return table


def new_slice(entry: dict, tensor_parallel_rank: int, tensor_parallel_size: int
              ) -> tuple[list[int], list[int]]:
    """(global offset, local shape) of a new TP rank's slice: equal slices along the table's split dimension."""
    shape, dim = list(entry["shape"]), entry["tensor_parallel_dim"]
    offset = [0] * len(shape)
    if dim is not None:
        shape[dim] //= tensor_parallel_size
        offset[dim] = tensor_parallel_rank * shape[dim]
    return offset, shape


def read_slice(source: ZeroGptSource, key: str, name: str, offset: list[int], shape: list[int], saved_rows: int,
               dtype: torch.dtype) -> torch.Tensor:
    """The region of the saved whole tensor this slice covers; rows past the saved tensor's (new vocabulary
    padding) are zeros."""
    out = torch.zeros(shape, dtype=dtype)
    rows = min(offset[0] + shape[0], saved_rows) - offset[0] if shape else 1
    if rows > 0:
        region = tuple(slice(o, o + (rows if d == 0 else n)) for d, (o, n) in enumerate(zip(offset, shape)))
        out[:rows] = source.read(key, name, region).to(dtype)
    return out


def write_rank_files(staging: Path, source: ZeroGptSource, saved_table: dict, table: dict, tensor_parallel_rank: int,
                     tensor_parallel_size: int, dtype: torch.dtype, stored: dict[str, torch.dtype]) -> dict[str, int]:
    """One new TP rank's optimizer partition (DP rank 0 holds everything: one fragment per parameter, its slices
    end to end, each of the source's states in its `stored` dtype) and its model file; returns {file name: bytes}."""
    slices = {name: new_slice(entry, tensor_parallel_rank, tensor_parallel_size) for name, entry in table.items()}
    fragments, offset = [], 0
    for name, (_, shape) in slices.items():
        numel = torch.Size(shape).numel()
        fragments.append([name, 0, offset, numel])
        offset += numel
    records = {name: [slice_offset, shape] for name, (slice_offset, shape) in slices.items()}
    partition = {}
    for key in source.keys():
        partition[key] = torch.cat([read_slice(source, key, name, *slices[name], saved_table[name]["shape"][0],
                                               stored.get(key, torch.float32)).reshape(-1) for name in table])
    written = {}
    name = optimizer_file(tensor_parallel_rank, 0)
    written[name] = save_tensors(staging / name, partition, {"fragments": fragments, RECORDS: records})
    # What publish_parameters would make of these master weights: each one rounded to the training dtype.
    master, weights, position = partition["master"], {}, 0
    for param, (_, shape) in slices.items():
        numel = torch.Size(shape).numel()
        weights[param] = master[position:position + numel].view(shape).to(dtype)
        position += numel
    del partition
    written[model_file(tensor_parallel_rank)] = save_tensors(staging / model_file(tensor_parallel_rank), weights,
                                                             {RECORDS: records})
    return written


def resharded_metadata(metadata: dict, source: Path, table: dict, tensor_parallel_size: int,
                       files: dict[str, int]) -> dict:
    """The source's metadata for the new grid: training state (iteration, consumed samples, Adam step,
    loss scaler, lr) unchanged, no RNG files."""
    result = copy.deepcopy(metadata)
    # written as one stage, loadable at any; the experts go into the model files with every other weight
    for key in ("pipeline_parallel_size", "pipeline_stages", "expert_model_parallel_size", "expert_model_files",
                "context_parallel_size"):
        result.pop(key, None)
    result.update(
        tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=1,
        parameters=table,
        model_files=[[tp, model_file(tp)] for tp in range(tensor_parallel_size)],
        optimizer_shards=[[tp, 0, optimizer_file(tp, 0)] for tp in range(tensor_parallel_size)],
        rng_files=[],  # the TP-private streams of the old ranks mean nothing to the new ones
        files=files,
        resharded_from={"path": str(source), "tensor_parallel_size": metadata["tensor_parallel_size"],
                        "data_parallel_size": metadata["data_parallel_size"],
                        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
    )
    result["config"]["training"]["tensor_model_parallel_size"] = tensor_parallel_size
    return result


def copy_tokenizer(source: Path, metadata: dict, staging: Path) -> Optional[str]:
    """The run's tokenizer goes with its weights: each of its files, resolved inside the checkpoint
    (checkpoint/inside.py; a link out is refused, never copied); returns the metadata entry for it."""
    if not metadata.get("tokenizer"):
        return None
    files = folder_files(source, metadata["tokenizer"])
    (staging / TOKENIZER_DIR).mkdir()
    for path in files:
        shutil.copyfile(path, staging / TOKENIZER_DIR / path.name)
    return TOKENIZER_DIR


def stored_dtypes(metadata: dict) -> dict[str, torch.dtype]:
    """The dtype each optimizer state is written back in: as the checkpoint stored it (bf16 Adam moments under
    --exp-avg-dtype / --exp-avg-sq-dtype bf16; the rest fp32), so the rewrite is the size of the original and a
    resume reads the dtypes its config names. bf16 -> fp32 -> bf16 is exact."""
    return {key: torch.bfloat16 if dtype == "bf16" else torch.float32
            for key, dtype in saved_moment_dtypes(metadata).items()}


def write_resharded(staging: Path, source: ZeroGptSource, metadata: dict, table: dict, tensor_parallel_size: int,
                    log) -> None:
    """Every file of the new checkpoint into `staging`, metadata.json last (as a save does)."""
    files = {}
    for tp in range(tensor_parallel_size):
        written = write_rank_files(staging, source, metadata["parameters"], table, tp, tensor_parallel_size,
                                   PRECISION_DTYPES[metadata["precision"]], stored_dtypes(metadata))
        files.update(written)
        log(f"  wrote TP rank {tp}: " + ", ".join(f"{name} ({size / 2**20:.1f} MiB)"
                                                    for name, size in written.items()), flush=True)
    new_metadata = resharded_metadata(metadata, source.path, table, tensor_parallel_size, files)
    new_metadata["file_hashes"] = hash_files(staging, files)
    new_metadata["tokenizer"] = copy_tokenizer(source.path, metadata, staging)
    write_text_atomic(staging / METADATA_FILE, metadata_text(new_metadata))


# ---- the rewrite ------------------------------------------------------------------------------

def check_output(output: Path, overwrite: bool) -> None:
    """OUT is a save directory this rewrite may write into: not inside a checkpoint, and holding no
    checkpoints unless --overwrite."""
    refuse_inside_checkpoint(output, "OUT")
    if output.exists() and not output.is_dir():
        raise ConfigError(f"{output} is a file; OUT must be a directory (created if missing)")
    existing = holds_checkpoints(output)
    if existing and not overwrite:
        raise ConfigError(f"OUT {output} already holds checkpoints ({', '.join(existing[:3])}); pass --overwrite "
                          f"to write into it anyway, or choose another directory")


def reshard(checkpoint: str | os.PathLike, output: str | os.PathLike, tensor_parallel_size: int,
            log=print, overwrite: bool = False, verify: bool = True) -> Path:
    """Write `checkpoint` rewritten for `tensor_parallel_size` into the save directory `output` and
    point its `latest` at it; returns the new iteration directory."""
    if tensor_parallel_size < 1:
        raise CheckpointError(f"--tensor-model-parallel-size must be at least 1, got {tensor_parallel_size}")
    source = tool_checkpoint(checkpoint, "scripts/tools/reshard_checkpoint.py")
    metadata = read_metadata(source)
    output = Path(output)
    final = output / iteration_dir_name(metadata["iteration"])
    if final.resolve() == source.resolve():
        raise CheckpointError(f"{final} is the checkpoint being read; write the rewrite to another directory")
    check_output(output, overwrite)
    if metadata["precision"] not in PRECISION_DTYPES:
        raise CheckpointError(f"{source}: unknown training precision {metadata['precision']!r}")
    model = metadata["config"]["model"]
    try:
        rows = padded_vocab_size(model["vocab_size"], model["make_vocab_size_divisible_by"], tensor_parallel_size,
                                 model.get("pad_vocab_size_to"))
    except ValueError as error:
        raise ConfigError(f"{source}: {error}") from None
    table = resharded_table(metadata["parameters"], rows)
    check_splittable(metadata, table, tensor_parallel_size)

    prepare_output_directory(output, "OUT")
    with SaveDirectoryLock(output, log=lambda line: log(line, flush=True)):
        check_output(output, overwrite)  # again, now that no run can write into OUT meanwhile
        verify_or_raise(source, metadata, check_content=verify)
        log(f"> resharding {source} (iteration {metadata['iteration']}, TP {metadata['tensor_parallel_size']} x "
            f"DP {metadata['data_parallel_size']}, {metadata['precision']}) to TP {tensor_parallel_size} x DP 1",
            flush=True)
        remove_stale_saves(output)  # safe: the lock says no other writer is saving into OUT
        staging = final.with_name(final.name + STAGING_SUFFIX)
        staging.mkdir()
        try:
            with ZeroGptSource(source, metadata) as whole:  # every state the checkpoint's optimizer keeps
                write_resharded(staging, whole, metadata, table, tensor_parallel_size, log)
            commit(staging, final, output)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # nothing half-written stays behind
            raise
    log(f"> wrote {final} for --tensor-model-parallel-size {tensor_parallel_size}; {output / 'latest'} names it. "
        "RNG states are not carried over: the resumed run seeds them from --seed.", flush=True)
    return final


def main(argv=None) -> int:
    return run_tool("reshard_checkpoint.py", lambda: _main(argv))


def _main(argv) -> None:
    args = parse_args(argv)
    reshard(args.checkpoint, args.output, args.tensor_model_parallel_size, overwrite=args.overwrite,
            verify=args.verify_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
