#!/usr/bin/env python
"""Consolidate a checkpoint's fp32 master weights into one safetensors file, offline.

    python scripts/tools/zero_to_fp32.py runs/ckpt runs/model_fp32.safetensors     # the latest iteration

Under bf16/fp16 the master is the run's real state, so its ZeRO fragments become whole tensors under the model's TP=1
names, the iteration and config in the metadata. The checkpoint is verified first; OUT is replaced only with
--overwrite."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script, the repo's packages are not on the path

from base.errors import ConfigError, OneLineArgumentParser, run_tool  # noqa: E402
from checkpoint.format import atomic_file, read_metadata, save_tensors  # noqa: E402
from checkpoint.integrity import verify_or_raise  # noqa: E402
from checkpoint.ours.source import consolidate  # noqa: E402
from checkpoint.output_paths import prepare_output_directory, refuse_existing, refuse_inside_checkpoint  # noqa: E402
from checkpoint.tool_input import tool_checkpoint  # noqa: E402

DEFAULT_FILE_NAME = "model_fp32.safetensors"
EXPORT_HEADER_KEYS = ("iteration", "vocab_size", "model_config")  # the safetensors metadata every export has


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineArgumentParser(prog="zero_to_fp32.py", description=__doc__.split("\n\n")[0],
                              epilog="Memory: the whole model in fp32 plus one optimizer partition.")
    p.add_argument("checkpoint", metavar="CKPT",
                   help="a --save directory (its latest checkpoint) or one iter_NNNNNNN directory")
    p.add_argument("output", metavar="OUT",
                   help=f"the safetensors file to write; an existing directory gets OUT/{DEFAULT_FILE_NAME}")
    p.add_argument("--overwrite", action="store_true", help="replace OUT if it is an earlier export of this tool")
    p.add_argument("--verify-checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="check each checkpoint file's content hash before reading it")
    return p.parse_args(argv)


def output_path(output: str | os.PathLike) -> Path:
    output = Path(output)
    return output / DEFAULT_FILE_NAME if output.is_dir() else output


def is_fp32_export(path: Path) -> bool:
    """Whether `path` is a regular file that export_fp32 wrote: safetensors whose metadata holds the
    header below. Only such a file is replaced with --overwrite; a user's other file never is."""
    from safetensors import safe_open

    if path.is_symlink() or not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt", device="cpu") as reader:
            return set(EXPORT_HEADER_KEYS) <= set(reader.metadata() or {})
    except Exception:  # safetensors raises its own types for anything that is not its format
        return False


def export_fp32(checkpoint: str | os.PathLike, output: str | os.PathLike, log=print, overwrite: bool = False,
                verify: bool = True) -> Path:
    """Write the master weights of `checkpoint` to `output` (see the module docstring); returns the
    file written."""
    iteration_dir = tool_checkpoint(checkpoint, "scripts/tools/zero_to_fp32.py")
    metadata = read_metadata(iteration_dir)
    output = output_path(output)
    refuse_inside_checkpoint(output, "OUT")
    refuse_existing(output, "OUT", overwrite)
    if output.exists() and not is_fp32_export(output):
        raise ConfigError(f"OUT {output} is not a file this tool wrote (a safetensors export with a model_config); "
                          f"--overwrite replaces only an earlier export: choose another path")
    prepare_output_directory(output.parent, "OUT's directory")
    verify_or_raise(iteration_dir, metadata, check_content=verify)
    log(f"> consolidating the fp32 master weights of {iteration_dir} (iteration {metadata['iteration']}, "
        f"TP {metadata['tensor_parallel_size']} x DP {metadata['data_parallel_size']}, "
        f"ZeRO stage {metadata.get('zero_stage')})", flush=True)
    weights = consolidate(iteration_dir, ("master",), progress=True)["master"]
    model_config = metadata["config"]["model"]
    header = dict(zip(EXPORT_HEADER_KEYS, (metadata["iteration"], model_config["vocab_size"], model_config)))
    with atomic_file(output) as temporary:  # a failure leaves no half-written file at OUT
        save_tensors(temporary, weights, header)
    numel = sum(tensor.numel() for tensor in weights.values())
    log(f"> wrote {output}: {len(weights)} tensors, {numel:,} parameters "
        f"({output.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return output


def main(argv=None) -> int:
    return run_tool("zero_to_fp32.py", lambda: _main(argv))


def _main(argv) -> None:
    args = parse_args(argv)
    export_fp32(args.checkpoint, args.output, overwrite=args.overwrite, verify=args.verify_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
