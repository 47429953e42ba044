"""parallel/graph_capture.py through the CPU stand-in (parallel/graph_backends.py RerunBackend): what a captured region
must do whatever records its kernels. On toy blocks: a replayed iteration gives the eager gradients bit for bit and hands
them to the parameters' gradient hooks outside the graph (zero/grad_reducer.py's kind); the static buffers are the same
tensors replay after replay; a replay counts the bytes its capture counted, and the warm-up and capture count none of
the iteration's; forward pre-hooks marked to run before a replay do, others are refused; replays out of capture order
and calls outside training fall back or fail as said. The GPT blocks and their losses: tests/training/test_cuda_graphs.py.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from base.graph_replay_hooks import runs_before_graph_replay
from parallel.comm import Communicator, DryRunCommunicator, VirtualGroup
from parallel.graph_backends import RerunBackend
from parallel.graph_capture import GraphedRegion, GraphSet


class Block(nn.Module):
    """A residual block whose forward and backward each all-reduce over a (virtual) group of two, as a TP block's do."""

    def __init__(self, comm: Communicator) -> None:
        super().__init__()
        self.norm, self.up, self.down = nn.LayerNorm(8), nn.Linear(8, 16), nn.Linear(16, 8)
        self.comm = comm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.down(torch.relu(self.up(_ReducedInBackward.apply(self.norm(hidden), self.comm))))


class _ReducedInBackward(torch.autograd.Function):
    """All-reduce over a virtual group of two where the communicator is a dry run's (it counts the bytes and moves
    nothing); over no group (nothing) for a live one."""

    @staticmethod
    def forward(ctx, tensor, comm):
        ctx.comm = comm
        comm.all_reduce(tensor, _group(comm), "tp")
        return tensor.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.comm.all_reduce(grad, _group(ctx.comm), "tp")
        return grad, None


def _group(comm: Communicator):
    return VirtualGroup(2) if isinstance(comm, DryRunCommunicator) else None


def blocks(comm: Communicator, count: int = 3) -> list[Block]:
    torch.manual_seed(0)
    return [Block(comm) for _ in range(count)]


def graphed(model: list[Block], comm: Communicator, backend=None) -> tuple[list[GraphedRegion], GraphSet]:
    regions = [GraphedRegion(f"block {index}", block, block, [block]) for index, block in enumerate(model)]
    return regions, GraphSet(regions, backend or RerunBackend(), comm, torch.device("cpu"))


def train_step(layers, inputs: torch.Tensor, embedding: nn.Parameter) -> torch.Tensor:
    hidden = inputs * embedding
    for layer in layers:
        hidden = layer(hidden)
    loss = hidden.square().mean()
    loss.backward()
    return loss.detach()


def gradients(model) -> list[torch.Tensor]:
    return [param.grad.clone() for block in model for param in block.parameters()]


def test_a_replayed_step_gives_the_eager_gradients_through_the_gradient_hooks():
    comm = Communicator()
    eager, captured = blocks(comm), blocks(comm)
    regions, graphs = graphed(captured, comm)
    hooked = []
    for block in captured:
        for param in block.parameters():
            param.register_post_accumulate_grad_hook(lambda param: hooked.append(id(param)))
    embedding = nn.Parameter(torch.randn(4, 8))
    for step in range(4):
        if step == 1:
            graphs.request_capture(warmup_passes=2)
        inputs = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        hooked.clear()
        for model in (eager, captured):
            for block in model:
                block.zero_grad()
        embedding.grad = None
        loss = train_step(regions, inputs, embedding)
        embedding_grad = embedding.grad.clone()
        embedding.grad = None
        assert torch.equal(loss, train_step(eager, inputs, embedding))
        assert torch.equal(embedding_grad, embedding.grad)  # the input gradient flows out of the graph
        assert all(torch.equal(a, b) for a, b in zip(gradients(captured), gradients(eager))), step
        # every parameter's gradient reached it through autograd's accumulation, hooks and all, once
        assert sorted(hooked) == sorted(id(param) for block in captured for param in block.parameters()), step
    assert graphs.captured and all(region.captured for region in regions)


def test_the_static_buffers_are_the_same_tensors_replay_after_replay():
    comm = Communicator()
    regions, graphs = graphed(blocks(comm, 2), comm)
    graphs.request_capture(warmup_passes=1)
    embedding = nn.Parameter(torch.randn(4, 8))
    seen = []
    for step in range(3):
        hidden = torch.randn(4, 8) * embedding
        outputs = []
        for region in regions:
            hidden = region(hidden)
            outputs.append(hidden)
        hidden.sum().backward()
        # what a region returns is its static output's storage, refilled: not a new tensor each micro-batch
        assert [out.data_ptr() for out in outputs] == [region.static_output.data_ptr() for region in regions]
        seen.append([(tuple(t.data_ptr() for t in region.static_inputs), region.static_output.data_ptr(),
                      region.static_grad_output.data_ptr(), tuple(t.data_ptr() for t in region.static_input_grads))
                     for region in regions] + [graphs.arena.flat[torch.float32].data_ptr()])
    assert seen[0] == seen[1] == seen[2]


def test_a_replay_counts_what_its_capture_counted_and_the_capture_counts_apart():
    comm = DryRunCommunicator()
    eager_comm = DryRunCommunicator()
    regions, graphs = graphed(blocks(comm), comm)
    eager = blocks(eager_comm)
    embedding = nn.Parameter(torch.randn(4, 8))
    for step in range(3):
        if step == 1:
            graphs.request_capture(warmup_passes=2)  # its warm-ups and captures all-reduce too
        inputs = torch.randn(4, 8)
        train_step(regions, inputs, embedding)
        train_step(eager, inputs, embedding)
        graphed_bytes, eager_bytes = comm.stats.snapshot_and_reset(), eager_comm.stats.snapshot_and_reset()
        assert graphed_bytes == eager_bytes and graphed_bytes["tp"]["all_reduce"] == 3 * 2 * 4 * 16 * 4 // 2, step
    assert graphs.creation_bytes["tp"]["all_reduce"] > 0  # the creation's traffic, kept apart from the iteration's
    assert regions[0].forward_bytes["tp"]["all_reduce"] == regions[0].backward_bytes["tp"]["all_reduce"] == 4 * 16 * 4 // 2


class Gathered:
    """Stands for ZeRO's parameter storage (zero/param_storage.py): a forward pre-hook that waits for a gather."""

    def __init__(self) -> None:
        self.waits = 0

    @runs_before_graph_replay
    def wait(self, module, args) -> None:
        self.waits += 1


def test_marked_pre_hooks_run_before_each_replay_and_unmarked_ones_are_refused():
    comm = Communicator()
    model = blocks(comm, 1)
    storage = Gathered()
    model[0].up.register_forward_pre_hook(storage.wait)
    regions, graphs = graphed(model, comm)
    graphs.request_capture(warmup_passes=0)
    embedding = nn.Parameter(torch.randn(4, 8))
    train_step(regions, torch.randn(4, 8), embedding)
    storage.waits = 0
    train_step(regions, torch.randn(4, 8), embedding)
    # the stand-in runs the forward again (a wait inside it), and the region calls the hook before it (one more);
    # a CUDA replay runs only the latter
    assert storage.waits == 2

    model = blocks(comm, 1)
    model[0].down.register_forward_pre_hook(lambda module, args: None)
    regions, graphs = graphed(model, comm)
    graphs.request_capture(warmup_passes=0)
    with pytest.raises(RuntimeError, match="forward pre-hook .* that a replay would not run"):
        train_step(regions, torch.randn(4, 8), embedding)


def test_replays_out_of_capture_order_are_refused_and_eval_runs_eagerly():
    comm = Communicator()
    model = blocks(comm, 2)
    regions, graphs = graphed(model, comm)
    graphs.request_capture(warmup_passes=0)
    embedding = nn.Parameter(torch.randn(4, 8))
    train_step(regions, torch.randn(4, 8), embedding)
    with pytest.raises(RuntimeError, match="block 1's forward replayed where block 0's forward was due"):
        regions[1](torch.randn(4, 8))
    for block in model:
        block.eval()
    with torch.no_grad():  # evaluation: the functions themselves, not the training graphs
        out = regions[0](torch.randn(4, 8))
    assert out.data_ptr() != regions[0].static_output.data_ptr()
