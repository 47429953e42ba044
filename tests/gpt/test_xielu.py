"""swiss-ai's xIELU activation (--xielu, issue 54), against its Megatron-LM fork (github:swiss-ai/Megatron-LM main):

- megatron/training/activations.py, compiled_xielu: `torch.where(x > 0, alpha_p * x * x + beta * x,
  alpha_n * torch.expm1(torch.min(x, eps)) - alpha_n * x + beta * x)`; class XIELU.__init__(alpha_p_init=0.8,
  alpha_n_init=0.8, beta=0.5, eps=-1e-6): `alpha_p = nn.Parameter(torch.log(torch.exp(torch.tensor(alpha_p_init,
  dtype=torch.bfloat16)) - 1.0).unsqueeze(0))`, alpha_n likewise from `alpha_n_init - beta`, `eps =
  torch.tensor(eps, dtype=torch.bfloat16)`; XIELU.forward: `alpha_p = F.softplus(self.alpha_p)`, `alpha_n =
  self.beta + F.softplus(self.alpha_n)`.
- megatron/core/transformer/mlp.py, MLP.__init__: `if self.config.activation_func == XIELU: self.activation_func =
  XIELU(config=self.config)` (one per MLP, its parameters `mlp.activation_func.alpha_p` / `.alpha_n`:
  tools/checkpoint/schema_core.py), applied between linear_fc1 and linear_fc2 without a gate.
- the experts are Megatron-Core MLPs (megatron/core/transformer/moe/experts.py SequentialMLP builds `MLP(...,
  is_expert=True)` per local expert; shared_experts.py SharedExpertMLP(MLP)), so each expert and the shared expert
  hold their own XIELU: tools/checkpoint/schema_core.py names `mlp.experts.local_experts.{e}.activation_func.alpha_p`.
- megatron/training/arguments.py core_transformer_config_from_args: `activation_flags = [args.swiglu, ...,
  args.xielu, ...]; if sum(activation_flags) > 1: raise ValueError("Only one activation function can be selected
  at a time")`.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from arguments.parser import parse_config
from base.errors import ConfigError
from gpt.model import build_gpt_model
from gpt.xielu import xielu
from parallel.state import ParallelState, destroy, initialize
from tests.distributed import run_distributed
from tests.gpt.test_llama_blocks import check_gradients_are_tp1_slices, tiny_config, tokens_for
from tests.reliability_helpers import TINY, straight_and_resumed

SINGLE = ParallelState(device=torch.device("cpu"))
# The fork's initial raw scalars: log(exp(0.8) - 1) and log(exp(0.3) - 1), each step in bf16.
FORK_ALPHA_P_RAW, FORK_ALPHA_N_RAW = 0.2109375, -1.046875


def _softplus(value: float) -> float:
    return math.log1p(math.exp(value))


def test_xielu_equals_the_forks_formula_on_hand_values():
    """compiled_xielu at the fork's initial scalars, worked out in float64 by hand for x = 3, 0.5, 0, -1e-7 (inside
    eps: min(x, eps) is eps, the bf16 -1e-6) and -2."""
    alpha_p = _softplus(FORK_ALPHA_P_RAW)
    alpha_n = 0.5 + _softplus(FORK_ALPHA_N_RAW)
    eps = -9.98377799987793e-07  # torch.tensor(-1e-6, dtype=torch.bfloat16)
    xs = [3.0, 0.5, 0.0, -1e-7, -2.0]
    expected = [alpha_p * 9 + 1.5, alpha_p * 0.25 + 0.25,
                alpha_n * math.expm1(eps) - 0.0 + 0.0,
                alpha_n * math.expm1(eps) - alpha_n * -1e-7 + 0.5 * -1e-7,
                alpha_n * math.expm1(-2.0) + alpha_n * 2.0 - 1.0]
    ours = xielu(torch.tensor(xs, dtype=torch.float64), torch.tensor([FORK_ALPHA_P_RAW], dtype=torch.float64),
                 torch.tensor([FORK_ALPHA_N_RAW], dtype=torch.float64))
    torch.testing.assert_close(ours, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-15)
    assert alpha_p == pytest.approx(0.8, abs=0.01) and alpha_n == pytest.approx(0.8, abs=0.01)


def test_the_mlp_holds_two_learned_scalars_at_the_forks_initial_values_and_applies_xielu_between_its_linears():
    config = tiny_config(activation="xielu")
    model = build_gpt_model(config, SINGLE, seed=3)
    names = {name for name, _ in model.named_parameters() if "activation_func" in name}
    assert names == {f"blocks.{i}.mlp.activation_func.{p}" for i in range(2) for p in ("alpha_p", "alpha_n")}
    mlp = model.blocks[0].mlp
    assert mlp.activation_func.alpha_p.shape == (1,) and mlp.activation_func.alpha_p.requires_grad
    assert mlp.activation_func.alpha_p.item() == FORK_ALPHA_P_RAW
    assert mlp.activation_func.alpha_n.item() == FORK_ALPHA_N_RAW
    with torch.no_grad():
        mlp.activation_func.alpha_p.fill_(0.3)  # any learned values: the MLP reads its own
        mlp.activation_func.alpha_n.fill_(-0.7)
        x = torch.randn(2, 5, config.hidden_size, generator=torch.Generator().manual_seed(1))
        up, down = mlp.dense_h_to_4h, mlp.dense_4h_to_h
        expected = F.linear(xielu(F.linear(x, up.weight, up.bias), torch.tensor([0.3]), torch.tensor([-0.7])),
                            down.weight, down.bias)
        torch.testing.assert_close(mlp(x), expected, rtol=0, atol=0)
    tokens = tokens_for(config)
    model(tokens[:, :-1], tokens[:, 1:]).mean().backward()
    assert mlp.activation_func.alpha_p.grad.abs().item() > 0 and mlp.activation_func.alpha_n.grad.abs().item() > 0


def _tp2_gradients(rank, world_size, sequence_parallel):
    from gpt.parallel_plan import tensor_parallel_plan
    from parallel.config import ParallelismConfig

    state = initialize("cpu", tensor_parallel_size=2)
    try:
        config = tiny_config(activation="xielu", add_bias_linear=False)
        reference = build_gpt_model(config, SINGLE, seed=11)
        plan = tensor_parallel_plan(state, ParallelismConfig(tensor_model_parallel_size=2,
                                                             sequence_parallel=sequence_parallel))
        ours = build_gpt_model(config, state, seed=11, plan=plan)
        check_gradients_are_tp1_slices(ours, reference, tokens_for(config), state)
        return True
    finally:
        destroy(state)


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_the_scalars_gradients_at_tp2_are_the_tp1_models(sequence_parallel):
    """Each TP rank holds half the ffn columns and the same two scalars; their gradients are summed over the TP
    group, so every rank's equals the TP-1 model's whole gradient (and the ranks' copies stay equal)."""
    assert run_distributed(_tp2_gradients, 2, sequence_parallel, timeout=300) == [True, True]


def test_xielu_flag_and_its_refusals():
    assert parse_config(["--xielu"]).model.mlp.activation == "xielu"
    assert parse_config(["--xielu", "--num-experts", "4"]).model.mlp.activation == "xielu"
    with pytest.raises(ConfigError, match="--xielu .* --swiglu") as error:
        parse_config(["--xielu", "--swiglu"])
    assert "\n" not in str(error.value)
    # MoE under tensor parallelism splits each expert over the TP ranks; the experts' scalars are not summed there
    with pytest.raises(ConfigError, match="--xielu with --num-experts and --tensor-model-parallel-size 2") as error:
        parse_config(["--xielu", "--num-experts", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel"])
    assert "\n" not in str(error.value)
    # and at TP 1 with each expert split over 2 expert-TP ranks (the same unsummed scalars)
    with pytest.raises(ConfigError, match="--tensor-model-parallel-size 1 / --expert-tensor-parallel-size 2") as error:
        parse_config(["--xielu", "--num-experts", "4", "--expert-tensor-parallel-size", "2"])
    assert "\n" not in str(error.value)


def _xielu_experts():
    from gpt.moe.experts import Experts
    from parallel.init import materialize

    experts = materialize(Experts(4, 8, 16, activation=F.gelu, swiglu=False, init_std=0.5, output_init_std=0.5,
                                  bias=True, xielu=True), 11)
    with torch.no_grad():  # each expert its own scalars
        for e, expert in enumerate(experts.children()):
            expert.activation_func.alpha_p.fill_(0.1 * e - 0.2)
            expert.activation_func.alpha_n.fill_(-0.3 * e)
    return experts, torch.randn(10, 8, generator=torch.Generator().manual_seed(3))


def test_each_expert_applies_xielu_with_its_own_scalars_grouped_or_in_a_loop():
    experts, rows = _xielu_experts()
    names = {name for name, _ in experts.named_parameters() if "activation_func" in name}
    assert names == {f"{e}.activation_func.{p}" for e in range(4) for p in ("alpha_p", "alpha_n")}
    tokens_per_expert = torch.tensor([3, 0, 5, 2])
    expected, start = [], 0
    for e, count in enumerate(tokens_per_expert.tolist()):
        expert, chunk = experts.get_submodule(str(e)), rows[start:start + count]
        start += count
        expected.append(F.linear(xielu(F.linear(chunk, expert.dense_h_to_4h.weight, expert.dense_h_to_4h.bias),
                                       torch.tensor([0.1 * e - 0.2]), torch.tensor([-0.3 * e])),
                                 expert.dense_4h_to_h.weight, expert.dense_4h_to_h.bias))
    grad = torch.randn(10, 8, generator=torch.Generator().manual_seed(4))
    results = []
    for forward in (experts.forward_grouped, experts.forward_loop):
        experts.zero_grad()
        output = forward(rows, tokens_per_expert)
        output.backward(grad)
        results.append((output.detach(), [p.grad.clone() for p in experts.parameters()]))
        torch.testing.assert_close(output.detach(), torch.cat(expected).detach(), rtol=1e-6, atol=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert experts.get_submodule("1.activation_func").alpha_p.grad.item() == 0  # no tokens, no gradient
    assert experts.get_submodule("2.activation_func").alpha_p.grad.abs().item() > 0


def test_a_moe_xielu_model_holds_scalars_per_expert_and_shared_expert_and_trains_resumably(corpus_cache_300,
                                                                                         tmp_path):
    config = tiny_config(activation="xielu", num_experts=4, moe_shared_expert_intermediate_size=32)
    model = build_gpt_model(config, SINGLE, seed=3)
    names = {name for name, _ in model.named_parameters() if "activation_func" in name}
    assert {f"blocks.0.mlp.experts.{e}.activation_func.alpha_p" for e in range(4)} <= names
    assert "blocks.0.mlp.shared_experts.activation_func.alpha_n" in names and len(names) == 2 * 2 * 5
    argv = TINY + ["--xielu", "--num-experts", "4", "--moe-router-topk", "2", "--moe-grouped-gemm", "--train-iters",
                   "4", "--lr", "0.01", "--data-cache-dir", corpus_cache_300]
    straight, split, _ = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert [(r["iteration"], r["loss"]) for r in straight] == [(r["iteration"], r["loss"]) for r in split]


def test_a_xielu_run_saved_and_resumed_continues_exactly(corpus_cache_300, tmp_path):
    """The scalars are parameters in the checkpoint (and in the optimizer's state): a run saved at iteration 2
    and resumed logs the straight run's losses (at --lr 0.01 the scalars move, so a resume that lost them, or
    their Adam moments, would log others)."""
    argv = TINY + ["--xielu", "--train-iters", "4", "--lr", "0.01", "--data-cache-dir", corpus_cache_300]
    straight, split, save = straight_and_resumed(argv, tmp_path, exit_interval=2)
    assert [(r["iteration"], r["loss"]) for r in straight] == [(r["iteration"], r["loss"]) for r in split]
    assert len(straight) == 4



def test_the_planners_activation_terms_add_what_xielu_keeps_for_backward():
    """In bf16 autograd keeps XIELU_SAVED_BYTES per element beyond xielu's input (measured here with
    saved_tensors_hooks); gpt/shape.py's block terms add that many bytes per ffn element, split over TP."""
    from gpt.shape import model_shape
    from gpt.xielu import XIELU_SAVED_BYTES

    x = torch.randn(100, 96, dtype=torch.bfloat16, requires_grad=True)
    alphas = [torch.tensor([v], dtype=torch.bfloat16, requires_grad=True) for v in (0.2, -1.0)]
    saved = {}

    def pack(tensor):
        if tensor.data_ptr() != x.data_ptr():
            saved[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        xielu(x, *alphas)
    assert round(sum(saved.values()) / x.numel()) == XIELU_SAVED_BYTES
    plain, with_xielu = (model_shape(tiny_config(ffn_hidden_size=96, **extra), tensor_parallel_size=tp)
                         for extra, tp in (({}, 2), ({"activation": "xielu"}, 2)))
    assert with_xielu.activations.partitioned_bytes_per_token - plain.activations.partitioned_bytes_per_token == \
        XIELU_SAVED_BYTES * 96
    assert with_xielu.activations.replicated_bytes_per_token == plain.activations.replicated_bytes_per_token
