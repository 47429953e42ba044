"""The MoE layer (gpt/moe/, issue 51 item 1) against Megatron-Core's formulas, hand-computed on small examples.

The reference is github:NVIDIA/Megatron-LM at d98e8a64, megatron/core/transformer/moe/:
- moe_utils.switch_load_balancing_loss_func: `sum(probs.sum(0) * tokens_per_expert) * E * coeff / (topk * T * T)`,
  with probs the softmax over all experts (compute_routing_scores_for_aux_loss) and tokens_per_expert the
  counts of a plain top-k of those scores;
- router.TopKRouter._apply_seq_aux_loss: the same per sequence, divided by the batch size;
- moe_utils.z_loss_func: `mean(logsumexp(logits) ** 2) * coeff`;
- moe_utils.get_capacity `ceil(num_tokens / num_experts * capacity_factor)` with num_tokens = T * topk, and
  apply_router_token_dropping: per expert, the `capacity` most probable of its tokens ("probs") or its first
  ("position"); pad_to_capacity makes the map the capacity mask;
- moe_utils.MoEAuxLossAutoScaler: the aux loss's gradient in backward is the main loss's scale;
- moe_utils.get_updated_expert_bias: bias + sign(mean load - load) * rate.
The hand computations below use plain Python arithmetic, not the functions under test.
"""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
import torch
import torch.nn.functional as F

from base.errors import ConfigError
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from gpt.moe.balancing import MoELossTracker
from gpt.moe.dispatcher import LocalDispatcher, choices_of
from gpt.moe.experts import Experts, can_group
from gpt.moe.layer import MoELayer
from gpt.moe.router import TopKRouter, drop_tokens, get_capacity, group_limited_topk
from gpt.moe.settings import MoESettings, moe_layer_pattern
from parallel.init import materialize
from parallel.sharding import record_of
from parallel.state import ParallelState

SINGLE = ParallelState(device=torch.device("cpu"))
LOGITS = [[2.0, 1.0, 0.5, -1.0],
          [0.1, 0.3, 2.5, 0.0],
          [1.5, 1.4, -0.5, 0.2],
          [-1.0, 0.0, 0.3, 1.2],
          [0.7, -0.3, 0.9, 0.8],
          [0.0, 2.0, 1.0, 0.5]]


def softmax_rows(rows):
    out = []
    for row in rows:
        exps = [math.exp(v) for v in row]
        out.append([e / sum(exps) for e in exps])
    return out


def top(row, k):
    return sorted(range(len(row)), key=lambda e: -row[e])[:k]


def router_with(settings: MoESettings, logits: list[list[float]], tracker=None) -> tuple[TopKRouter, torch.Tensor]:
    """A router whose gating returns `logits`: identity hidden states times an identity weight."""
    experts = len(logits[0])
    router = TopKRouter(experts, settings, init_std=0.02, bias=False, state=SINGLE, tracker=tracker)
    router.weight = torch.nn.Parameter(torch.eye(experts))
    return router, torch.tensor(logits, requires_grad=True)


def test_aux_loss_equals_the_switch_formula_by_hand():
    coeff, k = 0.01, 2
    settings = MoESettings(num_experts=4, ffn_hidden_size=8, router_topk=k, aux_loss_coeff=coeff)
    tracker = MoELossTracker()
    tracker.begin_iteration(1.0)
    router, hidden = router_with(settings, LOGITS, tracker)
    router.train()
    router(hidden, seq_length=6, batch=1)
    scores = softmax_rows(LOGITS)
    T, E = len(LOGITS), 4
    counts = [sum(e in top(row, k) for row in scores) for e in range(E)]
    P = [sum(row[e] for row in scores) for e in range(E)]
    expected = sum(P[e] * counts[e] for e in range(E)) * E * coeff / (k * T * T)
    assert tracker.sums()["load_balancing_loss"][0] == pytest.approx(expected / coeff, rel=1e-6)


def test_seq_aux_loss_is_the_per_sequence_loss_averaged_over_the_batch():
    """Megatron's tokens are [sequence, batch]: token s * B + b. Two sequences of 3 tokens."""
    coeff, k, S, B, E = 0.1, 2, 3, 2, 4
    settings = MoESettings(num_experts=E, ffn_hidden_size=8, router_topk=k, aux_loss_coeff=coeff,
                           router_load_balancing_type="seq_aux_loss")
    tracker = MoELossTracker()
    tracker.begin_iteration(1.0)
    router, hidden = router_with(settings, LOGITS, tracker)
    router.train()
    router(hidden, seq_length=S, batch=B)
    scores = softmax_rows(LOGITS)
    total = 0.0
    for b in range(B):
        rows = [scores[s * B + b] for s in range(S)]
        counts = [sum(e in top(row, k) for row in rows) for e in range(E)]
        P = [sum(row[e] for row in rows) for e in range(E)]
        total += sum(P[e] * counts[e] for e in range(E)) * E * coeff / (k * S * S)
    assert tracker.sums()["seq_load_balancing_loss"][0] == pytest.approx(total / B / coeff, rel=1e-6)


def test_z_loss_by_hand():
    settings = MoESettings(num_experts=4, ffn_hidden_size=8, router_topk=2, z_loss_coeff=1e-3,
                           router_load_balancing_type="none")
    tracker = MoELossTracker()
    tracker.begin_iteration(1.0)
    router, hidden = router_with(settings, LOGITS, tracker)
    router.train()
    router(hidden, seq_length=6, batch=1)
    expected = sum(math.log(sum(math.exp(v) for v in row)) ** 2 for row in LOGITS) / len(LOGITS)
    assert tracker.sums()["z_loss"][0] == pytest.approx(expected, rel=1e-6)


def test_the_aux_loss_reaches_the_router_only_through_its_gradient_scaled_as_the_main_loss():
    """MoEAuxLossAutoScaler: the output is unchanged, and backward adds `backward_scale * d(aux)/d(logits)`."""
    coeff, scale = 0.5, 0.25
    settings = MoESettings(num_experts=4, ffn_hidden_size=8, router_topk=2, aux_loss_coeff=coeff)
    tracker = MoELossTracker()
    tracker.begin_iteration(scale)
    router, hidden = router_with(settings, LOGITS, tracker)
    router.train()
    probs, _ = router(hidden, seq_length=6, batch=1)
    weights = torch.arange(24.0).view(6, 4) / 10
    (probs * weights).sum().backward()
    with_aux = hidden.grad.clone()

    plain = dataclasses.replace(settings, aux_loss_coeff=0.0)
    router, hidden = router_with(plain, LOGITS)
    router.train()
    probs, _ = router(hidden, seq_length=6, batch=1)
    assert torch.equal(probs, router_with(settings, LOGITS, tracker)[0](torch.tensor(LOGITS), 6, 1)[0].detach())
    scores = torch.softmax(hidden, dim=-1)
    counts = torch.zeros(4).index_add_(0, scores.topk(2).indices.flatten(), torch.ones(12))
    aux = (scores.sum(0) * counts).sum() * 4 * coeff / (2 * 36)
    ((probs * weights).sum() + scale * aux).backward()
    torch.testing.assert_close(with_aux, hidden.grad, rtol=1e-6, atol=1e-7)


def test_capacity_keeps_the_most_probable_or_the_first_tokens_and_pads_to_capacity():
    """6 tokens, 4 experts, top-1 (pre-softmax), factor 1: capacity = ceil(6 * 1 / 4 * 1) = 2 (get_capacity)."""
    assert get_capacity(6 * 1, 4, 1.0) == 2 and get_capacity(6 * 2, 4, 1.5) == 5
    scores = softmax_rows(LOGITS)
    choice = [top(row, 1)[0] for row in scores]            # experts 0, 2, 0, 3, 2, 1
    assert choice == [0, 2, 0, 3, 2, 1]
    probs = torch.zeros(6, 4)
    routing_map = torch.zeros(6, 4, dtype=torch.bool)
    for t, e in enumerate(choice):
        probs[t, e], routing_map[t, e] = scores[t][e], True
    # capacity 1 (factor 0.5: ceil(6 / 4 * 0.5) = 1): each expert keeps one token
    kept_probs, kept = drop_tokens(probs, routing_map, 1, 0.5, "probs", False)
    by_probs = {e: max((t for t in range(6) if choice[t] == e), key=lambda t: scores[t][e]) for e in set(choice)}
    assert {(t, e) for t, e in kept.nonzero().tolist()} == {(t, e) for e, t in by_probs.items()}
    assert torch.equal(kept_probs, probs * kept)
    _, kept = drop_tokens(probs, routing_map, 1, 0.5, "position", False)
    first = {e: min(t for t in range(6) if choice[t] == e) for e in set(choice)}
    assert {(t, e) for t, e in kept.nonzero().tolist()} == {(t, e) for e, t in first.items()}
    # pad to capacity 2 (factor 1): every expert takes exactly 2 rows; padding rows carry probability 0
    padded_probs, padded = drop_tokens(probs, routing_map, 1, 1.0, "probs", True)
    assert padded.sum(0).tolist() == [2, 2, 2, 2]
    assert torch.equal(padded_probs, probs * padded)
    assert all(padded[t, e] for t, e in enumerate(choice) if sum(c == e for c in choice) <= 2)


def test_group_limited_routing_chooses_inside_the_best_groups():
    """4 experts in 2 groups, top-2 in 1 group: a group scores the sum of its top topk/group_topk = 2 experts."""
    scores = torch.tensor([[0.4, 0.1, 0.3, 0.25], [0.5, 0.0, 0.3, 0.3]])
    _, indices = group_limited_topk(scores, topk=2, num_groups=2, group_topk=1)
    # token 0: groups (0.5, 0.55) -> group 1 = experts 2, 3; token 1: (0.5, 0.6) -> experts 2, 3
    assert sorted(indices[0].tolist()) == [2, 3] and sorted(indices[1].tolist()) == [2, 3]


def test_expert_bias_moves_toward_the_mean_load_and_only_chooses():
    settings = MoESettings(num_experts=4, ffn_hidden_size=8, router_topk=1, router_score_function="sigmoid",
                           router_enable_expert_bias=True, router_bias_update_rate=0.1,
                           router_load_balancing_type="none")
    router, hidden = router_with(settings, LOGITS)
    router.train()
    _, routing_map = router(hidden, seq_length=6, batch=1)
    loads = routing_map.sum(0).tolist()                              # sigmoid's top-1 = the logits' argmax
    assert loads == [sum(top(row, 1) == [e] for row in LOGITS) for e in range(4)]
    router.update_expert_bias()
    mean = sum(loads) / 4
    assert router.expert_bias.tolist() == pytest.approx([0.1 * (mean > n) - 0.1 * (mean < n) for n in loads])
    probs, routing_map = router(hidden, seq_length=6, batch=1)
    chosen = [top([1 / (1 + math.exp(-v)) + b for v, b in zip(row, router.expert_bias.tolist())], 1)[0]
              for row in LOGITS]
    assert routing_map.nonzero()[:, 1].tolist() == chosen
    # the weight of a top-1 sigmoid route is its unbiased score
    assert probs.sum(1).tolist() == pytest.approx([1 / (1 + math.exp(-LOGITS[t][e])) for t, e in enumerate(chosen)])


def experts_and_rows(swiglu: bool, bias: bool):
    experts = Experts(4, 8, 16, activation=F.gelu, swiglu=swiglu, init_std=0.5, output_init_std=0.5, bias=bias)
    experts = materialize(experts, 11)
    for parameter in experts.parameters():
        if parameter.dim() == 1:
            torch.nn.init.normal_(parameter)
    return experts, torch.randn(10, 8, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_grouped_matmul_and_loop_give_the_same_outputs_and_gradients(swiglu, bias):
    experts, rows = experts_and_rows(swiglu, bias)
    tokens_per_expert = torch.tensor([3, 0, 5, 2])   # an expert with no tokens
    assert can_group(rows, list(experts.children()))
    grad = torch.randn(10, 8, generator=torch.Generator().manual_seed(4))
    results = []
    for forward in (experts.forward_grouped, experts.forward_loop):
        experts.zero_grad()
        inputs = rows.clone().requires_grad_()
        output = forward(inputs, tokens_per_expert)
        output.backward(grad)
        results.append((output.detach(), inputs.grad, [p.grad.clone() for p in experts.parameters()]))
    (grouped, grouped_input, grouped_params), (loop, loop_input, loop_params) = results
    # to rounding: the kernels' summation orders differ (and a bias is added after the grouped product, inside
    # F.linear's addmm in the loop)
    tolerance = dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grouped, loop, **tolerance)
    torch.testing.assert_close(grouped_input, loop_input, **tolerance)
    for a, b in zip(grouped_params, loop_params):
        torch.testing.assert_close(a, b, **tolerance)


def test_the_local_dispatcher_combines_each_tokens_choices_weighted():
    """out[t] = sum_k p[t, k] * expert_{i[t, k]}(x[t]); an index of -1 (a dropped choice) adds nothing."""
    experts, hidden = experts_and_rows(False, True)
    probs = torch.tensor([[0.6, 0.4], [1.0, 0.0], [0.3, 0.7], [0.5, 0.5], [0.9, 0.1], [0.2, 0.8], [0.1, 0.9],
                          [0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])
    indices = torch.tensor([[0, 2], [3, -1], [2, 1], [0, 3], [1, 0], [3, 2], [0, 1], [2, 3], [1, 3], [2, -1]])
    dispatcher = LocalDispatcher(4)
    rows, tokens_per_expert = dispatcher.dispatch(hidden, probs, indices)
    assert tokens_per_expert == [4, 4, 5, 5]  # read back once, a list on the host (gpt/moe/expert_rows.py)
    output = dispatcher.combine(experts(rows, tokens_per_expert))
    expected = torch.zeros_like(hidden)
    for t in range(10):
        for k in range(2):
            e = int(indices[t, k])
            if e >= 0:
                expert = experts._modules[str(e)]
                inner = F.gelu(F.linear(hidden[t], expert.dense_h_to_4h.weight, expert.dense_h_to_4h.bias))
                expected[t] += probs[t, k] * F.linear(inner, expert.dense_4h_to_h.weight, expert.dense_4h_to_h.bias)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-6)


def test_choices_of_a_padded_map_widens_past_k_with_empty_slots():
    routing_map = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    probs = torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    choice_probs, indices = choices_of(probs, routing_map, width=3)
    assert indices.tolist() == [[0, 2, -1], [-1, -1, -1], [0, 1, 2]]
    assert torch.equal(choice_probs, torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [0.2, 0.3, 0.5]]))


def test_layer_freq_reads_megatrons_int_and_list_expression():
    """megatron/training/arguments.py moe_freq_type: N -> layer i is MoE when i % N == 0; a list expression ->
    one 0/1 per layer."""
    assert moe_layer_pattern("2", 4) == (True, False, True, False)
    assert moe_layer_pattern("([1]*3+[0]*1)*2", 8) == (True, True, True, False) * 2
    with pytest.raises(ConfigError, match="one 0 \\(dense\\) or 1 \\(MoE\\) per layer"):
        moe_layer_pattern("[1,0]", 4)
    with pytest.raises(ConfigError, match="list expression"):
        moe_layer_pattern("[__import__('os')]", 1)
    # round 5: a repeat of 2e9 took 34 s and gigabytes to be refused; its length is read from the expression
    started = time.perf_counter()
    with pytest.raises(ConfigError, match="gives 2000000000 values; it needs one 0 \\(dense\\) or 1"):
        moe_layer_pattern("([0,1]*1000000000)", 2)
    assert time.perf_counter() - started < 1
    with pytest.raises(ConfigError, match="holds 2; it needs one"):
        moe_layer_pattern("[2]*4", 4)


def tiny_moe(**moe) -> ModelConfig:
    return ModelConfig.of(num_layers=2, hidden_size=16, num_attention_heads=2, seq_length=8, max_position_embeddings=8,
                       vocab_size=64, hidden_dropout=0.0, attention_dropout=0.0, num_experts=4, **moe)


def test_a_moe_gpt_names_each_experts_weights_and_keeps_dense_layers_between():
    config = tiny_moe(moe_layer_freq="([0]+[1]*1)", moe_shared_expert_intermediate_size=24,
                      moe_shared_expert_gate=True, moe_ffn_hidden_size=32)
    config.validate()
    model = build_gpt_model(config, SINGLE, seed=5)
    names = dict(model.named_parameters())
    assert "blocks.0.mlp.dense_h_to_4h.weight" in names                  # layer 0 dense
    assert isinstance(model.blocks[1].mlp, MoELayer)
    for e in range(4):
        assert names[f"blocks.1.mlp.experts.{e}.dense_h_to_4h.weight"].shape == (32, 16)
    assert names["blocks.1.mlp.router.weight"].shape == (4, 16)
    assert names["blocks.1.mlp.shared_experts.dense_h_to_4h.weight"].shape == (24, 16)
    assert names["blocks.1.mlp.shared_experts.gate_weight"].shape == (1, 16)
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(model(tokens, tokens)).all()


def test_a_shared_expert_with_gate_adds_sigmoid_gated_output():
    """SharedExpertMLP.forward: output * sigmoid(F.linear(x, gate_weight)), added to the routed output."""
    config = tiny_moe(moe_shared_expert_intermediate_size=24, moe_shared_expert_gate=True)
    layer = materialize(MoELayer(16, config.moe, state=SINGLE, activation=F.gelu, swiglu=False, init_std=0.3,
                                 output_init_std=0.3, bias=False), 3)
    hidden = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    shared = layer.shared_experts
    layer.shared_experts = None
    routed = layer(hidden)
    layer.shared_experts = shared
    inner = F.gelu(F.linear(hidden, shared.dense_h_to_4h.weight))
    expected = routed + F.linear(inner, shared.dense_4h_to_h.weight) * torch.sigmoid(F.linear(hidden, shared.gate_weight))
    torch.testing.assert_close(layer(hidden), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("moe, message", [
    (dict(moe_router_topk=1), "--moe-router-pre-softmax"),
    (dict(moe_router_load_balancing_type="sinkhorn", moe_aux_loss_coeff=0.1), "sinkhorn"),
    (dict(moe_router_enable_expert_bias=True), "sigmoid"),
    (dict(moe_pad_expert_input_to_capacity=True), "--moe-expert-capacity-factor"),
    (dict(moe_router_num_groups=3, moe_router_group_topk=1), "--moe-router-num-groups 3 must divide"),
    # issue 79 (round 5's): group_limited_topk takes topk / group_topk of each group's 2 experts; before, a traceback
    (dict(moe_router_num_groups=2, moe_router_group_topk=1, moe_router_topk=4), "takes 4 experts of each, more than"),
    (dict(moe_router_topk=5), "between 1 and --num-experts 4"),
])
def test_megatrons_moe_assertions_are_one_line_refusals(moe, message):
    with pytest.raises(ConfigError, match=message) as error:
        tiny_moe(**moe).validate()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("swiglu", [False, True])
def test_experts_split_over_two_expert_tensor_parallel_ranks_sum_to_the_whole_experts(swiglu):
    """Megatron-Core's experts under expert tensor parallelism (experts.py: linear_fc1 column-parallel, linear_fc2
    row-parallel over the expert TP group, no reduction of their own: the dispatcher sums the partial outputs):
    each rank's slices are the whole experts' (initialized by global index, as the dense TP layers'), the two
    partial outputs sum to the whole output (the output bias added by the first rank only), and each rank's
    weight gradients are the slices of the whole experts' (the output bias's in full on the first rank: summed
    over the ETP group in a run, here a group of one)."""
    from parallel.state import ExpertParallel

    def build(parallel=None):
        return Experts(4, 16, 32, activation=F.gelu, swiglu=swiglu, init_std=0.5, output_init_std=0.5, bias=True,
                       grouped=False, tensor_parallel=parallel)

    whole = materialize(build(), 3)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in whole.named_parameters():
            if name.endswith("bias"):
                param.normal_()
    rows = torch.randn(10, 16)
    tokens_per_expert = torch.tensor([3, 0, 5, 2])
    whole_out = whole.forward_loop(rows, tokens_per_expert)
    whole_out.square().sum().backward()
    grads = {name: param.grad for name, param in whole.named_parameters()}
    partial = []
    for rank in (0, 1):
        half = materialize(build(ExpertParallel(tensor_size=2, tensor_rank=rank)), 3)
        params = dict(half.named_parameters())
        with torch.no_grad():
            for name, param in whole.named_parameters():
                dim = params[name].sharding.split_dim
                expected = param if dim is None else param.chunk(2, dim=dim)[rank]
                assert torch.equal(params[name], expected) or name.endswith("bias"), name
                params[name].copy_(expected)
        out = half.forward_loop(rows, tokens_per_expert)
        partial.append(out)
        # the gradient of the summed output reaches every rank's partial output whole (the combine's backward)
        out.backward(2 * whole_out.detach())
        for name, param in params.items():
            dim = record_of(param).split_dim
            if dim is not None:
                torch.testing.assert_close(param.grad, grads[name].chunk(2, dim=dim)[rank], rtol=1e-5, atol=1e-5)
            elif name.endswith("dense_4h_to_h.bias"):
                torch.testing.assert_close(param.grad, grads[name] if rank == 0 else torch.zeros_like(param), rtol=1e-5,
                                           atol=1e-5)
    torch.testing.assert_close(partial[0] + partial[1], whole_out, rtol=1e-5, atol=1e-5)


def test_parameter_counts_total_and_active_and_flops_from_the_active_experts():
    """Total: every parameter of the built model. Active: k of each MoE layer's experts. FLOPs as Megatron-LM's
    num_floating_point_operations (megatron/training/training.py) counts an MoE layer: 2 x 2 x h x ffn per routed
    expert per token (4 t h ffn k in its moe_layer_flops, SwiGLU x 3/2), the shared expert's likewise, the router
    not counted; a dense layer 2 x 2 x h x 4h; attention 2 x 4h^2 + 4 s h; forward x 3 for training."""
    from training.metrics import active_parameter_count, flops_per_iteration, parameter_count

    h, s, ffn, shared, k, vocab = 16, 8, 32, 24, 2, 128
    config = tiny_moe(moe_layer_freq="([0]+[1]*1)", moe_ffn_hidden_size=ffn,
                      moe_shared_expert_intermediate_size=shared, moe_router_topk=k)
    model = build_gpt_model(config, SINGLE, seed=5)
    total = sum(p.numel() for p in model.parameters())
    assert parameter_count(config, vocab) == total
    expert = sum(p.numel() for p in model.blocks[1].mlp.experts._modules["0"].parameters())
    assert expert == 2 * h * ffn + ffn + h
    assert active_parameter_count(config, vocab) == total - (4 - k) * expert
    attention = 2 * (h * 3 * h + h * h) + 4 * s * h
    dense_block = attention + 2 * 2 * h * 4 * h
    moe_block = attention + k * 2 * 2 * h * ffn + 2 * 2 * h * shared
    logits = 2 * h * vocab
    tokens = 3 * s
    assert flops_per_iteration(config, 3, padded_vocab_size=vocab) == 3 * tokens * (dense_block + moe_block + logits)


def test_global_aux_loss_averages_the_token_counts_over_the_iterations_micro_batches():
    """TopKRouter._apply_global_aux_loss: tokens_per_expert summed into a running total, divided by the
    micro-batches so far (ga_steps), with this micro-batch's scores; reset at the next iteration
    (reset_global_aux_loss_tracker)."""
    coeff, k, E = 0.1, 2, 4
    settings = MoESettings(num_experts=E, ffn_hidden_size=8, router_topk=k, aux_loss_coeff=coeff,
                           router_load_balancing_type="global_aux_loss")
    tracker = MoELossTracker()
    tracker.begin_iteration(1.0)
    router, _ = router_with(settings, LOGITS, tracker)
    router.train()
    first, second = LOGITS[:3], LOGITS[3:]
    for logits in (first, second):
        router(torch.tensor(logits, requires_grad=True), seq_length=3, batch=1)

    def counts(rows):
        return [sum(e in top(row, k) for row in softmax_rows(rows)) for e in range(E)]

    def loss(rows, tokens_per_expert):
        P = [sum(row[e] for row in softmax_rows(rows)) for e in range(E)]
        return sum(P[e] * tokens_per_expert[e] for e in range(E)) * E / (k * 3 * 3)

    averaged = [(a + b) / 2 for a, b in zip(counts(first), counts(second))]
    assert tracker.sums()["global_load_balancing_loss"][0] == pytest.approx(
        loss(first, counts(first)) + loss(second, averaged), rel=1e-6)
    tracker.begin_iteration(1.0)  # a new iteration starts the running counts afresh
    router(torch.tensor(second, requires_grad=True), seq_length=3, batch=1)
    assert tracker.sums()["global_load_balancing_loss"][0] == pytest.approx(loss(second, counts(second)), rel=1e-6)


def test_sinkhorn_routing_chooses_on_the_balanced_costs_and_weighs_by_the_softmax():
    """TopKRouter.sinkhorn_load_balancing (k > 1): experts from top-k of moe_utils.sinkhorn(logits) - exp(logits)
    rescaled until every row sums to 1/T and every column to 1/E - weights from the softmax of the raw logits."""
    settings = MoESettings(num_experts=4, ffn_hidden_size=8, router_topk=2, router_load_balancing_type="sinkhorn")
    router, hidden = router_with(settings, LOGITS)
    router.train()
    probs, routing_map = router(hidden, seq_length=6, batch=1)
    cost = [[math.exp(v) for v in row] for row in LOGITS]
    d0, d1 = [1.0] * 6, [1.0] * 4
    for _ in range(200):   # the fixed point Megatron's loop reaches to 1e-4
        d0 = [1 / 6 / (sum(d1[e] * cost[t][e] for e in range(4)) + 1e-8) for t in range(6)]
        d1 = [1 / 4 / (sum(d0[t] * cost[t][e] for t in range(6)) + 1e-8) for e in range(4)]
    balanced = [[d1[e] * cost[t][e] * d0[t] for e in range(4)] for t in range(6)]
    assert [sorted(row.nonzero().flatten().tolist()) for row in routing_map] == [sorted(top(row, 2)) for row in balanced]
    softmax = softmax_rows(LOGITS)
    for t in range(6):
        for e in range(4):
            assert probs[t, e].item() == pytest.approx(softmax[t][e] if routing_map[t, e] else 0.0, rel=1e-6)


def test_operands_the_grouped_kernel_does_not_take_run_as_the_loop():
    """fp64 rows (F.grouped_mm takes fp32, bf16, fp16) and a row width not a multiple of 16 bytes: the loop."""
    experts, rows = experts_and_rows(False, True)
    tokens_per_expert = torch.tensor([3, 0, 5, 2])
    double = experts.double()
    assert not can_group(rows.double(), list(double.children()))
    torch.testing.assert_close(double(rows.double(), tokens_per_expert),
                               double.forward_loop(rows.double(), tokens_per_expert), rtol=0, atol=0)
    narrow = Experts(4, 6, 16, activation=F.gelu, swiglu=False, init_std=0.5, output_init_std=0.5, bias=False)
    assert not can_group(torch.zeros(3, 6), list(narrow.children()))  # 6 x 4 bytes


def test_an_moe_layer_built_under_tp_without_sequence_parallel_is_refused_in_one_line():
    """The MoE build's own refusal (gpt/moe/layer.py build_moe_layer), for a model built in code: the launch's
    flags are refused earlier (arguments/config.py), as Megatron-Core's MoELayer refuses TP without SP."""
    from base.errors import ConfigError
    from gpt.model import TransformerBlock
    from gpt.parallel_plan import TensorParallelPlan
    from parallel.state import virtual_state
    from tests.gpt.test_llama_blocks import tiny_config

    config = tiny_config(num_experts=4, moe_layer_freq=1)
    state = virtual_state(2, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="add --sequence-parallel") as refused:
        TransformerBlock(config, TensorParallelPlan(state, False), None)
    assert "\n" not in str(refused.value)
    TransformerBlock(config, TensorParallelPlan(state, True), None)  # with SP it builds
