"""The gated MLP's gate and up as one GEMM of width 2 x ffn (gpt/gate_up_gemm.py), as Megatron-Core's linear_fc1:
one [2 ffn / TP, h] weight per TP rank (megatron/core/transformer/mlp.py: `linear_fc1` of
`ffn_hidden_size * 2` output features when `gated_linear_unit`, its output chunked in two by `glu`), while the model
keeps its two parameters and their checkpoints.

Checked here: the forward is the two GEMMs' bit for bit; the activation's gradients are autograd's bit for bit; the
input gradient (one GEMM over 2 ffn instead of two summed) within fp32's reordering; the ops a micro-batch launches;
the weights lying back to back under ZeRO at every stage and under materialize; the two-GEMM fallback where they do
not; and a whole train step against the two GEMMs.
"""

from __future__ import annotations

import collections
import copy
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpt.mlp
from arguments.parser import parse_config
from gpt.gate_up_gemm import back_to_back, gate_and_up, gated_gradients_into, one_gemm, one_gemm_math
from gpt.glu import GatedActivation
from gpt.mlp import SwiGLUMLP, activation_function
from gpt.parallel_plan import tensor_parallel_plan
from parallel.init import materialize
from parallel.state import ParallelState, destroy, initialize_grid
from training.build import build
from training.run_settings import resolve_run_settings
from training.train_step import DataParallelTrainStep

CPU = ParallelState(device=torch.device("cpu"))
# The MLP's width here: a multiple of 64, so that each row of a half runs whole in torch's CPU loops of two vectors
# (16 fp32 or 32 bf16 lanes each, AVX-512) as the contiguous tensors of the two GEMMs do. At another width the last
# elements of each row take the scalar loop where the contiguous tensor took the vectorized one: for SiLU and GeLU
# another rounding, 1 ulp (2.4e-7 on values ~40 at width 48). A GPU's elementwise kernels compute the same bits
# whatever the layout.
F = 64
GLUS = {
    "swiglu": GatedActivation(),
    "quick-clamp-offset": GatedActivation(quick=True, clamp=1.5, offset=1.0),  # GPT-OSS's
    "swiglu-clamp": GatedActivation(clamp=1.0),
    "gelu-tanh-offset": GatedActivation(offset=0.5, activation=functools.partial(activation_function, "gelu_tanh")),
}


def _mlp(glu: GatedActivation, bias: bool, dtype: torch.dtype, gate_first: bool = True, h: int = 32, f: int = F):
    """A SwiGLUMLP materialized with gate and up back to back ([gate; up], or [up; gate] as ZeRO's reduce buckets
    lay them, last layer first)."""
    mlp = materialize(SwiGLUMLP(h, f, plan=tensor_parallel_plan(CPU), init_std=0.5, output_init_std=0.5, bias=bias,
                                glu=glu), seed=2, dtype=dtype)
    if not gate_first:
        gate, up = mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up
        for name in ("weight", "bias") if bias else ("weight",):
            first, second = getattr(up, name), getattr(gate, name)
            flat = torch.cat([first.detach().reshape(-1), second.detach().reshape(-1)])
            first.data, second.data = flat[:first.numel()].view(first.shape), flat[first.numel():].view(second.shape)
    return mlp


def _random(*shape, dtype, seed):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).to(dtype)


def _run(function, mlp, hidden, grad):
    """Output and the gradients of the input, gate and up's weights and biases."""
    mlp.zero_grad()
    hidden = hidden.detach().requires_grad_()
    gate, up = mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up
    output = function(mlp, hidden)
    output.backward(grad)
    params = [gate.weight, up.weight] + ([gate.bias, up.bias] if gate.bias is not None else [])
    return output.detach(), hidden.grad, [param.grad.clone() for param in params]


def _two_gemms(mlp, hidden):
    gate, up = mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up
    return mlp.glu(gate.linear(hidden, gate.weight, gate.bias), up.linear(hidden, up.weight, up.bias))


def _one_gemm(mlp, hidden):
    output = gate_and_up(hidden, mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up, mlp.glu)
    assert output is not None  # the weights are back to back: one GEMM
    return output


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("gate_first", [True, False], ids=["gate-up", "up-gate"])
@pytest.mark.parametrize("glu", list(GLUS))
def test_one_gemm_is_the_two_gemms(glu, gate_first, bias, dtype):
    """Forward: the same bits (a GEMM's columns do not depend on the others'). Gradients: the weights' and biases'
    are the same rows and columns of one GEMM and one sum (the same bits here); the input's sums 2 ffn products in one
    GEMM where the two GEMMs summed ffn each, rounded, then added: fp32's reordering, and in bf16 one rounding where
    there were three, so never further from the fp64 gradient than the two GEMMs' (and 2.6e-6 relative at most of
    the largest value in fp32, measured)."""
    mlp = _mlp(GLUS[glu], bias, dtype, gate_first)
    hidden, grad = _random(3, 5, 32, dtype=dtype, seed=1), _random(3, 5, F, dtype=dtype, seed=2)
    output, grad_hidden, grads = _run(_one_gemm, mlp, hidden, grad)
    two_output, two_grad_hidden, two_grads = _run(_two_gemms, mlp, hidden, grad)
    assert torch.equal(output, two_output)
    for grad_param, two_grad_param in zip(grads, two_grads):
        assert torch.equal(grad_param, two_grad_param)
    _, exact, _ = _run(_two_gemms, copy.deepcopy(mlp).double(), hidden.double(), grad.double())
    error, two_error = ((got.double() - exact).abs().max() for got in (grad_hidden, two_grad_hidden))
    assert error <= two_error * 1.01 + 1e-12 if dtype == torch.bfloat16 else error <= 1e-5 * exact.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("glu", list(GLUS))
def test_one_gemm_is_its_plain_formulation_bit_for_bit(glu, bias, dtype):
    """Against autograd through the same one GEMM and GatedActivation.math (one_gemm_math): every output and
    gradient the same bits, so the written-out backward (gated_gradients_into) runs autograd's ops."""
    mlp = _mlp(GLUS[glu], bias, dtype)
    hidden, grad = _random(3, 5, 32, dtype=dtype, seed=3), _random(3, 5, F, dtype=dtype, seed=4)

    def through(function):
        def call(mlp, hidden):
            gate, up = mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up
            return function(hidden, gate.weight, up.weight, gate.bias, up.bias, mlp.glu, True)
        return call
    output, grad_hidden, grads = _run(through(one_gemm), mlp, hidden, grad)
    plain_output, plain_grad_hidden, plain_grads = _run(through(one_gemm_math), mlp, hidden, grad)
    assert torch.equal(output, plain_output) and torch.equal(grad_hidden, plain_grad_hidden)
    for grad_param, plain_grad_param in zip(grads, plain_grads):
        assert torch.equal(grad_param, plain_grad_param)


@pytest.mark.parametrize("glu", list(GLUS))
def test_the_halves_gradients_are_the_gated_activations(glu):
    """gated_gradients_into writes into the two halves of one buffer what GatedActivation's own backward returns."""
    activation = GLUS[glu]
    gate, linear = (_random(6, F, dtype=torch.bfloat16, seed=seed).requires_grad_() for seed in (5, 6))
    grad = _random(6, F, dtype=torch.bfloat16, seed=7)
    expected = torch.autograd.grad(activation(gate, linear), (gate, linear), grad)
    both = torch.empty(6, 2 * F, dtype=torch.bfloat16)
    gated_gradients_into(activation, grad, gate.detach(), linear.detach(), both[:, :F], both[:, F:])
    assert torch.equal(both[:, :F], expected[0]) and torch.equal(both[:, F:], expected[1])


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func._opname not in ("detach", "empty", "empty_like", "empty_strided"):
            self.seen[func._opname] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("one", [True, False], ids=["one-gemm", "two-gemms"])
def test_the_mlp_launches_one_gemm_forward_and_two_backward(one, monkeypatch):
    """SwiGLU's MLP per micro-batch: forward mm (gate and up) + mm (down); backward the down projection's two and
    gate and up's two (input, weights) where the two GEMMs had four, and the add of their input gradients."""
    mlp = _mlp(GLUS["swiglu"], False, torch.float32)
    if not one:
        monkeypatch.setattr(gpt.mlp, "gate_and_up", lambda *args: None)
    hidden = _random(2, 4, 32, dtype=torch.float32, seed=8).requires_grad_()
    with Ops() as forward:
        output = mlp(hidden)
    with Ops() as backward:
        output.backward(torch.ones_like(output))
    assert forward.seen["mm"] == (2 if one else 3)
    assert backward.seen["mm"] == (4 if one else 6)
    assert backward.seen["add"] == (0 if one else 1)


def test_weights_apart_run_two_gemms():
    mlp = materialize(SwiGLUMLP(32, 48, plan=tensor_parallel_plan(CPU), init_std=0.5, output_init_std=0.5, bias=False),
                      seed=2)
    gate, up = mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up
    gate.weight.data = gate.weight.detach().clone()  # its own storage now
    assert not back_to_back(gate.weight, up.weight) and not back_to_back(up.weight, gate.weight)
    hidden = _random(2, 4, 32, dtype=torch.float32, seed=9)
    assert gate_and_up(hidden, gate, up, mlp.glu) is None
    assert torch.equal(mlp(hidden), mlp.dense_4h_to_h(_two_gemms(mlp, hidden)))


VOCAB, SEQ = 512, 32
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", str(SEQ),
         "--max-position-embeddings", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", "4",
         "--tokenizer-vocab-size", str(VOCAB), "--hidden-dropout", "0", "--attention-dropout", "0", "--device", "cpu",
         "--train-iters", "10", "--seed", "3", "--swiglu", "--normalization", "RMSNorm",
         "--position-embedding-type", "rope"]


def _batches():
    generator = torch.Generator().manual_seed(0)
    while True:
        yield {"tokens": torch.randint(0, VOCAB, (2, SEQ + 1), generator=generator)}


def _train(*flags, iterations=2):
    config = parse_config([*MODEL, *flags])
    state = initialize_grid("cpu", config.parallel, 1)
    try:
        settings = resolve_run_settings(config, VOCAB, 1, 1, "cpu")
        built = build(settings, state, dropout_rng=True, torch_compile=False)
        mlps = [block.mlp for block in built.model.blocks]
        orders = [("gate-up" if back_to_back(mlp.dense_h_to_4h_gate.weight, mlp.dense_h_to_4h_up.weight) else
                   "up-gate" if back_to_back(mlp.dense_h_to_4h_up.weight, mlp.dense_h_to_4h_gate.weight) else "apart")
                  for mlp in mlps]
        step = DataParallelTrainStep(built.model, built.zero, _batches(), settings, state, built.activations)
        outcomes = [step(i + 1, i * settings.batch.global_batch_size, measure_activations=False)
                    for i in range(iterations)]
        return orders, [(outcome.loss, outcome.grad_norm) for outcome in outcomes]
    finally:
        destroy(state)


@pytest.mark.parametrize("flags", [("--zero-stage", "0"), ("--zero-stage", "1", "--bf16"), ("--zero-stage", "2"),
                                   ("--zero-stage", "3", "--add-bias-linear"),
                                   ("--zero-stage", "1", "--no-gradient-accumulation-fusion", "--add-bias-linear")],
                         ids=["zero0", "zero1-bf16", "zero2", "zero3-bias", "zero1-unfused-bias"])
def test_under_zero_gate_and_up_are_one_gemm_and_train_as_two(flags, monkeypatch):
    """ZeRO lays a unit's parameters of one kind out in order: forward order in a stage-3 block chunk ([gate; up]),
    the reverse in stages 0-2's reduce buckets (filled from the last layer: [up; gate]); biases are of another kind,
    back to back among themselves. The losses and gradient norms equal the two GEMMs' within fp32's reordering of the
    input gradient, in bf16 its one rounding where there were three: measured over 3 iterations, fp32 losses equal and
    gradient norms within 1.3e-8 relative; bf16 losses within 1.7e-5 and gradient norms within 5e-4."""
    orders, one = _train(*flags)
    assert orders == (["gate-up"] * 2 if "3" in flags else ["up-gate"] * 2)
    monkeypatch.setattr(gpt.mlp, "gate_and_up", lambda *args: None)
    _, two = _train(*flags)
    rel = 1e-3 if "--bf16" in flags else 1e-6
    for (loss, norm), (two_loss, two_norm) in zip(one, two):
        assert loss == pytest.approx(two_loss, rel=rel) and norm == pytest.approx(two_norm, rel=rel)


def test_fp8_linears_keep_two_gemms():
    config = parse_config([*MODEL, "--fp8-format", "hybrid", "--hidden-size", "64", "--ffn-hidden-size", "128"])
    state = initialize_grid("cpu", config.parallel, 1)
    try:
        built = build(resolve_run_settings(config, VOCAB, 1, 1, "cpu"), state, dropout_rng=False, torch_compile=False)
        mlp = built.model.blocks[0].mlp
        gate, up = mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up
        assert hasattr(gate, "fp8_state") and back_to_back(up.weight, gate.weight)
        assert gate_and_up(torch.zeros(SEQ, 2, 64), gate, up, mlp.glu) is None
    finally:
        destroy(state)


def test_on_the_meta_device_it_runs_shapes():
    """The planner's dry run (planner/dry_run.py) runs the model on the meta device through the same path."""
    mlp = SwiGLUMLP(32, 48, plan=tensor_parallel_plan(ParallelState(device=torch.device("meta"))), init_std=0.5,
                    output_init_std=0.5, bias=True)
    flat = torch.empty(2 * 48 * 32, device="meta")
    gate, up = mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up
    gate.weight.data, up.weight.data = flat[:48 * 32].view(48, 32), flat[48 * 32:].view(48, 32)
    biases = torch.empty(96, device="meta")
    gate.bias.data, up.bias.data = biases[:48], biases[48:]
    hidden = torch.empty(2, 4, 32, device="meta", requires_grad=True)
    output = gate_and_up(hidden, gate, up, mlp.glu)
    output.sum().backward()
    assert output.shape == (2, 4, 48) and gate.weight.grad.shape == (48, 32) and hidden.grad.is_meta


def test_materialize_lays_gate_and_up_back_to_back():
    def built():
        return SwiGLUMLP(32, 48, plan=tensor_parallel_plan(CPU), init_std=0.5, output_init_std=0.5, bias=True)
    mlp = materialize(built(), seed=4)
    gate, up = mlp.dense_h_to_4h_gate, mlp.dense_h_to_4h_up
    assert back_to_back(gate.weight, up.weight) and back_to_back(gate.bias, up.bias)
    # the values are the initializer's, as apart: a function of each parameter's name and element index
    apart = built()
    apart.adjacent_parameters = list  # nothing to lay out together
    apart = materialize(apart, seed=4)
    assert not back_to_back(apart.dense_h_to_4h_gate.weight, apart.dense_h_to_4h_up.weight)
    for mine, theirs in zip(mlp.parameters(), apart.parameters()):
        assert torch.equal(mine, theirs)
