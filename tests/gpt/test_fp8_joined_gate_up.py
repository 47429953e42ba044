"""A gated MLP's gate and up as one FP8 linear (gpt/fp8.py _joined_gate_up; issue 87): Megatron-Core's linear_fc1 is
one [2 ffn, h] TransformerEngine linear, cast with one scale (one amax over both halves, one delayed-scaling state),
one GEMM each way, as this project's bf16 runs gate and up (gpt/gate_up_gemm.py). Here: the joined linear gives the
bits of one FP8 linear over the concatenated weight, each parameter its rows' gradient (autograd's, or added into its
main gradient); the model holds one state for the pair under the joined name; a checkpoint's histories fit either
layout (checkpoint/fp8_state.py); with biases or --fp8-param-gather the two stay FP8 linears of their own."""

import pytest
import torch

from checkpoint.fp8_state import restore_fp8_histories
from gpt.fp8 import apply_fp8, delayed_states
from gpt.model import build_gpt_model
from parallel.fp8.linear import Fp8LinearState, fp8_linear
from parallel.fp8.recipes import Fp8Recipe
from parallel.state import ParallelState
from tests.gpt.test_llama_blocks import tiny_config
from tests.parallel.test_fp8_launch_counts import MainGradient

SINGLE = ParallelState(device=torch.device("cpu"))
TOKENS, HIDDEN, FFN = 32, 64, 96


def _data(seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, HIDDEN, generator=generator)
    gate, up = (torch.randn(FFN, HIDDEN, generator=generator) * 0.1 for _ in range(2))
    grad = torch.randn(TOKENS, 2 * FFN, generator=generator)
    return x, gate, up, grad


@pytest.mark.parametrize("recipe", ["tensorwise", "delayed", "blockwise", "mxfp8"])
def test_two_weights_run_as_one_fp8_linear_over_their_rows(recipe):
    """The pair gives the output and input gradient of fp8_linear over [gate; up] bit for bit, and each weight the
    rows of that linear's weight gradient; into main gradients, the same rows added there."""
    fmt = "e4m3" if recipe == "blockwise" else "hybrid"
    x, gate, up, grad = _data()
    joined_weight = torch.cat([gate, up]).requires_grad_()
    x_ref = x.clone().requires_grad_()
    reference = fp8_linear(x_ref, joined_weight, None, Fp8LinearState(Fp8Recipe(fp8_format=fmt, recipe=recipe)))
    reference.backward(grad)
    x_pair = x.clone().requires_grad_()
    gate_param, up_param = gate.clone().requires_grad_(), up.clone().requires_grad_()
    out = fp8_linear(x_pair, (gate_param, up_param), None, Fp8LinearState(Fp8Recipe(fp8_format=fmt, recipe=recipe)))
    out.backward(grad)
    assert torch.equal(out, reference) and torch.equal(x_pair.grad, x_ref.grad)
    assert torch.equal(gate_param.grad, joined_weight.grad[:FFN])
    assert torch.equal(up_param.grad, joined_weight.grad[FFN:])

    state = Fp8LinearState(Fp8Recipe(fp8_format=fmt, recipe=recipe))
    gate_main, up_main = MainGradient(gate_param), MainGradient(up_param, offset=16)
    mains = {id(gate_param): gate_main.grad, id(up_param): up_main.grad}
    state.main_grads = type("Holder", (), {"main_grad": lambda _, param: mains[id(param)]})()
    fp8_linear(x.clone().requires_grad_(), (gate_param, up_param), None, state).backward(grad)
    # the weight gradient's rows (fp32 here), added into zeroed main gradients
    assert torch.equal(gate_main.grad, joined_weight.grad[:FFN])
    assert torch.equal(up_main.grad, joined_weight.grad[FFN:])


def _llama(recipe="delayed", **overrides):
    config = tiny_config(fp8="hybrid", fp8_recipe=recipe, swiglu=True, add_bias_linear=False, num_layers=2,
                         **overrides)
    model = build_gpt_model(config, SINGLE, seed=1)
    line = apply_fp8(model.blocks, config, tokens_per_micro_batch=32, device=torch.device("cpu"))
    return config, model, line


def test_a_gated_mlp_holds_one_fp8_state_for_gate_and_up_under_the_joined_name():
    _, model, line = _llama()
    mlp = model.blocks[0].mlp
    assert mlp.dense_h_to_4h_gate.fp8_state is mlp.dense_h_to_4h_up.fp8_state is not None
    assert mlp.joined_linear is not None
    names = set(delayed_states(model))
    assert names == {f"blocks.{i}.{part}" for i in (0, 1)
                     for part in ("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h",
                                  "mlp.dense_4h_to_h")}
    assert "mlp.dense_h_to_4h (gate and up, one linear)" in line and ": 8 linears in FP8" in line
    tokens = torch.randint(0, 300, (2, 16))
    model(tokens).float().sum().backward()  # the joined GEMMs run, forward and backward
    assert mlp.dense_h_to_4h_gate.weight.grad is not None and mlp.dense_h_to_4h_up.weight.grad is not None


@pytest.mark.parametrize("overrides", [dict(add_bias_linear=True), dict(fp8_param_gather=True)],
                         ids=["biases", "param-gather"])
def test_with_biases_or_fp8_param_gather_gate_and_up_stay_two_fp8_linears(overrides):
    config = tiny_config(fp8="hybrid", fp8_recipe="delayed", swiglu=True, num_layers=1,
                         **{"add_bias_linear": False, **overrides})
    model = build_gpt_model(config, SINGLE, seed=1)
    apply_fp8(model.blocks, config, tokens_per_micro_batch=32, device=torch.device("cpu"))
    mlp = model.blocks[0].mlp
    assert mlp.joined_linear is None
    assert mlp.dense_h_to_4h_gate.fp8_state is not mlp.dense_h_to_4h_up.fp8_state


def _bits(values):
    return torch.tensor(values, dtype=torch.float32).view(torch.int32).tolist()


def test_a_checkpoint_of_gate_and_up_apart_restores_into_the_joined_state_and_back():
    """Saved apart (before gate and up were joined), the joined state takes the elementwise max of the two histories
    (the joined tensor's amax is the larger half's) and the smaller scale of each role; saved joined, a run keeping
    them apart gives each the joined state."""
    _, model, _ = _llama()
    history_gate, history_up = [[1.0, 4.0, 2.0]], [[3.0, 1.0, 2.5]]
    saved = {"blocks.0.mlp.dense_h_to_4h_gate": {"amax_history": _bits(history_gate), "scale": _bits([2.0, 8.0, 1.0])},
             "blocks.0.mlp.dense_h_to_4h_up": {"amax_history": _bits(history_up), "scale": _bits([4.0, 1.0, 0.5])}}
    missing = restore_fp8_histories(model, saved)
    assert "blocks.0.mlp.dense_h_to_4h" not in missing and "blocks.1.mlp.dense_h_to_4h" in missing
    joined = delayed_states(model)["blocks.0.mlp.dense_h_to_4h"]
    assert joined.amax_history.tolist() == [[3.0, 4.0, 2.5]] and joined.scale.tolist() == [2.0, 1.0, 0.5]

    config = tiny_config(fp8="hybrid", fp8_recipe="delayed", swiglu=True, num_layers=1, add_bias_linear=True)
    apart = build_gpt_model(config, SINGLE, seed=1)
    apply_fp8(apart.blocks, config, tokens_per_micro_batch=32, device=torch.device("cpu"))
    saved = {"blocks.0.mlp.dense_h_to_4h": {"amax_history": _bits([[5.0, 6.0, 7.0]]), "scale": _bits([1.5, 2.5, 3.5])}}
    restore_fp8_histories(apart, saved)
    for part in ("gate", "up"):
        state = delayed_states(apart)[f"blocks.0.mlp.dense_h_to_4h_{part}"]
        assert state.amax_history.tolist() == [[5.0, 6.0, 7.0]] and state.scale.tolist() == [1.5, 2.5, 3.5]


def test_the_joined_activation_compiles_in_one_graph_with_autograds_gradients():
    """Under torch.compile the joined linear's activation (gate_up_gemm.gated_halves) is autograd's own through the
    halves: its custom backward writes into a half with out=, which dynamo cannot trace, so every layer's graph broke
    there and the backward ran 4 kernels eagerly (issue 87). fullgraph=True fails on any break; values and gradients
    are eager's (inductor may reorder fp32 roundings: 1e-6)."""
    from gpt.gate_up_gemm import gated_halves
    from gpt.glu import GatedActivation

    both = torch.randn(TOKENS, 2 * FFN, generator=torch.Generator().manual_seed(3))
    grad = torch.randn(TOKENS, FFN, generator=torch.Generator().manual_seed(4))
    results = []
    for run in (lambda t: gated_halves(t, GatedActivation()),
                torch.compile(lambda t: gated_halves(t, GatedActivation()), fullgraph=True)):
        leaf = both.clone().requires_grad_()
        out = run(leaf)
        out.backward(grad)
        results.append((out.detach(), leaf.grad))
    (eager_out, eager_grad), (compiled_out, compiled_grad) = results
    torch.testing.assert_close(compiled_out, eager_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-6, atol=1e-6)
