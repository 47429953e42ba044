"""Regions of a model captured as graphs with their backward and replayed every micro-batch after, as Megatron-Core's
local CUDA graphs and make_graphed_callables do, for this repository's communicator and ZeRO. What a replay skips is
accounted for: byte counts, forward pre-hooks, and parameter gradients, handed out from one shared arena."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from base.graph_replay_hooks import hook_runs_before_graph_replay
from parallel.comm import Communicator
from parallel.graph_backends import GraphBackend


def connected_parameters(output: torch.Tensor, module: nn.Module) -> tuple[nn.Parameter, ...]:
    """`module`'s parameters that `output` depends on through autograd, in the module's order (Megatron's
    get_connected_params)."""
    found, seen, stack = set(), set(), [output.grad_fn] if output.grad_fn is not None else []
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node holds its leaf
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_node for next_node, _ in node.next_functions if next_node is not None)
    return tuple(param for param in module.parameters() if id(param) in found)


class GradientArena:
    """One flat buffer per dtype, as large as the largest region's parameters of that dtype: where every backward graph
    writes its parameter gradients."""

    def __init__(self, regions_parameters: Sequence[Sequence[nn.Parameter]], device: torch.device) -> None:
        self.flat = {dtype: torch.empty(numel, dtype=dtype, device=device)
                     for dtype, numel in self.sizes(regions_parameters).items()}

    @staticmethod
    def sizes(regions_parameters: Sequence[Sequence[nn.Parameter]]) -> dict[torch.dtype, int]:
        """Elements per dtype of an arena for regions holding these parameters."""
        sizes: dict[torch.dtype, int] = {}
        for parameters in regions_parameters:
            for dtype, numel in _numel_by_dtype(parameters).items():
                sizes[dtype] = max(sizes.get(dtype, 0), numel)
        return sizes

    def views(self, parameters: Sequence[nn.Parameter]) -> list[torch.Tensor]:
        offsets: dict[torch.dtype, int] = {}
        views = []
        for param in parameters:
            start = offsets.get(param.dtype, 0)
            views.append(self.flat[param.dtype][start:start + param.numel()].view(param.shape))
            offsets[param.dtype] = start + param.numel()
        return views

    def handed_out(self, parameters: Sequence[nn.Parameter]) -> list[torch.Tensor]:
        """The gradients now in the arena for `parameters`, copied out: one copy per dtype, viewed per parameter."""
        copies = {dtype: self.flat[dtype][:numel].clone() for dtype, numel in _numel_by_dtype(parameters).items()}
        offsets: dict[torch.dtype, int] = {}
        grads = []
        for param in parameters:
            start = offsets.get(param.dtype, 0)
            grads.append(copies[param.dtype][start:start + param.numel()].view(param.shape))
            offsets[param.dtype] = start + param.numel()
        return grads

    def nbytes(self) -> int:
        return sum(flat.numel() * flat.element_size() for flat in self.flat.values())


def _numel_by_dtype(parameters: Sequence[nn.Parameter]) -> dict[torch.dtype, int]:
    sizes: dict[torch.dtype, int] = {}
    for param in parameters:
        sizes[param.dtype] = sizes.get(param.dtype, 0) + param.numel()
    return sizes


class GraphedRegion:
    """A region of the model: `fn(*inputs) -> tensor`, the modules whose forward it runs (their hooks checked) and
    `module`, whose training flag says whether the captured graph applies."""

    def __init__(self, name: str, fn: Callable[..., torch.Tensor], module: nn.Module,
                 modules: Sequence[nn.Module], reads_mask: bool = True) -> None:
        """`reads_mask`: whether `fn` takes the micro-batch's attention mask after the hidden states."""
        self.name = name
        self.fn = fn
        self.module = module
        self.modules = tuple(modules)
        self.reads_mask = reads_mask
        self.graphs: Optional["GraphSet"] = None
        self.index = 0
        self.captured = False

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        replayable = self.module.training and torch.is_grad_enabled()
        if replayable and self.graphs.capture_pending:
            self.graphs.capture(self, inputs)
        if not (replayable and self.captured):
            return self.fn(*inputs)
        return _ReplayedRegion.apply(self, len(inputs), *inputs, *self.params)

    # ---- capture (GraphSet.capture calls these in order) ----

    def hooks_before_replay(self) -> list[Callable[[], None]]:
        """The forward pre-hooks of the region's modules, as calls to make before a replay; refuses unmarked ones."""
        calls = []
        for owner in self.modules:
            for module in owner.modules():
                for hook in module._forward_pre_hooks.values():
                    if not hook_runs_before_graph_replay(hook):
                        raise RuntimeError(f"CUDA graphs: {type(module).__name__} in {self.name} has a forward "
                                           f"pre-hook ({hook!r}) that a replay would not run; mark it "
                                           f"@runs_before_graph_replay if it must run before each replay")
                    calls.append(lambda hook=hook, module=module: hook(module, ()))
                if module._forward_hooks or module._backward_hooks:
                    raise RuntimeError(f"CUDA graphs: {type(module).__name__} in {self.name} has a forward or "
                                       f"backward hook that a replay would not run")
        return calls

    def allocate(self, template: Sequence[torch.Tensor], comm: Communicator, backend: GraphBackend) -> None:
        """Static input buffers holding copies of `template` (leaves), and what the captures need."""
        self.comm, self.backend = comm, backend
        self.static_inputs = _leaf_copies(template)
        self.replay_hooks = self.hooks_before_replay()

    def warm_up(self, passes: int) -> None:
        """`passes` forwards on copies of the static inputs, each differentiated with `autograd.grad`, so no gradient
        hook fires."""
        for _ in range(passes):
            inputs = _leaf_copies(self.static_inputs)
            output = self.fn(*inputs)
            surface = [tensor for tensor in inputs if tensor.requires_grad] + \
                list(connected_parameters(output, self.module))
            torch.autograd.grad((output,), surface, (torch.zeros_like(output),), allow_unused=True)

    def capture_forward(self) -> None:
        def forward() -> tuple[torch.Tensor, ...]:
            # the captured output on CUDA, each replay's own with the stand-in
            self.graph_output = self.fn(*self.static_inputs)
            return (self.graph_output,)

        with self.comm.counted_apart() as sent:
            self.forward_graph, (self.static_output,) = self.backend.capture(forward)
        self.forward_bytes = sent.snapshot()
        self.params = connected_parameters(self.graph_output, self.module)

    def capture_backward(self, arena: GradientArena) -> None:
        self.arena = arena
        self.static_grad_output = torch.zeros_like(self.static_output)
        differentiated = [tensor for tensor in self.static_inputs if tensor.requires_grad]
        arena_views = arena.views(self.params)

        def backward() -> tuple[torch.Tensor, ...]:
            grads = torch.autograd.grad((self.graph_output,), differentiated + list(self.params),
                                        (self.static_grad_output,), allow_unused=True)
            for place, grad in zip(arena_views, grads[len(differentiated):]):
                place.copy_(grad)
            return grads[:len(differentiated)]

        with self.comm.counted_apart() as sent:
            self.backward_graph, self.static_input_grads = self.backend.capture(backward)
        self.backward_bytes = sent.snapshot()
        self.captured = True

    # ---- replay (_ReplayedRegion calls these) ----

    def replay_forward(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        self.graphs.replaying(self, backward=False)
        for static, given in zip(self.static_inputs, inputs):
            if static.shape != given.shape or static.dtype != given.dtype:
                raise RuntimeError(f"CUDA graphs: {self.name} was captured for inputs {tuple(static.shape)} "
                                   f"{static.dtype}, called with {tuple(given.shape)} {given.dtype}")
            if static.data_ptr() != given.data_ptr():
                static.copy_(given)
        for call in self.replay_hooks:
            call()
        with self.comm.counted_apart():  # the stand-in runs the region's Python again: counted once, below
            self.backend.replay(self.forward_graph)
        self.comm.stats.add_counts(self.forward_bytes)
        return self.static_output.detach()

    def replay_backward(self, grad_output: torch.Tensor) -> tuple[list, list]:
        self.graphs.replaying(self, backward=True)
        if self.static_grad_output.data_ptr() != grad_output.data_ptr():
            self.static_grad_output.copy_(grad_output)
        with self.comm.counted_apart():
            self.backend.replay(self.backward_graph)
        self.comm.stats.add_counts(self.backward_bytes)
        grads = iter(self.static_input_grads)
        input_grads = [next(grads).detach() if static.requires_grad else None for static in self.static_inputs]
        return input_grads, self.arena.handed_out(self.params)


def _leaf_copies(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return tuple(tensor.detach().clone().requires_grad_(tensor.requires_grad) for tensor in tensors)


class _ReplayedRegion(torch.autograd.Function):
    """A captured region in autograd: its inputs and parameters in, its static output out."""

    @staticmethod
    def forward(ctx, region: GraphedRegion, input_count: int, *inputs_and_params: torch.Tensor) -> torch.Tensor:
        ctx.region = region
        return region.replay_forward(inputs_and_params[:input_count])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output: torch.Tensor):
        input_grads, parameter_grads = ctx.region.replay_backward(grad_output)
        return (None, None, *input_grads, *parameter_grads)


class GraphSet:
    """The graphed regions of one model in a micro-batch's forward order, with their backend, communicator and warm-up
    passes. After `request_capture()` the first training-mode call captures them all; replays must then come in capture
    order."""

    def __init__(self, regions: Sequence[GraphedRegion], backend: GraphBackend, comm: Communicator,
                 device: torch.device) -> None:
        self.regions = list(regions)
        for index, region in enumerate(self.regions):
            region.graphs, region.index = self, index
        self.backend, self.comm, self.device = backend, comm, device
        self.capture_pending = False
        self.warmup_passes = 0
        self.arena: Optional[GradientArena] = None
        self.creation_bytes: dict[str, dict[str, int]] = {}
        self._position = 0  # forwards 0..n-1, then backwards n-1..0

    @property
    def captured(self) -> bool:
        return self.arena is not None

    def request_capture(self, warmup_passes: int) -> None:
        """Capture every region at the next training-mode call, after `warmup_passes` warm-up passes each."""
        if not self.captured:
            self.capture_pending, self.warmup_passes = True, warmup_passes

    def capture(self, caller: GraphedRegion, inputs: Sequence[torch.Tensor]) -> None:
        """Capture every region, shaping their static inputs like `inputs`."""
        if caller.index != 0:
            raise RuntimeError(f"CUDA graphs: the capture starts at the first region of a micro-batch's forward, not "
                               f"at {caller.name}")
        self.capture_pending = False
        with self.comm.counted_apart() as creation:
            for region in self.regions:
                region.allocate(inputs if region.reads_mask else inputs[:1], self.comm, self.backend)
                for call in region.replay_hooks:  # pending gathers finish before any capture
                    call()
            with self.backend.side_stream():
                for region in self.regions:
                    region.warm_up(self.warmup_passes)
            for region in self.regions:
                region.capture_forward()
            self.arena = GradientArena([region.params for region in self.regions], self.device)
            for region in reversed(self.regions):
                region.capture_backward(self.arena)
        self.creation_bytes = creation.snapshot()

    def replaying(self, region: GraphedRegion, backward: bool) -> None:
        """Check that `region`'s forward (or backward) replay comes where the capture order puts it."""
        count = len(self.regions)
        expected = self._position if self._position < count else 2 * count - 1 - self._position
        is_backward = self._position >= count
        if region.index != expected or backward != is_backward:
            step = "backward" if is_backward else "forward"
            raise RuntimeError(f"CUDA graphs: {region.name}'s {'backward' if backward else 'forward'} replayed where "
                               f"{self.regions[expected].name}'s {step} was due; the graphs share one memory pool and "
                               f"replay only in the order they were captured (one micro-batch at a time, forward then "
                               f"backward)")
        self._position = (self._position + 1) % (2 * count)
