"""Random-number streams for tensor parallelism: one shared by the TP group, one private to each rank.

Dropout must agree across TP ranks wherever they hold the same activation (the residual stream, after
a row-parallel reduce): there the default generator is used, seeded with the run's seed on every rank.
Inside a TP region each rank holds a different slice (its own attention heads), and identical masks on
different slices would correlate them; there code runs under `tracker.fork()`, which swaps in a
generator seeded with `seed + 2718 + tensor_parallel_rank` (Megatron's offset).
Under sequence parallelism the residual stream is split along the sequence too, so its dropout (and
the embedding's) runs under `fork()` as well (gpt/model.py), as Megatron-Core's TransformerBlock and
LanguageModelEmbedding fork the tracker when sequence_parallel is set.

The data-parallel rank is deliberately not part of either seed: DP ranks see different samples, so
shared masks do not correlate anything, and keeping DP out means a run's dropout does not change
when the same TP group is replicated more or fewer times.

The tracker swaps the CPU generator and, on CUDA, the generator of the state's device (dropout on a
GPU draws from the CUDA generator; CPU-side draws from the CPU one). `get_states()`/`set_states()`
capture all four states, for checkpoints and for replaying a forward pass in activation recompute.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from parallel.state import ParallelState

TENSOR_PARALLEL_SEED_OFFSET = 2718
_STATE_KEYS = ("default_cpu", "default_cuda", "tensor_parallel_cpu", "tensor_parallel_cuda")


class TensorParallelRNG:
    """Owns the TP-private RNG state and seeds the shared (default) one.

    Creating it reseeds torch's default generators (CPU, and CUDA when the state's device is a GPU)
    with `seed`: build it once, at the start of a run, before any randomness that must agree.
    """

    def __init__(self, seed: int, state: ParallelState):
        self.device = state.device
        self.on_cuda = state.device.type == "cuda"
        self.tensor_parallel_seed = seed + TENSOR_PARALLEL_SEED_OFFSET + state.tensor_parallel_rank
        self._forked = False
        # Draw the private states by seeding the real generators, then set the shared seed last.
        torch.manual_seed(self.tensor_parallel_seed)
        self._tp_cpu = torch.get_rng_state()
        self._tp_cuda = torch.cuda.get_rng_state(self.device) if self.on_cuda else None
        torch.manual_seed(seed)

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        """Run the body on this rank's private stream; the default stream resumes where it was."""
        if self._forked:
            raise RuntimeError("TensorParallelRNG.fork() is already active; forks do not nest")
        self._forked = True
        default_cpu = torch.get_rng_state()
        torch.set_rng_state(self._tp_cpu)
        if self.on_cuda:
            default_cuda = torch.cuda.get_rng_state(self.device)
            torch.cuda.set_rng_state(self._tp_cuda, self.device)
        try:
            yield
        finally:
            self._tp_cpu = torch.get_rng_state()
            torch.set_rng_state(default_cpu)
            if self.on_cuda:
                self._tp_cuda = torch.cuda.get_rng_state(self.device)
                torch.cuda.set_rng_state(default_cuda, self.device)
            self._forked = False

    def get_states(self) -> dict[str, torch.Tensor | None]:
        """Copies of the default and private generator states (CUDA entries None on CPU)."""
        if self._forked:
            raise RuntimeError("get_states() inside fork() would mix up the two streams; call it outside")
        on_cuda = self.on_cuda
        return {
            "default_cpu": torch.get_rng_state(),
            "default_cuda": torch.cuda.get_rng_state(self.device) if on_cuda else None,
            "tensor_parallel_cpu": self._tp_cpu.clone(),
            "tensor_parallel_cuda": self._tp_cuda.clone() if on_cuda else None,
        }

    def set_states(self, states: dict[str, torch.Tensor | None]) -> None:
        if self._forked:
            raise RuntimeError("set_states() inside fork() would mix up the two streams; call it outside")
        missing = [key for key in _STATE_KEYS if key not in states]
        if missing:
            raise ValueError(f"RNG states lack {', '.join(missing)}")
        if self.on_cuda and (states["default_cuda"] is None or states["tensor_parallel_cuda"] is None):
            raise ValueError("RNG states were saved on CPU; a CUDA run needs the CUDA generator states")
        torch.set_rng_state(states["default_cpu"])
        self._tp_cpu = states["tensor_parallel_cpu"].clone()
        if self.on_cuda:
            torch.cuda.set_rng_state(states["default_cuda"], self.device)
            self._tp_cuda = states["tensor_parallel_cuda"].clone()
