"""How a captured graph of a model region is recorded and replayed: on CUDA torch.cuda.CUDAGraph, every graph in one
pool on one capture stream with the RNG states registered (as Megatron-Core's CudaGraphManager); on a CPU a stand-in
that reruns the callable into the captured outputs, for tests only."""

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
        # torch.cuda.graph: a pool shared with an earlier capture on an explicit stream needs the same stream
        self.stream = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def side_stream(self) -> Iterator[None]:
        # warm-up on a side stream, so lazy initialisations (cuBLAS workspaces) happen outside a capture
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
    fn: Callable[[], Outputs]
    outputs: Outputs


class RerunBackend:
    """The CPU stand-in. A replay runs the callable with autograd on, whatever the caller's grad mode: its backward
    counterpart differentiates what the forward built, as a CUDA graph's backward reads what its forward wrote."""

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
