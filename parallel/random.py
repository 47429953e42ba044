"""Random-number streams for tensor parallelism: the default generator, shared by the TP group, and a private one per
rank forked inside TP regions (seed + 2718 + TP rank), each stage seeded + 100 x its pipeline rank, as Megatron-LM's
_set_random_seed. Under CUDA graphs the private stream is a registered generator state."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from parallel.state import ParallelState

TENSOR_PARALLEL_SEED_OFFSET = 2718
PIPELINE_SEED_OFFSET = 100
DATA_PARALLEL_SEED_OFFSET = 10  # and + 10 x the DP rank under --data-parallel-random-init
_STATE_KEYS = ("default_cpu", "default_cuda", "tensor_parallel_cpu", "tensor_parallel_cuda")


class TensorParallelRNG:
    """Owns the TP-private RNG state and seeds the shared one; creating it reseeds torch's default generators, so build
    it once, before any randomness that must agree."""

    def __init__(self, seed: int, state: ParallelState, graph_safe: bool = False,
                 data_parallel_random_init: bool = False):
        """`graph_safe`: the private CUDA stream as a state object a CUDA graph can register; nothing changes on a
        CPU."""
        self.device = state.device
        self.on_cuda = state.device.type == "cuda"
        self.graph_safe = graph_safe and self.on_cuda
        self.stage_seed = seed + PIPELINE_SEED_OFFSET * state.pipeline_parallel_rank \
            + (DATA_PARALLEL_SEED_OFFSET * state.data_parallel_rank if data_parallel_random_init else 0)
        self.tensor_parallel_seed = self.stage_seed + TENSOR_PARALLEL_SEED_OFFSET + state.tensor_parallel_rank
        self._forked = False
        # seed the real generators to draw the private states, then set the shared seed last
        torch.manual_seed(self.tensor_parallel_seed)
        self._tp_cpu = torch.get_rng_state()
        self._tp_cuda = None
        if self.graph_safe:  # Megatron-Core's tracker.add(graph_safe=True)
            self._tp_cuda = self._cuda_generator().clone_state()
        elif self.on_cuda:
            self._tp_cuda = torch.cuda.get_rng_state(self.device)
        torch.manual_seed(self.stage_seed)

    def _cuda_generator(self) -> torch.Generator:
        """The default CUDA generator of this state's device."""
        torch.cuda.init()  # default_generators is empty until CUDA is initialised
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]

    def graph_generators(self) -> list[torch.Generator]:
        """The CUDA generator states a graph capturing a fork must register (graph_safe only)."""
        return [self._cuda_generator(), self._tp_cuda] if self.graph_safe else []

    @contextlib.contextmanager
    def fork(self) -> Iterator[None]:
        """Run the body on this rank's private stream; the default stream resumes where it was."""
        if self._forked:
            raise RuntimeError("TensorParallelRNG.fork() is already active; forks do not nest")
        self._forked = True
        default_cpu = torch.get_rng_state()
        torch.set_rng_state(self._tp_cpu)
        if self.graph_safe:
            generator = self._cuda_generator()
            default_cuda = generator.graphsafe_get_state()
            generator.graphsafe_set_state(self._tp_cuda)
        elif self.on_cuda:
            default_cuda = torch.cuda.get_rng_state(self.device)
            torch.cuda.set_rng_state(self._tp_cuda, self.device)
        try:
            yield
        finally:
            self._tp_cpu = torch.get_rng_state()
            torch.set_rng_state(default_cpu)
            if self.graph_safe:
                self._tp_cuda = generator.graphsafe_get_state()
                generator.graphsafe_set_state(default_cuda)
            elif self.on_cuda:
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
            "tensor_parallel_cuda": self._private_cuda_state() if on_cuda else None,
        }

    def _private_cuda_state(self) -> torch.Tensor:
        return self._tp_cuda.get_state() if self.graph_safe else self._tp_cuda.clone()

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
            if self.graph_safe:  # into the same state object, which captured graphs have registered
                self._tp_cuda.set_state(states["tensor_parallel_cuda"])
            else:
                self._tp_cuda = states["tensor_parallel_cuda"].clone()


def dropout_stream(rng: "TensorParallelRNG | None"):
    """The rank's private dropout stream where `rng` is given (a split region), else the shared one."""
    return rng.fork() if rng is not None else contextlib.nullcontext()
