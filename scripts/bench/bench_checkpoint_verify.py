#!/usr/bin/env python
"""What checkpoint integrity costs: the content hashing a save adds and the verification a load adds, on a checkpoint
of about --gigabytes GB (16 bytes a parameter: fp32 model, master and both Adam moments).

    python scripts/bench/bench_checkpoint_verify.py --gigabytes 1 --dir /tmp/bench-ckpt

Reads right after the save hit the page cache; a network file system adds its read time to the hashes."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script, the repo's packages are not on the path

from base.errors import OneLineArgumentParser, run_tool  # noqa: E402
from checkpoint.format import read_metadata  # noqa: E402
from checkpoint.integrity import DEFAULT_HASH, hash_files, verify_checkpoint  # noqa: E402

BYTES_PER_PARAMETER = 16  # fp32 weights + fp32 master + two fp32 Adam moments


def bench(gigabytes: float, directory: Path) -> None:
    import torch

    from arguments.config import PretrainConfig
    from checkpoint.ours.sharded import save_checkpoint
    from gpt.model import GPTModel
    from parallel.state import ParallelState
    from zero.apply import apply_zero

    per_layer = 12 * 1024 * 1024
    target = gigabytes * 1e9 / BYTES_PER_PARAMETER
    model_config = dataclasses.replace(PretrainConfig().model, hidden_size=1024, num_attention_heads=16,
                                       vocab_size=50304, num_layers=max(1, round((target - 50304 * 1024) / per_layer)))
    config = dataclasses.replace(PretrainConfig(), model=model_config)
    state = ParallelState(device=torch.device("cpu"))
    model = GPTModel(model_config, state)
    optimizer = apply_zero(model, config, state, blocks=model.blocks).optimizer
    if directory.exists():
        shutil.rmtree(directory)

    started = time.perf_counter()
    iteration_dir = save_checkpoint(directory, 1, 0, model, optimizer, None, config, state)
    save_s = time.perf_counter() - started
    metadata = read_metadata(iteration_dir)
    size = sum(metadata["files"].values())

    started = time.perf_counter()
    hash_files(iteration_dir, metadata["files"])
    hash_s = time.perf_counter() - started
    started = time.perf_counter()
    assert verify_checkpoint(iteration_dir, metadata, check_content=False) is None
    structure_s = time.perf_counter() - started
    started = time.perf_counter()
    assert verify_checkpoint(iteration_dir, metadata, check_content=True) is None
    content_s = time.perf_counter() - started
    print(f"checkpoint: {size / 1e9:.2f} GB ({model_config.num_layers} layers x hidden 1024, fp32) in {iteration_dir}")
    print(f"save (hashing included): {save_s:.2f} s; of which hashing ({DEFAULT_HASH}): {hash_s:.2f} s "
          f"({size / 1e9 / hash_s:.2f} GB/s)")
    print(f"load verification: sizes, headers, dtypes {structure_s:.3f} s; with content hashes {content_s:.2f} s")
    shutil.rmtree(directory)


def main(argv=None) -> int:
    parser = OneLineArgumentParser(prog="bench_checkpoint_verify.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/bench-checkpoint-verify"),
                        help="where the checkpoint is written (deleted afterwards)")
    args = parser.parse_args(argv)
    bench(args.gigabytes, args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(run_tool("bench_checkpoint_verify.py", main))
