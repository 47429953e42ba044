"""`python -m training.generate --load CK --prompt "..."`: text generated from a checkpoint, on one process or
tensor-parallel over torchrun's processes.

CK is this project's checkpoint, a Megatron-LM torch_dist folder or a Hugging Face folder. Sampling takes
Megatron-LM's flags (greedy by default); several prompts run in batches of --max-batch-size.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import torch

from arguments.bounds import parameter_lower_bound, rank_memory_bytes
from arguments.config import DataConfig, TrainingConfig
from arguments.training_config import check_device_name, check_seed
from base.errors import ConfigError, OneLineArgumentParser, run_tool
from base.input_files import read_text_file
from base.options import add_setting_flag
from checkpoint.inference_load import (
    InferenceCheckpoint,
    inference_checkpoint,
    inference_path,
    load_model_weights,
    open_source,
)
from data import DataError
from data.sentencepiece_tokenizer import SENTENCEPIECE_MODEL_FILE, SENTENCEPIECE_TYPES, load_sentencepiece_tokenizer
from data.tokenizer import load_named_tokenizer, load_tokenizer
from data.tokenizer_types import tokenizer_type_problem
from gpt.generation import generate_prompts
from gpt.kv_cache import cached_elements_per_token
from gpt.model import build_gpt_model
from gpt.sampling import Sampling
from parallel.launch_environment import read_launch_environment
from parallel.state import ParallelState, initialize, resolve_device

PROGRAM = "training.generate"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_TOKENS_TO_OOM = 12000  # Megatron-LM's --max-tokens-to-oom default
TOKEN_ID_BYTES = 8  # the batch's tokens are one int64 tensor


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = OneLineArgumentParser(prog=f"python -m {PROGRAM}", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--load", metavar="CK", help="a checkpoint: ours, Megatron-LM torch_dist, or a Hugging Face folder")
    where.add_argument("--init-from-hf", metavar="DIR", help="a Hugging Face folder")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", action="append", help="a prompt as text; again for another")
    prompt.add_argument("--prompts", nargs="+", metavar="TEXT", help="prompts as text (Megatron-LM's flag)")
    prompt.add_argument("--prompt-file", metavar="FILE", help="prompts as text, one a line (blank lines skipped)")
    prompt.add_argument("--prompt-ids", type=int, nargs="+", action="append", metavar="ID",
                        help="a prompt as token ids; again for another")
    parser.add_argument("--max-batch-size", type=int, default=8, metavar="N",
                        help="prompts run together at most (Megatron-LM's flag; default 8)")
    parser.add_argument("--num-tokens-to-generate", "--out-seq-length", "--max-new-tokens", dest="new_tokens",
                        type=int, default=30, metavar="N", help="tokens to generate at most (default 30)")
    parser.add_argument("--max-tokens-to-oom", type=int, default=MAX_TOKENS_TO_OOM, metavar="N",
                        help="a batch's prompt and new tokens at most, refused before memory runs out (Megatron-LM's "
                             f"flag; default {MAX_TOKENS_TO_OOM})")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--top_k", "--top-k", dest="top_k", type=int, default=1, help="1: greedy (the default); 0: off")
    parser.add_argument("--top_p", "--top-p", dest="top_p", type=float, default=0.0, help="nucleus mass; 0: off")
    add_setting_flag(parser, TrainingConfig, "seed")  # the sampling's random stream, bounded as training's
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-document token")
    parser.add_argument("--no-kv-cache", dest="kv_cache", action="store_false",
                        help="recompute the whole sequence each step")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="the weights' dtype (default fp32)")
    add_setting_flag(parser, TrainingConfig, "device")
    parser.add_argument("--verify-checkpoint", action=argparse.BooleanOptionalAction, default=True,
                        help="check each file's content hash first (this project's checkpoints)")
    for setting in ("tokenizer_type", "tokenizer_file", "vocab_file", "merge_file"):  # instead of the checkpoint's
        add_setting_flag(parser, DataConfig, setting)
    return parser.parse_args(argv)


def check_flags(args: argparse.Namespace) -> torch.device:
    """Check the flags alone; returns the device to run on."""
    check_seed(args.seed)
    check_device_name(args.device)
    problem = tokenizer_type_problem(args.tokenizer_type, args.tokenizer_file, args.vocab_file)
    if problem:
        raise ConfigError(problem)
    if bool(args.vocab_file) != bool(args.merge_file):
        raise ConfigError("--vocab-file and --merge-file go together (GPT-2 style BPE files)")
    if args.new_tokens < 1:
        raise ConfigError(f"--num-tokens-to-generate {args.new_tokens}: give at least 1")
    if args.max_batch_size < 1:
        raise ConfigError(f"--max-batch-size {args.max_batch_size}: give at least 1")
    if args.max_tokens_to_oom < 1:
        raise ConfigError(f"--max-tokens-to-oom {args.max_tokens_to_oom}: give at least 1")
    try:
        return resolve_device(args.device)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def run_tokenizer(args: argparse.Namespace, checkpoint: InferenceCheckpoint):
    """The tokenizer the flags name, else the checkpoint's, else None."""
    if args.tokenizer_type == "NullTokenizer":  # ids only: no text and no known end token
        return None
    named = load_named_tokenizer(args.tokenizer_type, args.tokenizer_file, args.vocab_file, args.merge_file)
    folder = checkpoint.tokenizer_dir
    if named is not None or folder is None:
        return named
    if checkpoint.tokenizer_type in SENTENCEPIECE_TYPES and (folder / SENTENCEPIECE_MODEL_FILE).is_file():
        return load_sentencepiece_tokenizer(checkpoint.tokenizer_type, str(folder / SENTENCEPIECE_MODEL_FILE))
    files = {setting: str(path) for setting, path in checkpoint.tokenizer_files().items()}
    return load_tokenizer(files.get("tokenizer_file"), files.get("vocab_file"), files.get("merge_file"))


def prompt_texts(args: argparse.Namespace) -> Optional[list[str]]:
    """The text prompts the flags give, in order (None: the prompts are ids)."""
    if args.prompt_file is not None:
        lines = read_text_file(args.prompt_file, "--prompt-file").splitlines()  # bounded: not /dev/zero's stream
        texts = [line for line in lines if line.strip()]
        if not texts:
            raise ConfigError(f"--prompt-file {args.prompt_file}: no prompt in it (one a line)")
        return texts
    return args.prompt or args.prompts


def prompt_ids(args: argparse.Namespace, texts: Optional[list[str]], tokenizer, vocab_size: int) -> list[list[int]]:
    """Each prompt's token ids, in the order given."""
    if texts is not None:
        if tokenizer is None:
            raise ConfigError("--prompt: the checkpoint holds no tokenizer; give --tokenizer-file (or --vocab-file "
                              "and --merge-file, or --tokenizer-type with --tokenizer-model), or the prompt as "
                              "--prompt-ids")
        prompts = tokenizer.tokenize_batch(texts)
    else:
        prompts = args.prompt_ids
    for ids in prompts:
        if not ids:
            raise ConfigError("the prompt is empty: give at least one token")
        outside = [i for i in ids if not 0 <= i < vocab_size]
        if outside:
            raise ConfigError(f"prompt id {outside[0]} is outside the model's vocabulary (0..{vocab_size - 1})")
    return prompts


def check_lengths(args: argparse.Namespace, prompts: list[list[int]], config, world_size: int) -> None:
    """The tokens asked fit the model's positions and --max-tokens-to-oom, as Megatron-LM checks them, then this
    machine's memory."""
    positions, new = config.max_position_embeddings, args.new_tokens
    longest = max(map(len, prompts))
    if longest + new > positions:
        raise ConfigError(f"--num-tokens-to-generate {new} after a prompt of {longest} tokens makes {longest + new} "
                          f"positions, more than the model's {positions} (--max-position-embeddings; Megatron-LM "
                          f"refuses it too): generate at most {max(positions - longest, 0)}")
    cache = cached_elements_per_token(config) * DTYPES[args.dtype].itemsize // world_size if args.kv_cache else 0
    for start in range(0, len(prompts), args.max_batch_size):
        batch = prompts[start:start + args.max_batch_size]
        length = max(map(len, batch)) + new
        tokens = length * len(batch)
        if tokens > args.max_tokens_to_oom:
            raise ConfigError(f"{len(batch)} prompt{'s' * (len(batch) > 1)} in a batch, each run to {length} positions, "
                              f"make {tokens} tokens, "
                              f"more than --max-tokens-to-oom {args.max_tokens_to_oom} (Megatron-LM's guard before "
                              f"memory runs out): generate fewer tokens, lower --max-batch-size or raise "
                              f"--max-tokens-to-oom")
        needed, memory = tokens * (TOKEN_ID_BYTES + cache), rank_memory_bytes()
        if needed > memory:
            raise ConfigError(f"{tokens} tokens in a batch need at least {needed / 2**30:.3g} GiB for their ids"
                              f"{' and KV cache' if cache else ''}, more than this machine's {memory / 2**30:.3g} GiB: "
                              f"generate fewer tokens or lower --max-batch-size")


def check_model_fits(checkpoint: InferenceCheckpoint, dtype: str, world_size: int) -> None:
    """The weights in --dtype fit this machine's memory."""
    config = checkpoint.model
    parameters = parameter_lower_bound(config)[0]
    needed, memory = parameters * DTYPES[dtype].itemsize // world_size, rank_memory_bytes()
    if needed > memory:
        raise ConfigError(f"{checkpoint.described}: its model has at least {parameters:.3g} parameters, "
                          f"{needed / 2**30:.3g} GiB in {dtype} on each of {world_size} process(es), more than this "
                          f"machine's {memory / 2**30:.3g} GiB: is its model config right?")


def parallel_state(device: torch.device) -> ParallelState:
    """One process's state, or under torchrun the launched processes as one tensor-parallel group."""
    world_size = read_launch_environment().world_size
    if world_size == 1:
        return ParallelState(device=device)
    try:
        return initialize(str(device), tensor_parallel_size=world_size)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def generate_from(args: argparse.Namespace) -> tuple[list[list[int]], list[list[int]], Optional[object], ParallelState]:
    """(prompt ids, generated ids, tokenizer, state), every input checked before the build."""
    device = check_flags(args)
    texts = prompt_texts(args)
    checkpoint = inference_checkpoint(inference_path(args.load, args.init_from_hf), verify=args.verify_checkpoint)
    config = checkpoint.model
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    sampling.validate(config.vocab_size)
    tokenizer = run_tokenizer(args, checkpoint)
    prompts = prompt_ids(args, texts, tokenizer, config.vocab_size)
    world_size = read_launch_environment().world_size
    check_lengths(args, prompts, config, world_size)
    check_model_fits(checkpoint, args.dtype, world_size)
    state = parallel_state(device)
    model = build_gpt_model(config, state, seed=args.seed, dtype=DTYPES[args.dtype])
    with open_source(checkpoint, state) as source:
        load_model_weights(source, model, state)
    if state.rank == 0:
        size = f"{sum(p.numel() for p in model.parameters()):,} parameters" if state.tensor_parallel_size == 1 else \
            f"tensor-parallel over {state.tensor_parallel_size} processes"
        print(f"> {checkpoint.described}: {size}, {args.dtype} on {state.device}", flush=True)
    stop = None if args.ignore_eos or tokenizer is None else tokenizer.eod_id
    generator = torch.Generator(device=state.device).manual_seed(args.seed)
    new = generate_prompts(model.eval(), prompts, args.new_tokens, sampling, generator, stop_id=stop,
                           use_cache=args.kv_cache, max_batch_size=args.max_batch_size)
    return prompts, new, tokenizer, state


def _main(argv: Optional[Sequence[str]]) -> None:
    prompts, made, tokenizer, state = generate_from(parse_args(argv))
    try:
        if state.rank != 0:
            return
        for ids, new in zip(prompts, made):
            if tokenizer is not None and hasattr(tokenizer, "decode"):
                print(tokenizer.decode(ids + new), flush=True)
            print("generated ids: " + " ".join(map(str, new)), flush=True)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # no rank tears gloo's pairs down while rank 0 still prints
            torch.distributed.destroy_process_group()


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(PROGRAM, lambda: _main(argv), (DataError,))


if __name__ == "__main__":
    sys.exit(main())
