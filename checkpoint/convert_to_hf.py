"""Convert a training checkpoint into a Hugging Face folder that transformers loads as is: a GPT-2
(GPT2LMHeadModel) or, for a model with Llama's blocks, its family's class (LlamaForCausalLM, MixtralForCausalLM,
Qwen3MoeForCausalLM, DeepseekV3ForCausalLM, ...: docs/checkpoints.md's family tables; a dense family by
--hf-model-type, which --init-from-hf sets to the folder's), chosen by the checkpoint's model config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from base.errors import ConfigError, OneLineArgumentParser, run_tool
from checkpoint.format import read_metadata
from checkpoint.formats import MEGATRON
from checkpoint.global_load import DTYPE_NAMES
from checkpoint.hf.folders import check_output_folder, checkpoint_to_hf_state, class_of, write_hf_folder
from checkpoint.inside import inside
from checkpoint.integrity import verify_or_raise
from checkpoint.output_paths import prepare_output_directory, refuse_inside_checkpoint
from checkpoint.tokenizer_check import FOLDER_IDS_KEY
from checkpoint.tool_input import tool_checkpoint_and_format
from checkpoint.torch_dist.common import load_common, saved_args

PROGRAM = "convert_to_hf.py"
# --dtype of model.safetensors: the precisions a run trains in, by their names
EXPORT_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", metavar="CKPT", help="a --save directory or one iter_NNNNNNN directory")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="the Hugging Face folder to write")
    parser.add_argument("--dtype", choices=EXPORT_DTYPES, default="fp32", help="dtype of model.safetensors (default fp32)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in OUT_DIR (refused when it holds other files)")
    parser.add_argument("--verify-checkpoint", action=argparse.BooleanOptionalAction, default=True,
                        help="check each checkpoint file's content hash before reading it")
    return parser.parse_args(argv)


def convert(checkpoint: str, out_dir: str, dtype: torch.dtype, overwrite: bool, verify: bool = True) -> None:
    started = time.perf_counter()
    iteration_dir, fmt = tool_checkpoint_and_format(checkpoint, "scripts/tools/convert_to_hf.py", reads_megatron=True)
    if Path(out_dir).resolve() in (iteration_dir.resolve(), *iteration_dir.resolve().parents):
        raise ConfigError(f"{out_dir} holds the checkpoint {iteration_dir}; write the folder somewhere else")
    refuse_inside_checkpoint(out_dir, "OUT_DIR", include_self=True)
    if fmt is MEGATRON:
        tokenizer_dir = None  # Megatron-LM saves none
        check_output_folder(Path(out_dir), overwrite, tokenizer_dir)
        prepare_output_directory(Path(os.path.abspath(out_dir)).parent, "OUT_DIR's parent")
        model_config, hf_state, given, eod = read_megatron(iteration_dir)
        folder_ids = None
    else:
        metadata = read_metadata(iteration_dir)
        tokenizer = metadata.get("tokenizer")
        tokenizer_dir = inside(iteration_dir, tokenizer) if tokenizer is not None else None
        eod = None  # the tokenizer's own
        folder_ids = metadata.get(FOLDER_IDS_KEY)  # the model folder's the run started from, where it did
        # Checked before any weight is read, so a refused OUT_DIR costs nothing.
        check_output_folder(Path(out_dir), overwrite, tokenizer_dir)
        prepare_output_directory(Path(os.path.abspath(out_dir)).parent, "OUT_DIR's parent")
        verify_or_raise(iteration_dir, metadata, check_content=verify)
        print(f"reading {iteration_dir}: iteration {metadata['iteration']}, TP {metadata['tensor_parallel_size']} x "
              f"DP {metadata['data_parallel_size']}, ZeRO stage {metadata['zero_stage']}", flush=True)
        model_config, hf_state = checkpoint_to_hf_state(iteration_dir, progress=True)
    print(f"writing {out_dir} ({len(hf_state)} tensors in {dtype}, "
          f"{'with the tokenizer' if tokenizer_dir else 'no tokenizer in the checkpoint'})", flush=True)
    write_hf_folder(out_dir, hf_state, model_config, tokenizer_dir, dtype=dtype, overwrite=overwrite, eod_token_id=eod,
                   folder_ids=folder_ids)
    if fmt is MEGATRON:  # each config.json field the run's args do not give, named with the value written
        from checkpoint.megatron_hf_fields import unsourced_fields

        for line in unsourced_fields(json.loads((Path(out_dir) / "config.json").read_text()), given):
            print(line, flush=True)
    model_class = class_of(model_config)
    print(f"done in {time.perf_counter() - started:.1f} s: {model_class}.from_pretrained({str(out_dir)!r})",
          flush=True)


def read_megatron(iteration_dir: Path):
    """A Megatron-LM torch_dist directory's model, weights, given settings and end-of-document id, its files verified
    first."""
    from checkpoint.megatron_hf import end_of_document_id, megatron_to_hf_state  # DCP imports sympy: only here
    from checkpoint.torch_dist.resume import verify_megatron

    verify_megatron(iteration_dir)
    common = load_common(iteration_dir)
    args = saved_args(common)
    print(f"reading Megatron-LM torch_dist checkpoint {iteration_dir}: iteration {common['iteration']}, TP "
          f"{getattr(args, 'tensor_model_parallel_size', 1)} x PP {getattr(args, 'pipeline_model_parallel_size', 1)} "
          f"x EP {getattr(args, 'expert_model_parallel_size', 1)}", flush=True)
    return (*megatron_to_hf_state(iteration_dir), end_of_document_id(vars(args)))


def main(argv=None) -> int:
    return run_tool(PROGRAM, lambda: _main(argv))


def _main(argv) -> None:
    args = parse_args(argv)
    convert(args.checkpoint, args.out_dir, EXPORT_DTYPES[args.dtype], args.overwrite, args.verify_checkpoint)


if __name__ == "__main__":
    sys.exit(main())
