"""A rank's random states in a checkpoint: Python, NumPy, torch CPU/CUDA and the tensor-parallel stream. Streams do not
depend on the DP rank, so another DP size takes DP rank 0's; at another TP or pipeline size none is restored and the
streams start from the seed, as Megatron-LM's load_checkpoint does.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from base.errors import CheckpointError
from checkpoint.format import open_tensors
from parallel.random import TensorParallelRNG
from parallel.state import ParallelState


def rng_tensors(rng: Optional[TensorParallelRNG]) -> tuple[dict[str, torch.Tensor], dict]:
    tensors: dict[str, torch.Tensor] = {}
    if rng is not None:
        for key, value in rng.get_states().items():
            if value is not None:
                tensors[f"torch_{key}"] = value
    else:
        tensors["torch_default_cpu"] = torch.get_rng_state()
    kind, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    tensors["numpy_keys"] = torch.from_numpy(keys.astype(np.int64))
    version, python_state, gauss = random.getstate()
    return tensors, {"numpy": [kind, int(position), int(has_gauss), float(cached_gaussian)],
                     "python": [version, list(python_state), gauss]}


MT_WORDS = 624  # a Mersenne Twister's state: 624 32-bit words and a position in [0, 624]


def _is_count(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def random_states_problem(extra: dict, tensors: dict[str, torch.Tensor]) -> Optional[str]:
    """What is out of range in an RNG file's NumPy and Python states, in words, or None (NumPy would misread them
    silently)."""
    numpy_state, python_state = extra.get("numpy"), extra.get("python")
    if not isinstance(numpy_state, list) or len(numpy_state) != 4:
        return f"'numpy' must be [kind, position, has_gauss, cached_gaussian], got {numpy_state!r:.80}"
    kind, position, has_gauss, cached = numpy_state
    if kind != "MT19937":
        return f"NumPy's generator kind must be 'MT19937', got {kind!r:.40}"
    if not _is_count(position, 0, MT_WORDS):
        return f"NumPy's position must be an integer in [0, {MT_WORDS}], got {position!r:.40}"
    if not _is_count(has_gauss, 0, 1):
        return f"NumPy's has_gauss must be 0 or 1, got {has_gauss!r:.40}"
    if not isinstance(cached, (int, float)) or isinstance(cached, bool) or not math.isfinite(cached):
        return f"NumPy's cached Gaussian must be a finite number, got {cached!r:.40}"
    keys = tensors.get("numpy_keys")
    if keys is None or keys.shape != (MT_WORDS,) or bool(((keys < 0) | (keys >= 2**32)).any()):
        return f"numpy_keys must be {MT_WORDS} words of 32 bits"
    if not isinstance(python_state, list) or len(python_state) != 3:
        return f"'python' must be [version, state, gauss], got {python_state!r:.80}"
    version, words, gauss = python_state
    if version != 3 or not isinstance(words, list) or len(words) != MT_WORDS + 1:
        return f"Python's state must be version 3 with {MT_WORDS + 1} numbers"
    if not all(_is_count(word, 0, 2**32 - 1) for word in words[:-1]) or not _is_count(words[-1], 0, MT_WORDS):
        return f"Python's state must be {MT_WORDS} words of 32 bits and a position in [0, {MT_WORDS}]"
    if gauss is not None and (not isinstance(gauss, (int, float)) or isinstance(gauss, bool)
                              or not math.isfinite(gauss)):
        return f"Python's cached Gaussian must be a finite number or null, got {gauss!r:.40}"
    return None


def restore_random_states(iteration_dir: Path, metadata: dict, rng: Optional[TensorParallelRNG], state: ParallelState,
                          log=print) -> None:
    """This rank's RNG states, where the layout allows."""
    saved_tp = metadata["tensor_parallel_size"]
    stages = metadata.get("pipeline_stages")
    saved_pp = len(stages) if stages else 1
    for flag, saved, run, ranks in (("--tensor-model-parallel-size", saved_tp, state.tensor_parallel_size,
                                     "tensor-parallel ranks"),
                                    ("--pipeline-model-parallel-size", saved_pp, state.pipeline_parallel_size,
                                     "pipeline stages")):
        if saved != run:
            if state.is_first_rank:
                log(f" note: {iteration_dir} was saved at {flag} {saved}, this run has {run}: its random states "
                    f"belong to other {ranks} and are not restored; the random streams start from --seed (+ 100 x "
                    f"the pipeline rank), as Megatron-LM ignores them at a (TP, PP) mismatch", flush=True)
            return
    entries = metadata.get("rng_files", [])
    if stages:
        entries = [entry for entry in entries if entry[2] in set(stages[state.pipeline_parallel_rank]["files"])]
    files = {(tp, dp): name for tp, dp, name in entries}
    tp, dp = state.tensor_parallel_rank, state.data_parallel_rank
    name = files.get((tp, dp)) or files.get((tp, 0))
    if name is None:
        if state.is_first_rank:
            log(f" note: {iteration_dir} has no RNG states for TP rank {tp} (a resharded checkpoint?); "
                "the random streams start from --seed", flush=True)
        return
    with open_tensors(iteration_dir, name, metadata) as reader:
        tensors = {key: reader.tensor(key) for key in reader.keys()}
        extra = reader.metadata()
    problem = random_states_problem(extra, tensors)
    if problem:
        raise CheckpointError(f"{iteration_dir / name}: corrupt random states ({problem})")
    try:
        kind, position, has_gauss, cached_gaussian = extra["numpy"]
        np.random.set_state((kind, tensors["numpy_keys"].numpy().astype(np.uint32), position, has_gauss,
                             cached_gaussian))
        version, python_state, gauss = extra["python"]
        random.setstate((version, tuple(python_state), gauss))
    except (KeyError, TypeError, ValueError, OverflowError) as error:
        raise CheckpointError(f"{iteration_dir / name}: corrupt random states ({error})") from None
    if rng is None or "torch_tensor_parallel_cpu" not in tensors:
        torch.set_rng_state(tensors["torch_default_cpu"])
        if rng is not None and state.is_first_rank:
            log(f" note: {iteration_dir} has no tensor-parallel RNG stream (saved without one); "
                "it starts from --seed", flush=True)
        return
    states = {key: tensors.get(f"torch_{key}") for key in
              ("default_cpu", "default_cuda", "tensor_parallel_cpu", "tensor_parallel_cuda")}
    try:
        rng.set_states(states)
    except ValueError as error:  # e.g. saved on CPU, resumed on CUDA
        if state.is_first_rank:
            log(f" note: RNG states not restored ({error}); the random streams start from --seed", flush=True)
