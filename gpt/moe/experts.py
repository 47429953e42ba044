"""The experts: one MLP per expert, each under its own name (`experts.<e>.dense_h_to_4h.weight`, or
`dense_h_to_4h_gate` / `dense_h_to_4h_up` with SwiGLU, and `dense_4h_to_h`), as the dense MLP names its
weights, so a checkpoint reshards across expert-parallel sizes by name (Megatron-Core's SequentialMLP names
them `local_experts.<e>.linear_fc1` the same way).

They run as one grouped matmul per projection where torch has one for the tensors at hand
(torch.nn.functional.grouped_mm: on CPU rows whose byte widths are multiples of 16; Megatron-Core's TEGroupedMLP /
--moe-grouped-gemm), else as a loop over the experts (SequentialMLP); tests/gpt/test_moe.py checks that they agree.
On the meta device (the planner's dry run) the choice is the planned device's (`planned_device`, set by
planner/moe_plan.py), so the plan keeps what that path saves for backward. The grouped matmul keeps the rows and
the experts' weights, not a stacked copy of them (`_GroupedMatmulOverStacked`), as Megatron-Core's grouped GEMM.

Expert tensor parallelism (--expert-tensor-parallel-size ETP > 1, Megatron-Core's experts.py: linear_fc1
column-parallel and linear_fc2 row-parallel over the expert tensor-parallel group, with no communication of their
own): each ETP rank holds 1/ETP of every expert's ffn features (the input projections' rows and biases, the output
projection's columns; their sharding records say so) and computes a partial output of the rows the dispatcher gave
every peer alike; the dispatcher's combine sums the partials (gpt/moe/dispatchers.py). The output projection's bias
is whole on every peer, added by the first peer only, its gradient summed over the ETP group."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gpt.glu import SWIGLU, GatedActivation
from gpt.xielu import XIELU, xielu
from parallel.fp8.grouped import fp8_grouped_linear
from parallel.fp8.linear import fp8_linear
from parallel.init import InitMethod, set_init_method
from parallel.mappings import sum_gradient_over
from parallel.sharding import (
    DENSE_DATA,
    EXPERT_DATA,
    EXPERT_TENSOR_PARALLEL,
    TENSOR_PARALLEL,
    set_record,
    split_record,
    whole_record,
)
from parallel.state import ExpertParallel


def _linear_parameters(module: nn.Module, name: str, inputs: int, outputs: int, std: float, bias: bool,
                       split_dim: Optional[int] = None, parts: int = 1, part: int = 0,
                       data: tuple[str, ...] = DENSE_DATA) -> None:
    """`split_dim` 0: the output features split in `parts` (column-parallel, the bias too); 1: the input features
    (row-parallel, the bias whole); this rank holds part `part` (its expert tensor-parallel rank), each slice
    replicated over `data`: the sharding records (parallel/sharding.py) say so."""
    linear = nn.Module()
    shape = [outputs, inputs]
    if split_dim is not None:
        if shape[split_dim] % parts:
            raise ValueError(f"{name}: {shape[split_dim]} features are not divisible by the expert tensor-parallel "
                             f"size {parts}")
        shape[split_dim] //= parts
    linear.weight = nn.Parameter(torch.empty(*shape, device="meta"))
    set_init_method(linear.weight, InitMethod.normal(std))
    whole = (EXPERT_TENSOR_PARALLEL if data == EXPERT_DATA else TENSOR_PARALLEL, *data)
    set_record(linear.weight, split_record(shape, split_dim, parts, part, EXPERT_TENSOR_PARALLEL, data=data)
               if split_dim is not None else whole_record(shape, replicated_over=whole))
    if bias:
        linear.bias = nn.Parameter(torch.empty(shape[0], device="meta"))
        set_init_method(linear.bias, InitMethod.zeros())
        set_record(linear.bias, split_record((shape[0],), 0, parts, part, EXPERT_TENSOR_PARALLEL, data=data)
                   if split_dim == 0 else whole_record((shape[0],), replicated_over=whole))
    else:
        linear.bias = None
    module.add_module(name, linear)


def expert_linear(linear: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    """F.linear of one of _linear_parameters' linears, in FP8 where gpt/fp8.py's apply_fp8 gave it an `fp8_state`
    (a shared expert's projections: Megatron-Core's SharedExpertMLP is built of TE linears)."""
    state = getattr(linear, "fp8_state", None)
    if state is None or rows.is_meta:
        return F.linear(rows, linear.weight, linear.bias)
    return fp8_linear(rows, linear.weight, linear.bias, state)


class ExpertMLP(nn.Module):
    """One expert: h -> ffn -> activation (or SwiGLU's silu(gate) * up) -> h; with `xielu`, the expert's own xIELU
    and its two scalars (`activation_func`, gpt/xielu.py); with `tensor_parallel_size` > 1 this rank's 1/size of
    the ffn features (module docstring)."""

    def __init__(self, hidden_size: int, ffn_size: int, *, swiglu: bool, init_std: float, output_init_std: float,
                 bias: bool, xielu: bool = False, tensor_parallel_size: int = 1, tensor_parallel_rank: int = 0,
                 data: tuple[str, ...] = DENSE_DATA):
        super().__init__()
        self.swiglu = swiglu
        split = tensor_parallel_size > 1
        inputs = ("dense_h_to_4h_gate", "dense_h_to_4h_up") if swiglu else ("dense_h_to_4h",)
        for name in inputs:
            _linear_parameters(self, name, hidden_size, ffn_size, init_std, bias, 0 if split else None,
                               tensor_parallel_size, tensor_parallel_rank, data)
        if xielu:  # its scalars held as the expert's weights are: by its expert data-parallel group under EP
            self.activation_func = XIELU(replicated_over=(
                EXPERT_TENSOR_PARALLEL if data == EXPERT_DATA else TENSOR_PARALLEL, *data))
        _linear_parameters(self, "dense_4h_to_h", ffn_size, hidden_size, output_init_std, bias, 1 if split else None,
                           tensor_parallel_size, tensor_parallel_rank, data)

    def input_linears(self) -> list[nn.Module]:
        return [self.dense_h_to_4h_gate, self.dense_h_to_4h_up] if self.swiglu else [self.dense_h_to_4h]


class Experts(nn.Module):
    """This rank's ExpertMLPs, named by their global expert index (`expert_ids`: all of `num_experts` at
    expert-parallel size 1, an expert-parallel rank's share otherwise); forward(rows [N, H] grouped by local
    expert in `expert_ids` order, tokens_per_expert [local experts]) -> [N, H]. `tensor_parallel` (the experts'
    grid, with its communicator `comm`): split each expert over its ETP group (module docstring); the output is
    then this rank's partial sum. `expert_parallel`: the experts are held by an expert data-parallel group, whose
    ranks ZeRO reduces them over (zero/experts.py); their sharding records say so (replicated over "edp"). `glu`: the
    gated activation of a `swiglu` (gated) expert (gpt/glu.py)."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int, *, activation: Callable[[torch.Tensor], torch.Tensor],
                 swiglu: bool, init_std: float, output_init_std: float, bias: bool, grouped: bool = True,
                 expert_ids: Optional[Sequence[int]] = None, xielu: bool = False,
                 tensor_parallel: Optional[ExpertParallel] = None, comm=None, expert_parallel: bool = False,
                 glu: GatedActivation = SWIGLU):
        super().__init__()
        self.activation, self.swiglu, self.grouped, self.xielu, self.glu = activation, swiglu, grouped, xielu, glu
        # the device type a planned run computes on (planner/moe_plan.py), for the choice on the meta device
        self.planned_device: Optional[str] = None
        self.tensor_parallel = tensor_parallel if tensor_parallel is not None and tensor_parallel.tensor_size > 1 \
            else None
        self.comm = comm
        # With --fp8-format: the alignment each expert's rows are padded to, set by gpt/fp8.py's apply_fp8 with each
        # projection's `fp8_state` (parallel/fp8/grouped.py); None runs the experts in high precision.
        self.fp8_align: Optional[int] = None
        parts = 1 if self.tensor_parallel is None else self.tensor_parallel.tensor_size
        part = 0 if self.tensor_parallel is None else self.tensor_parallel.tensor_rank
        for expert in (range(num_experts) if expert_ids is None else expert_ids):
            self.add_module(str(expert), ExpertMLP(hidden_size, ffn_size, swiglu=swiglu, init_std=init_std,
                                                   output_init_std=output_init_std, bias=bias, xielu=xielu,
                                                   tensor_parallel_size=parts, tensor_parallel_rank=part,
                                                   data=EXPERT_DATA if expert_parallel else DENSE_DATA))

    def _output_bias(self, bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The output projection's bias as this rank adds it: whole, or under expert tensor parallelism the first
        ETP peer's only (the peers' partial outputs are summed), its gradient summed over the peers."""
        parallel = self.tensor_parallel
        if bias is None or parallel is None:
            return bias
        bias = sum_gradient_over(bias, self.comm, parallel.tensor_group, "etp")
        return bias if parallel.tensor_rank == 0 else bias * 0.0

    def forward(self, rows: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        if self.fp8_align is not None and not rows.is_meta:
            return self.forward_fp8(rows, tokens_per_expert)
        if self.grouped and can_group(rows, list(self.children()), self.planned_device):
            if not torch.is_tensor(tokens_per_expert):  # the dispatcher's counts, known on the host
                tokens_per_expert = counts_on(rows.device, tokens_per_expert)
            return self.forward_grouped(rows, tokens_per_expert)
        return self.forward_loop(rows, tokens_per_expert)

    def _activate(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return self.glu(inputs[0], inputs[1]) if self.swiglu else self.activation(inputs[0])

    def forward_loop(self, rows: torch.Tensor, tokens_per_expert) -> torch.Tensor:
        """`tokens_per_expert`: a list of ints (what a dispatcher gives), or a tensor (read back to the host)."""
        sizes = tokens_per_expert.tolist() if torch.is_tensor(tokens_per_expert) else list(tokens_per_expert)
        outputs = []
        for expert, chunk in zip(self.children(), torch.split(rows, sizes)):
            inputs = [F.linear(chunk, linear.weight, linear.bias) for linear in expert.input_linears()]
            hidden = expert.activation_func(inputs[0]) if self.xielu else self._activate(inputs)
            outputs.append(F.linear(hidden, expert.dense_4h_to_h.weight, self._output_bias(expert.dense_4h_to_h.bias)))
        return torch.cat(outputs) if outputs else rows

    def forward_fp8(self, rows: torch.Tensor, tokens_per_expert) -> torch.Tensor:
        """Each projection as TE's GroupedLinear in FP8: per expert one FP8 GEMM over its rows padded to
        `fp8_align` (parallel/fp8/grouped.py); the activation per expert, as forward_loop."""
        sizes = tokens_per_expert.tolist() if torch.is_tensor(tokens_per_expert) else list(tokens_per_expert)
        experts = list(self.children())

        def projection(inputs: torch.Tensor, linears: list[nn.Module], biases: list) -> torch.Tensor:
            return fp8_grouped_linear(inputs, sizes, [linear.weight for linear in linears], biases,
                                      [linear.fp8_state for linear in linears], self.fp8_align)

        inputs = [projection(rows, linears, [linear.bias for linear in linears])
                  for linears in ([expert.input_linears()[i] for expert in experts]
                                  for i in range(len(experts[0].input_linears())))]
        activated = []
        for expert, *chunks in zip(experts, *(torch.split(part, sizes) for part in inputs)):
            activated.append(expert.activation_func(chunks[0]) if self.xielu else self._activate(list(chunks)))
        outputs = [expert.dense_4h_to_h for expert in experts]
        return projection(torch.cat(activated), outputs, [self._output_bias(linear.bias) for linear in outputs])

    def forward_grouped(self, rows: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        experts = list(self.children())
        offsets = torch.cumsum(tokens_per_expert, 0).to(torch.int32)

        def grouped_linear(inputs: torch.Tensor, linears: list[nn.Module], last: bool = False) -> torch.Tensor:
            output = _GroupedMatmulOverStacked.apply(inputs, offsets, *[linear.weight for linear in linears])
            if linears[0].bias is not None:
                bias = torch.stack([self._output_bias(linear.bias) if last else linear.bias for linear in linears])
                output = output + bias.repeat_interleave(tokens_per_expert, dim=0, output_size=inputs.shape[0])
            return output

        inputs = [grouped_linear(rows, [expert.input_linears()[i] for expert in experts])
                  for i in range(len(experts[0].input_linears()))]
        if self.xielu:  # each row with its expert's scalars
            alpha_p, alpha_n = (torch.cat([getattr(expert.activation_func, name) for expert in experts])
                                .repeat_interleave(tokens_per_expert, output_size=rows.shape[0])[:, None]
                                for name in ("alpha_p", "alpha_n"))
            activated = xielu(inputs[0], alpha_p, alpha_n)
        else:
            activated = self._activate(inputs)
        return grouped_linear(activated, [expert.dense_4h_to_h for expert in experts], last=True)


def counts_on(device: torch.device, sizes: list[int]) -> torch.Tensor:
    """Rows per expert known on the host as the int64 tensor on `device` the grouped matmul's offsets come from,
    without the host waiting for the device: a fill where every expert has as many (padding to capacity), else a
    copy from pinned memory, which the stream orders (from pageable memory CUDA's copy waits for the stream)."""
    if sizes and all(size == sizes[0] for size in sizes):
        return torch.full((len(sizes),), sizes[0], dtype=torch.int64, device=device)
    host = torch.tensor(sizes, dtype=torch.int64)
    return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)


def _stacked(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    """The local experts' [out, in] weights as grouped_mm's [E, in, out] operand."""
    return torch.stack(list(weights)).transpose(-2, -1)


class _GroupedMatmulOverStacked(torch.autograd.Function):
    """F.grouped_mm(inputs, the experts' weights stacked) keeping only the inputs and the weights themselves for
    backward: autograd's own graph would keep the stacked copy (E x in x out, made every micro-batch), which
    Megatron-Core's grouped GEMM does not; backward stacks the weights again and runs torch's derivative of
    grouped_mm as GroupedMmBackward0 does (the operand is column-major: the same two grouped matmuls), so the
    gradients are bitwise autograd's (tests/gpt/test_moe_grouped_saved.py). On the meta device (the planner's dry
    run) it gives the shapes only: torch's meta grouped_mm takes bf16 only."""

    @staticmethod
    def forward(ctx, inputs: torch.Tensor, offsets: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inputs, offsets, *weights)
        if inputs.is_meta:
            return inputs.new_empty((inputs.shape[0], weights[0].shape[0]))
        return F.grouped_mm(inputs, _stacked(weights), offs=offsets)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        inputs, offsets, *weights = ctx.saved_tensors
        if inputs.is_meta:
            return (inputs.new_empty(inputs.shape) if ctx.needs_input_grad[0] else None, None,
                    *(weight.new_empty(weight.shape) for weight in weights))
        grad = grad.contiguous()  # grouped_mm's CPU kernel takes a dense gradient only
        grad_inputs = F.grouped_mm(grad, _stacked(weights).transpose(-2, -1), offs=offsets) \
            if ctx.needs_input_grad[0] else None
        if not any(ctx.needs_input_grad[2:]):
            return grad_inputs, None, *(None for _ in weights)
        # the stacked operand is column-major, so torch computes its gradient transposed: [E, out, in], expert e's
        # weight gradient at [e]
        grad_weights = F.grouped_mm(grad.transpose(-2, -1), inputs, offs=offsets)
        return grad_inputs, None, *grad_weights.unbind(0)


def can_group(rows: torch.Tensor, experts: list[nn.Module], planned_device: Optional[str] = None) -> bool:
    """Whether F.grouped_mm takes these operands: it exists; on a CPU for fp32, bf16 or fp16, on CUDA for bf16 on a
    Hopper or later (its CUDA kernel's condition: fp32 there takes the loop); and every row's byte width (hidden
    and ffn) is a multiple of 16, as its kernels require. On the meta device, for `planned_device` (None: the
    loop); a planned CUDA device is taken to be a Hopper or later (the planner plans H100-class GPUs)."""
    if not hasattr(F, "grouped_mm") or not experts or rows.shape[0] == 0:
        return False
    device = planned_device if rows.is_meta else rows.device.type
    if device == "cpu":
        if rows.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return False
    elif not (device == "cuda" and rows.dtype == torch.bfloat16
              and (rows.is_meta or torch.cuda.get_device_capability(rows.device) >= (9, 0))):
        return False
    ffn, hidden = experts[0].dense_4h_to_h.weight.shape[1], rows.shape[1]
    size = rows.element_size()
    return (hidden * size) % 16 == 0 and (ffn * size) % 16 == 0
