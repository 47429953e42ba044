"""How a graph of a model region is captured and replayed: on CUDA, torch.cuda.CUDAGraph; on a CPU, a stand-in that
lets the rest of the machinery (parallel/graph_capture.py) run and be tested without a device.

A backend's `capture(fn)` runs `fn` once while recording and returns (graph, what `fn` returned: a tuple of
tensors); `replay(graph)` does the recorded work again, writing the same output tensors. `side_stream()` is where
the warm-up passes run before a capture.

- `CudaGraphBackend`: every graph in one memory pool (`torch.cuda.graph_pool_handle`), captured on one side stream,
  as torch.cuda.make_graphed_callables shares a pool between the graphs it captures in their replay order and
  Megatron-Core's CudaGraphManager keeps one global mempool (megatron/core/transformer/cuda_graphs.py). Each graph
  registers the generator states the captured code draws from (`register_generator_state`: the device's default
  generator and the tensor-parallel private stream, parallel/random.py), so a replay draws new dropout masks, as
  Megatron's `create_fwd_graph` registers `get_all_rng_states()`.
- `RerunBackend`: the CPU stand-in. Its "capture" runs `fn` and keeps it; its "replay" runs `fn` again and copies
  what it returns into the tensors the capture returned, so whoever holds those sees new values in the same storage,
  as after a CUDA replay. A CPU has nothing to capture: only tests use it (training/cuda_graphs.py runs a CPU
  training's blocks eagerly and says so).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Protocol, Sequence

import torch

Outputs = tuple[torch.Tensor, ...]


class GraphBackend(Protocol):
    def side_stream(self) -> ContextManager[None]:
        """Where warm-up passes run, out of the way of the capture stream's history."""

    def capture(self, fn: Callable[[], Outputs]) -> tuple[object, Outputs]:
        """Run `fn` once, recording its work: (the graph, its outputs)."""

    def replay(self, graph: object) -> None:
        """Do `graph`'s recorded work again, into the outputs its capture returned."""


class CudaGraphBackend:
    """torch.cuda.CUDAGraph capture and replay on `device`, one pool and one capture stream for every graph."""

    def __init__(self, device: torch.device, generators: Sequence[torch.Generator] = ()) -> None:
        self.device = device
        self.generators = list(generators)
        self.pool = torch.cuda.graph_pool_handle()
        # torch.cuda.graph: "if you pass a pool used by a previous capture and the previous capture used an explicit
        # stream argument, you should pass the same stream argument to this capture"
        self.stream = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        # make_graphed_callables warms up on a side stream: lazy initialisations (cuBLAS workspaces, kernel
        # selection) happen there, not inside a capture
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield
        torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def capture(self, fn: Callable[[], Outputs]) -> tuple[object, Outputs]:
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            graph.register_generator_state(generator)
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            outputs = fn()
        return graph, outputs

    def replay(self, graph: object) -> None:
        graph.replay()


@dataclass
class _Rerun:
    """What the stand-in keeps of a "capture": the callable and the outputs it returned then."""
    fn: Callable[[], Outputs]
    outputs: Outputs


class RerunBackend:
    """The CPU stand-in (see the module docstring). A replay runs the callable with autograd on, whatever the caller's
    grad mode (a replay is called from inside an autograd Function, where it is off), because the callable's
    backward counterpart differentiates what the forward built, as the CUDA graph's recorded backward kernels read
    what the recorded forward kernels wrote."""

    def side_stream(self) -> ContextManager[None]:
        return contextlib.nullcontext()

    def capture(self, fn: Callable[[], Outputs]) -> tuple[object, Outputs]:
        outputs = fn()
        return _Rerun(fn, outputs), outputs

    def replay(self, graph: object) -> None:
        with torch.enable_grad():
            fresh = graph.fn()
        with torch.no_grad():
            for kept, new in zip(graph.outputs, fresh):
                if kept is not None and kept.data_ptr() != new.data_ptr():
                    kept.detach().copy_(new)
