"""CUDA graphs of the transformer blocks under Megatron-LM's flags: what a run captures (each dense block whole, or its
attention or MLP half, as Megatron-Core's per-layer graphs), when (iteration 2 for local, after the warm-up steps for
transformer_engine), and the lines that say so. What cannot be captured runs eagerly and is named."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
from torch import nn

from arguments.cuda_graphs import PER_LAYER_IMPLS, normalize_modules
from data.documents import DocumentMasks
from gpt.model import GPTModel, TransformerBlock
from gpt.moe.layer import MoELayer
from parallel.graph_backends import GraphBackend
from parallel.graph_capture import GradientArena, GraphedRegion, GraphSet
from parallel.state import ParallelState
from zero.gated_parameters import wait_at_region_entry
from zero.memory import format_bytes

# Why a run captures nothing: (applies to the config, the reason).
NO_WHOLE_ITERATION = ("--cuda-graph-impl full_iteration: a graph of the whole forward-backward is not built here (use "
                      "--cuda-graph-impl local for per-layer graphs)")
NOT_CAPTURED: tuple[tuple[Callable, str], ...] = (
    (lambda config: config.parallel.pipeline_model_parallel_size > 1,
     "pipeline stages: Megatron captures a graph per micro-batch a schedule keeps in flight, which is not built here"),
    (lambda config: config.zero.stage == 3,
     "ZeRO-3 gathers each block's parameters into buffers it frees between uses, by hooks a replay would not run"),
    (lambda config: config.model.fp8.enabled,
     "--fp8-format: the FP8 casts' scaling state and --fp8-guard's counts are not yet free of host synchronisation "
     "(issue 76 item 1), which a capture cannot hold"),
    (lambda config: config.training.compile,
     "--compile: compiled blocks are not captured here (torch.compile's own CUDA graphs are its mode "
     "'reduce-overhead'); use one or the other"),
    (lambda config: config.parallel.context_parallel_size > 1,
     "context parallelism: its attention's point-to-point ring is not captured here"),
    # a copy from pageable host memory synchronises
    (lambda config: config.model.positions.position_embedding_type == "longrope",
     "--position-embedding-type longrope: its factors are copied from the host every forward"),
)


@dataclass(frozen=True)
class CudaGraphPlan:
    """What a run does with its CUDA graph settings on its device, decided once."""
    impl: str
    modules: tuple[str, ...]
    warmup_steps: int
    why_not: tuple[str, ...] = ()   # why this run captures nothing (empty: it captures)
    eager: tuple[str, ...] = ()     # what Megatron would also capture and runs eagerly here

    @property
    def captures(self) -> bool:
        return self.impl in PER_LAYER_IMPLS and not self.why_not

    @property
    def whole_blocks(self) -> bool:
        return not self.modules

    @property
    def capture_iteration(self) -> int:
        """The iteration of this run (counted from 1) whose first forward captures."""
        return 2 if self.impl == "local" else self.warmup_steps + 1

    def warmup_passes(self, micro_batches: int) -> int:
        """Warm-up passes of each graph before its capture (transformer_engine's as TECudaGraphHelper asks them)."""
        if self.impl == "local":
            return self.warmup_steps
        return micro_batches * max(1, math.ceil((10 - self.warmup_steps * micro_batches) / micro_batches))

    def line(self, regions: int = 0) -> str:
        flags = f"--cuda-graph-impl {self.impl}" + (f" --cuda-graph-modules {' '.join(self.modules)}"
                                                    if self.modules else "")
        if not self.captures:
            return f"> {flags}: nothing captured, the blocks run eagerly (the same math): {'; '.join(self.why_not)}"
        what = "each dense transformer block whole" if self.whole_blocks else " and ".join(
            part for part, module in (("each transformer block's attention half", "attn"),
                                      ("each dense block's MLP half", "mlp")) if module in self.modules)
        when = (f"after iteration 1, with --cuda-graph-warmup-steps {self.warmup_steps} warm-up passes each "
                f"(Megatron-Core's local implementation)" if self.impl == "local" else
                f"after {self.warmup_steps} eager iterations (Transformer Engine's schedule; its make_graphed_callables "
                f"is not here: this program's graphs stand in)")
        eager = "".join(f"; {part}" for part in self.eager)
        return (f"> CUDA graphs ({flags}): {what}, forward and backward ({regions} graph pairs), captured {when}, "
                f"replayed every micro-batch after; the embedding, the loss, the MTP layers and the optimizer step run "
                f"eagerly{eager}")


def cuda_graph_plan(config, device_type: str, stand_in: bool = False) -> Optional[CudaGraphPlan]:
    """The run's plan, or None without --cuda-graph-impl."""
    training = config.training
    if training.cuda_graph_impl == "none":
        return None
    # again for a config built in code
    normalized = normalize_modules(training.cuda_graph_modules, training.cuda_graph_impl)
    modules = normalized.modules
    why_not = [reason for applies, reason in NOT_CAPTURED if applies(config)]
    if normalized.impl == "full_iteration":
        why_not.insert(0, NO_WHOLE_ITERATION)
    if device_type != "cuda" and not stand_in:
        why_not.insert(0, f"the device is {device_type}, and a CUDA graph records CUDA kernels (Megatron-LM runs on "
                          f"CUDA only)")
    eager = []
    if config.model.moe is not None and not modules:
        eager.append("the MoE blocks run eagerly: their dropless routing reads split sizes on the host and their "
                     "balancing losses are kept in Python (Megatron captures an MoE layer whole only with drop-and-pad, "
                     "and its router with --cuda-graph-modules moe_router)")
    not_built = [module for module in ("moe", "moe_router", "moe_preprocess") if module in modules]
    if not_built:
        eager.append(f"--cuda-graph-modules {' '.join(not_built)}: not captured here (the MoE layer's graphs are not "
                     f"built; its MLP half runs eagerly)")
    if "mamba" in modules:
        eager.append("--cuda-graph-modules mamba: no effect (no Mamba layers here)")
    return CudaGraphPlan(normalized.impl, modules, training.cuda_graph_warmup_steps, tuple(why_not), tuple(eager))


@dataclass(frozen=True)
class RegionSpec:
    """One captured region (a block, or its attention or MLP half) and the modules it runs."""
    name: str
    block: TransformerBlock
    kind: str
    modules: tuple[nn.Module, ...]

    @property
    def reads_mask(self) -> bool:
        return self.kind != "mlp"

    def parameters(self) -> list[nn.Parameter]:
        return [param for module in self.modules for param in module.parameters()]


def graph_regions(model: GPTModel, plan: CudaGraphPlan) -> list[RegionSpec]:
    """The regions `plan` captures in `model`, in forward order."""
    regions = []
    for name, block in model.blocks.named_children():
        dense = not isinstance(block.mlp, MoELayer)
        halves = {"attention": (block.input_layernorm, block.attention, block.attention_output_layernorm),
                  "mlp": (block.post_attention_layernorm, block.mlp, block.mlp_output_layernorm)}
        if plan.whole_blocks:
            if dense:
                regions.append(RegionSpec(f"blocks.{name}", block, "block", (block,)))
            continue
        for kind, module in (("attention", "attn"), ("mlp", "mlp")):
            if module in plan.modules and (kind == "attention" or dense):
                parts = tuple(part for part in (*halves[kind], block.hidden_dropout) if part is not None)
                regions.append(RegionSpec(f"blocks.{name} {kind} half", block, kind, parts))
    return regions


def static_buffer_bytes(model: GPTModel, plan: CudaGraphPlan, hidden_bytes: int) -> int:
    """What the regions hold outside their graphs' pool: static buffers and the gradient arena."""
    regions = graph_regions(model, plan)
    arena = GradientArena.sizes([region.parameters() for region in regions])
    element = {param.dtype: param.element_size() for region in regions for param in region.parameters()}
    return 2 * len(regions) * hidden_bytes + sum(numel * element[dtype] for dtype, numel in arena.items())


def _documents(mask: Optional[torch.Tensor]) -> Optional[DocumentMasks]:
    return None if mask is None else DocumentMasks(attention_mask=mask)


def _region_function(spec: RegionSpec) -> Callable[..., torch.Tensor]:
    block = spec.block
    if spec.kind == "block":
        return lambda hidden, mask=None: block(hidden, _documents(mask))
    if spec.kind == "attention":
        return lambda hidden, mask=None: block.attention_half(hidden, _documents(mask))
    return block.mlp_half


class CudaGraphs:
    """A run's CUDA graphs: its plan and the graphed regions behind `run_blocks`."""

    def __init__(self, plan: CudaGraphPlan, graph_set: Optional[GraphSet] = None,
                 regions: Optional[dict[int, dict[str, GraphedRegion]]] = None) -> None:
        self.plan = plan
        self.graph_set = graph_set
        self.regions = regions or {}
        self.iterations = 0
        self._capture_started: Optional[tuple[float, Optional[int]]] = None  # (time, device bytes) at the request
        self._reported = False
        self.line = plan.line(len(graph_set.regions) if graph_set is not None else 0)

    def begin_iteration(self, micro_batches: int) -> None:
        """Count an iteration; request the capture at the plan's."""
        self.iterations += 1
        if self.graph_set is not None and self.iterations == self.plan.capture_iteration:
            self._capture_started = (time.perf_counter(), self._device_bytes())
            self.graph_set.request_capture(self.plan.warmup_passes(micro_batches))

    def take_capture_line(self) -> Optional[str]:
        """Once, after the capture: how many graphs, how long, how much memory."""
        graph_set = self.graph_set
        if graph_set is None or not graph_set.captured or self._reported:
            return None
        started, device_bytes = self._capture_started
        held = self._device_bytes() - device_bytes if device_bytes is not None else None
        self._reported = True
        return (f"> captured {len(graph_set.regions)} CUDA graph pairs in iteration {self.iterations} ("
                f"{time.perf_counter() - started:.2f} s with the iteration, {graph_set.warmup_passes} warm-up passes "
                f"each); gradient arena {format_bytes(graph_set.arena.nbytes())}"
                + (f", device memory held since {format_bytes(held)}" if held is not None else ""))

    def _device_bytes(self) -> Optional[int]:
        device = self.graph_set.device
        return torch.cuda.memory_allocated(device) if device.type == "cuda" else None

    def run_blocks(self, blocks: Sequence[TransformerBlock], hidden: torch.Tensor,
                   documents: Optional[DocumentMasks] = None) -> torch.Tensor:
        """gpt/model.py's run_in_order, each captured region through its graph."""
        mask = documents.attention_mask if documents is not None else None
        masked = () if mask is None else (mask,)
        for block in blocks:
            parts = self.regions.get(id(block), {})
            if "block" in parts:
                hidden = parts["block"](hidden, *masked)
            elif parts:
                hidden = parts["attention"](hidden, *masked) if "attention" in parts else \
                    block.attention_half(hidden, documents)
                hidden = parts["mlp"](hidden) if "mlp" in parts else block.mlp_half(hidden)
            else:
                hidden = block(hidden) if documents is None else block(hidden, documents)
        return hidden


def apply_cuda_graphs(model: GPTModel, plan: Optional[CudaGraphPlan], state: ParallelState,
                      backend: Optional[GraphBackend]) -> Optional[CudaGraphs]:
    """Route `model`'s blocks through graphed regions where `plan` captures."""
    if plan is None:
        return None
    if not plan.captures:
        return CudaGraphs(plan)
    by_block: dict[int, dict[str, GraphedRegion]] = {}
    ordered = []
    for spec in graph_regions(model, plan):
        for module in spec.modules:  # --overlap-param-gather: the gathers waited for before each replay
            wait_at_region_entry(module)
        region = GraphedRegion(spec.name, _region_function(spec), spec.block, spec.modules, reads_mask=spec.reads_mask)
        by_block.setdefault(id(spec.block), {})[spec.kind] = region
        ordered.append(region)
    graphs = CudaGraphs(plan, GraphSet(ordered, backend, state.comm, state.device), by_block)
    model.run_blocks = graphs.run_blocks
    return graphs
