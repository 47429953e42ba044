"""Megatron-LM's small model features (issue 48, round 3, item 3): --squared-relu, --rotary-interleaved,
--attention-output-gate and --apply-wd-to-qk-layernorm, each against Megatron-Core's formula written out
here by hand from its source (github:NVIDIA/Megatron-LM at d98e8a64):

- megatron/core/activations.py, squared_relu: `torch.pow(F.relu(x), 2)`; megatron/training/argument_utils.py
  core_transformer_config_from_args: `--squared-relu` sets `activation_func = squared_relu` and asserts
  `not args.swiglu` (gated_linear_unit stays False: the plain h -> ffn -> h MLP).
- megatron/core/models/common/embeddings/rotary_pos_embedding.py, RotaryEmbedding.get_emb: with
  rotary_interleaved, `emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0],
  -1)`; rope_utils.py, _rotate_half: `x1 = x[:, :, :, ::2]; x2 = x[:, :, :, 1::2]; x_new = torch.stack((-x2, x1),
  dim=-1)`, and _apply_rotary_pos_emb_bshd: `t * cos + _rotate_half(t) * sin` over the first rot_dim dims.
- megatron/core/transformer/attention.py: SelfAttention.__init__ (`linear_qkv_out_dim += kv_channels *
  num_attention_heads` with attention_output_gate), get_query_key_value_tensors (each group's
  `(2 * np/ng + 2) * hn` split into query np/ng * hn, gate np/ng * hn, key hn, value hn; the gate reshaped to
  [sq, b, np, hn]) and Attention._apply_output_gate (`x * torch.sigmoid(gate.float())`, cast back), applied to
  the core attention's output before linear_proj.
- megatron/core/optimizer/__init__.py, get_standard_config_overrides: wd_mult 0 for `(len(param.shape) == 1
  or name.endswith(".bias"))`, and with apply_wd_to_qk_layernorm `and not ("q_layernorm." in name or
  "k_layernorm." in name)`.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from arguments.parser import parse_config
from base.errors import ConfigError
from base.options import replace_settings
from gpt.model import build_gpt_model
from gpt.rotary import apply_rotary, inverse_frequencies, rotary_angles
from gpt.shape import model_shape
from parallel.state import ParallelState, virtual_state
from tests.distributed import run_distributed
from tests.gpt.test_llama_blocks import tiny_config, tokens_for, tp2_difference_from_tp1
from tests.reliability_helpers import metrics_records, train
from training.build import build
from training.run_settings import resolve_run_settings
from zero.flat_buffer import ParamKind

SINGLE = ParallelState(device=torch.device("cpu"))


# ---- --squared-relu ---------------------------------------------------------------------------------------

def megatron_squared_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.pow(F.relu(x), 2)  # megatron/core/activations.py squared_relu


def test_squared_relu_mlp_is_megatrons_squared_relu_between_the_two_linears():
    model = build_gpt_model(tiny_config(activation="squared_relu"), SINGLE, seed=3)
    mlp = model.blocks[0].mlp
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0))
    up, down = mlp.dense_h_to_4h, mlp.dense_4h_to_h
    expected = F.linear(megatron_squared_relu(F.linear(x, up.weight, up.bias)), down.weight, down.bias)
    torch.testing.assert_close(mlp(x), expected, rtol=0, atol=1e-6)
    gelu = build_gpt_model(tiny_config(), SINGLE, seed=3).blocks[0].mlp
    assert not torch.allclose(gelu(x), expected)  # the setting reached the MLP


def test_squared_relu_flag_is_megatrons_spelling_and_refused_beside_swiglu():
    assert parse_config(["--squared-relu"]).model.mlp.activation == "squared_relu"
    with pytest.raises(ConfigError, match="--squared-relu .* --swiglu"):
        parse_config(["--squared-relu", "--swiglu"])


def test_squared_relu_exports_as_transformers_relu2_gpt2():
    """transformers' GPT2MLP takes ACT2FN[activation_function]; "relu2" is ReLUSquaredActivation."""
    from transformers import GPT2LMHeadModel

    from checkpoint.hf.folders import hf_config, to_hf_state_dict

    config = tiny_config(activation="squared_relu", layernorm_epsilon=1e-5)
    ours = build_gpt_model(config, SINGLE, seed=5).eval()
    theirs = GPT2LMHeadModel(hf_config(config)).eval()
    theirs.load_state_dict(to_hf_state_dict(ours.state_dict(), config))
    tokens = tokens_for(config)[:, :-1]
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens).logits, rtol=0, atol=1e-5)


# ---- --rotary-interleaved ---------------------------------------------------------------------------------

def megatron_interleaved_rope(t: torch.Tensor, rotary_dim: int, base: float) -> torch.Tensor:
    """t: [batch, heads, seq, head_dim] (positions 0..seq-1). RotaryEmbedding.get_emb's interleaved emb and
    _apply_rotary_pos_emb_bshd with _rotate_half(rotary_interleaved=True)."""
    seq = t.shape[2]
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
    rotating, passing = t[..., :rotary_dim], t[..., rotary_dim:]
    x1, x2 = rotating[:, :, :, ::2], rotating[:, :, :, 1::2]
    x_new = torch.stack((-x2, x1), dim=-1)
    rotated_half = x_new.view(x_new.shape[0], x_new.shape[1], x_new.shape[2], -1)
    return torch.cat((rotating * torch.cos(emb) + rotated_half * torch.sin(emb), passing), dim=-1)


@pytest.mark.parametrize("rotary_dim", [16, 8])  # --rotary-percent 1 and 0.5 of a 16-dim head
def test_interleaved_rotary_equals_megatron_cores(rotary_dim):
    x = torch.randn(2, 3, 7, 16, generator=torch.Generator().manual_seed(2))
    cos, sin = rotary_angles(7, rotary_dim, 10000.0, x.device, interleaved=True)
    ours = apply_rotary(x, cos, sin, interleaved=True)
    torch.testing.assert_close(ours, megatron_interleaved_rope(x, rotary_dim, 10000.0), rtol=0, atol=1e-6)
    halves = apply_rotary(x, *rotary_angles(7, rotary_dim, 10000.0, x.device))
    assert not torch.allclose(ours, halves)
    assert torch.equal(inverse_frequencies(rotary_dim, 10000.0, x.device), 1.0 / (10000.0 ** (
        torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)))


# ---- the attention block: --rotary-interleaved and --attention-output-gate in place -------------------------

def megatron_attention(attention, x: torch.Tensor, heads: int, groups: int, gate: bool,
                       interleaved_rope: bool, controls: bool = False) -> torch.Tensor:
    """Megatron-Core's SelfAttention forward on our weights (fp32, no dropout, causal), batch-first.
    `controls`: the same with the gate read but not applied, and rotary in halves where it is interleaved
    (a computation the settings must change)."""
    batch, seq, _ = x.shape
    hn = attention.layout.head_dim
    per_group = heads // groups
    mixed = F.linear(x, attention.query_key_value.weight, attention.query_key_value.bias)
    mixed = mixed.view(batch, seq, groups, ((2 if gate else 1) * per_group + 2) * hn)
    split = [per_group * hn] + ([per_group * hn] if gate else []) + [hn, hn]
    parts = torch.split(mixed, split, dim=3)
    query, key, value = parts[0], parts[-2], parts[-1]
    query = query.reshape(batch, seq, heads, hn).transpose(1, 2)
    key, value = key.transpose(1, 2), value.transpose(1, 2)
    if interleaved_rope and controls:
        query, key = (apply_rotary(t, *rotary_angles(seq, hn, 10000.0, x.device)) for t in (query, key))
    elif interleaved_rope:
        query, key = (megatron_interleaved_rope(t, hn, 10000.0) for t in (query, key))
    key, value = key.repeat_interleave(per_group, dim=1), value.repeat_interleave(per_group, dim=1)
    scores = query @ key.transpose(-1, -2) / math.sqrt(hn)
    scores = scores.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    context = (scores.softmax(-1) @ value).transpose(1, 2).reshape(batch, seq, heads * hn)
    if gate and not controls:  # Attention._apply_output_gate
        gate_heads = parts[1].reshape(batch, seq, heads, hn).contiguous().view(*context.shape)
        context = (context * torch.sigmoid(gate_heads.float())).to(context.dtype)
    return F.linear(context, attention.dense.weight, attention.dense.bias)


@pytest.mark.parametrize("groups", [4, 2])
@pytest.mark.parametrize("gate,interleaved", [(True, False), (False, True), (True, True)])
def test_attention_equals_megatron_cores_with_the_output_gate_and_interleaved_rotary(groups, gate, interleaved):
    rope = dict(position_embedding_type="rope", rotary_interleaved=True) if interleaved else {}
    config = tiny_config(num_query_groups=groups, attention_output_gate=gate, **rope)
    attention = build_gpt_model(config, SINGLE, seed=9).blocks[0].attention
    assert attention.query_key_value.weight.shape[0] == ((2 if gate else 1) * 4 + 2 * groups) * 16
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(4))
    expected = megatron_attention(attention, x, 4, groups, gate, interleaved)
    torch.testing.assert_close(attention(x), expected, rtol=0, atol=1e-6)
    # Without the gate applied, and with halves for interleaved, the same weights compute something else.
    assert not torch.allclose(megatron_attention(attention, x, 4, groups, gate, interleaved, controls=True),
                              expected)


GATED = dict(num_query_groups=2, attention_output_gate=True, normalization="RMSNorm", swiglu=True,
             position_embedding_type="rope", add_bias_linear=False, add_qkv_bias=True)


def test_output_gate_at_tp2_equals_tp1_and_each_rank_holds_its_heads_gates():
    """The gate rows are column-parallel with the rest of QKV (whole groups per rank): each TP 2 rank's
    losses equal the TP 1 model's and its gradients are its row slices of the TP 1 model's."""
    assert all(difference <= 1e-6 for difference in run_distributed(tp2_difference_from_tp1, 2, GATED, timeout=300))


def test_output_gate_adds_the_gate_projection_to_the_counted_parameters_and_flops():
    """Megatron-LM's num_floating_point_operations (megatron/training/training.py) adds
    `gate_projection_size = query_projection_size` to the QKV projection: 2 x h x (heads x head_dim) FLOPs per
    token forward, h x (heads x head_dim) weights (and as many biases) per layer."""
    plain, gated = model_shape(tiny_config()), model_shape(tiny_config(attention_output_gate=True))
    assert gated.block_forward_flops_per_token() - plain.block_forward_flops_per_token() == 2 * 64 * 64
    assert gated.parameters_per_block - plain.parameters_per_block == 64 * 64 + 64
    squared = model_shape(tiny_config(activation="squared_relu"))  # no matmul changes
    assert squared.block_forward_flops_per_token() == plain.block_forward_flops_per_token()


def test_the_planners_dry_run_counts_the_gate_as_megatron_counts_it(capsys):
    """The dry run's parameters and FLOPs (from the built meta model) grow by Megatron's gate term: per layer
    h x (heads x head_dim) weights plus their biases, and 3 (forward and backward) x 2 (FMA) x h x
    gate_projection_size FLOPs per token (num_floating_point_operations); --squared-relu changes neither."""
    import json

    from planner import plan as planner_cli

    layers, hidden, batch, seq = 2, 64, 4, 32
    argv = ["dry-run", "--world-size", "2", "--gpu-memory", "16GB", "--json", "--tensor-model-parallel-size", "2",
            "--micro-batch-size", "2", "--global-batch-size", str(batch), "--num-layers", str(layers),
            "--hidden-size", str(hidden), "--num-attention-heads", "4", "--seq-length", str(seq),
            "--max-position-embeddings", str(seq)]
    records = {}
    for name, extra in (("plain", []), ("gate", ["--attention-output-gate"]), ("squared", ["--squared-relu"])):
        assert planner_cli.main([*argv, *extra]) == 0
        records[name] = json.loads(capsys.readouterr().out)
    plain, gate, squared = records["plain"], records["gate"], records["squared"]
    assert gate["parameters_total"] - plain["parameters_total"] == layers * (hidden * hidden + hidden)
    assert gate["flops_per_iteration"] - plain["flops_per_iteration"] == 3 * 2 * hidden * hidden * batch * seq * layers
    assert (squared["parameters_total"], squared["flops_per_iteration"]) == \
        (plain["parameters_total"], plain["flops_per_iteration"])


def test_hf_export_refuses_the_gate_and_interleaved_rotary_in_one_line():
    from checkpoint.hf.folders import check_convertible

    # the gate is Qwen3-Next's gated attention: exported as that family, whose other blocks this model lacks
    with pytest.raises(ConfigError, match="as a Qwen3NextForCausalLM this one would need .*--qk-layernorm"):
        check_convertible(tiny_config(attention_output_gate=True), "the Hugging Face export")
    llama = dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope")
    with pytest.raises(ConfigError, match="would need no --rotary-interleaved"):
        check_convertible(tiny_config(rotary_interleaved=True, **llama), "the Hugging Face export")
    check_convertible(tiny_config(**llama), "the Hugging Face export")


# ---- --apply-wd-to-qk-layernorm ---------------------------------------------------------------------------

def megatron_decays(name: str, param: torch.Tensor, apply_wd_to_qk_layernorm: bool) -> bool:
    """get_standard_config_overrides' no-decay predicate, negated."""
    no_decay = len(param.shape) == 1 or name.endswith(".bias")
    if apply_wd_to_qk_layernorm:
        no_decay = no_decay and not ("q_layernorm." in name or "k_layernorm." in name)
    return not no_decay


LR, WEIGHT_DECAY = 1e-2, 0.5
SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "2", "--seed", "7",
         "--qk-layernorm", "--weight-decay", str(WEIGHT_DECAY), "--clip-grad", "0", "--hidden-dropout", "0",
         "--attention-dropout", "0"]


@pytest.mark.parametrize("flag", [[], ["--apply-wd-to-qk-layernorm"],
                                  ["--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"]])
def test_one_step_decays_exactly_the_parameters_megatron_decays(flag):
    """With every gradient zero, AdamW's step is its decoupled decay alone: a decayed parameter becomes
    p x (1 - lr x wd), any other stays. The built trainer's ZeRO optimizer (training/build.py) is stepped."""
    apply = bool(flag)
    settings = resolve_run_settings(parse_config([*SMALL, *flag]), 128, 1, 1, "cpu")
    assert settings.config.optimizer.apply_wd_to_qk_layernorm == apply
    built = build(settings, virtual_state(1, 1, 0, "cpu"), dropout_rng=False, torch_compile=False)
    model, zero = built.model, built.zero
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(0))
    zero.reducer.zero_grad()
    (model(tokens[:, :-1], tokens[:, 1:]).sum() * 0).backward()
    zero.reducer.finish_grad_sync()
    for group in zero.optimizer.param_groups:
        group["lr"] = LR
    zero.optimizer.step()
    decayed = []
    for name, param in model.named_parameters():
        expected = megatron_decays(name, param, apply)
        assert ParamKind.of(param).weight_decay == expected, name
        factor = 1 - LR * WEIGHT_DECAY if expected else 1.0
        torch.testing.assert_close(param.detach(), before[name] * factor, rtol=1e-6, atol=0, msg=name)
        decayed += [name] if expected else []
    qk_norms = {name for name in before if "q_layernorm." in name or "k_layernorm." in name}
    assert len(qk_norms) == 8 and (qk_norms <= set(decayed)) == apply


def test_layernorm_1p_stores_each_gain_less_one_in_every_norm():
    """Megatron's --apply-layernorm-1p (TransformerConfig.layernorm_zero_centered_gamma) stores gamma - 1 in every
    norm, the q/k norms included (megatron/core/models/gpt/gpt_layer_specs.py: q_layernorm=qk_norm, a TENorm built
    with zero_centered_gamma=config.layernorm_zero_centered_gamma in megatron/core/extensions/transformer_engine.py):
    the weights start at 0, so --apply-wd-to-qk-layernorm decays the q/k gains toward 1, as there (gpt/norms.py)."""
    config = parse_config(["--apply-layernorm-1p", "--qk-layernorm", "--apply-wd-to-qk-layernorm",
                           "--normalization", "RMSNorm", "--num-layers", "1"])
    model = build_gpt_model(dataclasses.replace(config.model, vocab_size=64), SINGLE, seed=0)
    gains = {name: param for name, param in model.named_parameters() if "layernorm" in name and name.endswith("weight")}
    assert len(gains) == 5 and all(torch.equal(param, torch.zeros_like(param)) for param in gains.values()), gains
    plain = build_gpt_model(replace_settings(config.model, vocab_size=64, apply_layernorm_1p=False), SINGLE, seed=0)
    tokens = torch.arange(16).view(1, 16) % 64
    with torch.no_grad():  # a gain of 1 + 0 computes what a gain of 1 does
        torch.testing.assert_close(model.eval()(tokens), plain.eval()(tokens), rtol=0, atol=0)


# ---- each flag as a launch: parses, and a tiny model trains 2 iterations -----------------------------------

LAUNCHES = {
    "squared-relu": ["--squared-relu"],
    "rotary-interleaved": ["--position-embedding-type", "rope", "--rotary-interleaved"],
    "attention-output-gate": ["--attention-output-gate"],
    "apply-wd-to-qk-layernorm": ["--qk-layernorm", "--apply-wd-to-qk-layernorm"],
}


@pytest.mark.parametrize("name", LAUNCHES)
def test_each_flag_trains_a_tiny_model_for_two_iterations(corpus_cache, tmp_path, name):
    outcome = train(corpus_cache, tmp_path, "--train-iters", "2", *LAUNCHES[name])
    assert outcome.code == 0, outcome.err[-3000:]
    losses = [record["loss"] for record in metrics_records(tmp_path / "metrics.jsonl") if "loss" in record]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
