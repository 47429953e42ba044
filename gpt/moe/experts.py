"""The experts: one MLP per expert, named as the dense MLP (`experts.<e>.dense_h_to_4h.weight`) so checkpoints reshard
across EP sizes by name. They run as one grouped matmul per projection where torch has one (Megatron-Core's
--moe-grouped-gemm), else as a loop (SequentialMLP); both agree."""

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
    """Parameters of an expert linear split along `split_dim` (0: column-parallel; 1: row-parallel) into `parts`, this
    rank holding `part`; sharding records say so."""
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
    """F.linear of an expert linear, in FP8 where apply_fp8 gave it an `fp8_state`."""
    state = getattr(linear, "fp8_state", None)
    if state is None or rows.is_meta:
        return F.linear(rows, linear.weight, linear.bias)
    return fp8_linear(rows, linear.weight, linear.bias, state)


class ExpertMLP(nn.Module):
    """One expert: h -> ffn -> activation (or gated) -> h; with `xielu` its own scalars; under expert TP this rank's
    1/size of the ffn."""

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
        if xielu:
            self.activation_func = XIELU(replicated_over=(
                EXPERT_TENSOR_PARALLEL if data == EXPERT_DATA else TENSOR_PARALLEL, *data))
        _linear_parameters(self, "dense_4h_to_h", ffn_size, hidden_size, output_init_std, bias, 1 if split else None,
                           tensor_parallel_size, tensor_parallel_rank, data)

    def input_linears(self) -> list[nn.Module]:
        return [self.dense_h_to_4h_gate, self.dense_h_to_4h_up] if self.swiglu else [self.dense_h_to_4h]


class Experts(nn.Module):
    """This rank's experts, by global index (`expert_ids`); forward(rows [N, H] grouped by local expert,
    tokens_per_expert) -> [N, H]. Under expert TP the output is this rank's partial sum; under EP the experts' gradients
    reduce over the expert data-parallel group."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_size: int, *, activation: Callable[[torch.Tensor], torch.Tensor],
                 swiglu: bool, init_std: float, output_init_std: float, bias: bool, grouped: bool = True,
                 expert_ids: Optional[Sequence[int]] = None, xielu: bool = False,
                 tensor_parallel: Optional[ExpertParallel] = None, comm=None, expert_parallel: bool = False,
                 glu: GatedActivation = SWIGLU):
        super().__init__()
        self.activation, self.swiglu, self.grouped, self.xielu, self.glu = activation, swiglu, grouped, xielu, glu
        # the device type a planned run computes on, for the choice on the meta device
        self.planned_device: Optional[str] = None
        self.tensor_parallel = tensor_parallel if tensor_parallel is not None and tensor_parallel.tensor_size > 1 \
            else None
        self.comm = comm
        # --fp8-format: the alignment each expert's rows are padded to (set by apply_fp8); None runs high precision
        self.fp8_align: Optional[int] = None
        parts = 1 if self.tensor_parallel is None else self.tensor_parallel.tensor_size
        part = 0 if self.tensor_parallel is None else self.tensor_parallel.tensor_rank
        for expert in (range(num_experts) if expert_ids is None else expert_ids):
            self.add_module(str(expert), ExpertMLP(hidden_size, ffn_size, swiglu=swiglu, init_std=init_std,
                                                   output_init_std=output_init_std, bias=bias, xielu=xielu,
                                                   tensor_parallel_size=parts, tensor_parallel_rank=part,
                                                   data=EXPERT_DATA if expert_parallel else DENSE_DATA))

    def _output_bias(self, bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """The output bias as this rank adds it: under expert TP only the first peer's (the partial outputs are
        summed)."""
        parallel = self.tensor_parallel
        if bias is None or parallel is None:
            return bias
        bias = sum_gradient_over(bias, self.comm, parallel.tensor_group, "etp")
        return bias if parallel.tensor_rank == 0 else bias * 0.0

    def forward(self, rows: torch.Tensor, tokens_per_expert: torch.Tensor) -> torch.Tensor:
        if self.fp8_align is not None and not rows.is_meta:
            return self.forward_fp8(rows, tokens_per_expert)
        if self.grouped and can_group(rows, list(self.children()), self.planned_device):
            if not torch.is_tensor(tokens_per_expert):
                tokens_per_expert = counts_on(rows.device, tokens_per_expert)
            return self.forward_grouped(rows, tokens_per_expert)
        return self.forward_loop(rows, tokens_per_expert)

    def _activate(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return self.glu(inputs[0], inputs[1]) if self.swiglu else self.activation(inputs[0])

    def forward_loop(self, rows: torch.Tensor, tokens_per_expert) -> torch.Tensor:
        sizes = tokens_per_expert.tolist() if torch.is_tensor(tokens_per_expert) else list(tokens_per_expert)
        outputs = []
        for expert, chunk in zip(self.children(), torch.split(rows, sizes)):
            inputs = [F.linear(chunk, linear.weight, linear.bias) for linear in expert.input_linears()]
            hidden = expert.activation_func(inputs[0]) if self.xielu else self._activate(inputs)
            outputs.append(F.linear(hidden, expert.dense_4h_to_h.weight, self._output_bias(expert.dense_4h_to_h.bias)))
        return torch.cat(outputs) if outputs else rows

    def forward_fp8(self, rows: torch.Tensor, tokens_per_expert) -> torch.Tensor:
        """Each projection as TE's GroupedLinear in FP8: one FP8 GEMM per expert over its rows padded to `fp8_align`."""
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
        if self.xielu:
            alpha_p, alpha_n = (torch.cat([getattr(expert.activation_func, name) for expert in experts])
                                .repeat_interleave(tokens_per_expert, output_size=rows.shape[0])[:, None]
                                for name in ("alpha_p", "alpha_n"))
            activated = xielu(inputs[0], alpha_p, alpha_n)
        else:
            activated = self._activate(inputs)
        return grouped_linear(activated, [expert.dense_4h_to_h for expert in experts], last=True)


def counts_on(device: torch.device, sizes: list[int]) -> torch.Tensor:
    """Rows per expert as the int64 tensor on `device` the grouped matmul's offsets come from, without a host wait: a
    fill, or a copy from pinned memory ordered by the stream."""
    if sizes and all(size == sizes[0] for size in sizes):
        return torch.full((len(sizes),), sizes[0], dtype=torch.int64, device=device)
    host = torch.tensor(sizes, dtype=torch.int64)
    return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)


def _stacked(weights: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack(list(weights)).transpose(-2, -1)


class _GroupedMatmulOverStacked(torch.autograd.Function):
    """F.grouped_mm over the stacked weights keeping only inputs and weights for backward (autograd would keep the E x
    in x out stack); gradients bitwise autograd's. On meta: shapes only."""

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
        # the stacked operand is column-major: torch computes its gradient transposed, [E, out, in]
        grad_weights = F.grouped_mm(grad.transpose(-2, -1), inputs, offs=offsets)
        return grad_inputs, None, *grad_weights.unbind(0)


def can_group(rows: torch.Tensor, experts: list[nn.Module], planned_device: Optional[str] = None) -> bool:
    """Whether F.grouped_mm takes these operands (CPU fp32/bf16/fp16; CUDA bf16 on Hopper+; row byte widths multiples of
    16). On meta, for `planned_device`, a CUDA device taken as Hopper+."""
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
