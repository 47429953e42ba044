"""Issue 51 item 3: Megatron-DeepSpeed's per-layer --num-experts list and --mlp-type residual (PR-MoE).

The spec is Megatron-DeepSpeed's megatron/model/transformer.py (get_num_experts_per_layer; ParallelTransformerLayer
building DeepSpeed's MoE with `use_residual=(args.mlp_type == 'residual')`) and DeepSpeed's deepspeed/moe/layer.py
(MoE: `self.mlp = expert`, `self.coefficient = nn.Linear(hidden_size, 2)`, and in forward
`coef = softmax(coefficient(x), dim=-1); output = output * coef[..., 0:1] + output_mlp * coef[..., 1:]`).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from arguments.parser import parse_config
from base.errors import ConfigError
from base.options import setting_values
from gpt.model import build_gpt_model
from gpt.model_config import ModelConfig
from gpt.moe.layer import MoELayer
from parallel.init import materialize
from parallel.sharding import record_of
from parallel.state import ParallelState

SINGLE = ParallelState(device=torch.device("cpu"))


def pr_moe(**changes) -> ModelConfig:
    settings = dict(num_layers=4, hidden_size=16, num_attention_heads=2, seq_length=8, max_position_embeddings=8,
                    vocab_size=64, hidden_dropout=0.0, attention_dropout=0.0, num_experts=(2, 4), moe_gating="deepspeed",
                    topk=2, mlp_type="residual")
    return ModelConfig.of(**{**settings, **changes})


def test_a_num_experts_list_gives_each_expert_interval_th_layer_its_count_as_megatron_deepspeed():
    """get_num_experts_per_layer: layer l (1-based) with l % expert_interval == 0 takes
    num_experts[(l - 1) // expert_interval], the others are dense (1); one count serves every MoE layer. The list
    as a Megatron-DeepSpeed launch types it (nargs='+') reaches the config as one count per MoE layer."""
    config = parse_config(["--num-layers", "8", "--hidden-size", "16", "--num-attention-heads", "2",
                           "--num-experts", "2", "2", "4", "4", "--moe-gating", "deepspeed"]).model
    assert config.experts.num_experts == (2, 2, 4, 4)
    assert config.experts_per_layer() == (1, 2, 1, 2, 1, 4, 1, 4)
    assert config.moe_layers() == (False, True, False, True, False, True, False, True)
    assert pr_moe(num_layers=6, expert_interval=3, num_experts=(2, 4)).experts_per_layer() == (1, 1, 2, 1, 1, 4)
    assert pr_moe(num_layers=6, num_experts=4).experts_per_layer() == (1, 4, 1, 4, 1, 4)
    # a count of 1 in the list is a dense layer there (ParallelTransformerLayer: num_experts <= 1 is ParallelMLP)
    assert pr_moe(num_experts=(1, 4)).moe_layers() == (False, False, False, True)


def test_the_layers_build_each_its_own_number_of_experts_and_count_as_built():
    from training.metrics import active_parameter_count, parameter_count

    config = pr_moe(mlp_type="standard")
    config.validate()
    model = build_gpt_model(config, SINGLE, seed=5)
    names = dict(model.named_parameters())
    assert names["blocks.1.mlp.router.weight"].shape == (2, 16) and names["blocks.3.mlp.router.weight"].shape == (4, 16)
    assert {name.split(".")[4] for name in names if name.startswith("blocks.1.mlp.experts.")} == {"0", "1"}
    assert {name.split(".")[4] for name in names if name.startswith("blocks.3.mlp.experts.")} == {"0", "1", "2", "3"}
    assert "blocks.0.mlp.dense_h_to_4h.weight" in names
    total = sum(p.numel() for p in model.parameters())
    padded = model.word_embeddings.weight.shape[0]
    assert parameter_count(config, padded) == total
    expert = sum(p.numel() for p in model.blocks[3].mlp.experts._modules["0"].parameters())
    assert active_parameter_count(config, padded) == total - (4 - 2) * expert  # top-2 of layer 3's 4


def test_a_residual_moe_mixes_the_experts_and_the_dense_mlp_by_the_softmax_coefficient():
    """DeepSpeed's MoE.forward with use_residual, by hand: the dense MLP (the experts' shape, with its biases:
    Megatron-DeepSpeed's ParallelMLP adds them) and softmax(x W^T + b) over two logits."""
    config = pr_moe(num_experts=4, moe_token_dropping=False)
    layer = materialize(MoELayer(16, config.moe, state=SINGLE, activation=F.gelu, swiglu=False, init_std=0.3,
                                 output_init_std=0.3, bias=True), 3)
    with torch.no_grad():  # a coefficient far from its half-and-half start
        layer.coefficient.bias.copy_(torch.tensor([0.7, -0.4]))
    hidden = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1))
    residual, coefficient = layer.residual_mlp, layer.coefficient
    layer.residual_mlp = None
    torch.manual_seed(0)  # DeepSpeed's top-2 samples its second expert
    routed = layer(hidden)
    layer.residual_mlp = residual
    torch.manual_seed(0)
    mixed = layer(hidden)
    inner = F.gelu(F.linear(hidden, residual.dense_h_to_4h.weight, residual.dense_h_to_4h.bias))
    dense = F.linear(inner, residual.dense_4h_to_h.weight, residual.dense_4h_to_h.bias)
    logits = hidden @ coefficient.weight.T + coefficient.bias
    coef = torch.exp(logits) / torch.exp(logits).sum(dim=-1, keepdim=True)
    # a few fp32 ulps apart (the hand-written softmax and matmuls round in another order): atol 1e-7 is under one
    # ulp of the outputs near 1 (1.2e-7), which some CPUs' kernels missed by one
    torch.testing.assert_close(mixed, routed * coef[..., :1] + dense * coef[..., 1:], rtol=1e-6, atol=1e-6)
    assert not torch.allclose(mixed, routed)
    mixed.sum().backward()
    assert coefficient.weight.grad is not None and residual.dense_4h_to_h.bias.grad is not None


def test_a_residual_moe_model_names_its_dense_mlp_and_coefficient_beside_the_experts():
    config = pr_moe()
    config.validate()
    model = build_gpt_model(config, SINGLE, seed=5)
    names = dict(model.named_parameters())
    for layer in (1, 3):
        assert names[f"blocks.{layer}.mlp.residual_mlp.dense_h_to_4h.weight"].shape == (64, 16)
        assert names[f"blocks.{layer}.mlp.coefficient.weight"].shape == (2, 16)
        assert names[f"blocks.{layer}.mlp.coefficient.bias"].shape == (2,)
        assert not record_of(names[f"blocks.{layer}.mlp.coefficient.weight"]).is_expert
    tokens = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(model(tokens, tokens)).all()


@pytest.mark.parametrize("changes, message", [
    (dict(num_experts=(2, 4, 4)), "--num-experts gives 3 counts: it takes one, or one per MoE layer"),
    (dict(moe_gating="megatron", topk=1, mlp_type="standard"), "a count per MoE layer is Megatron-DeepSpeed's"),
    (dict(mlp_type="pyramid"), "--mlp-type pyramid is not one of standard, residual"),
    (dict(topk=3), "--topk 3 must be between 1 and --num-experts 2"),
])
def test_what_a_per_layer_list_cannot_be_is_refused_in_one_line(changes, message):
    with pytest.raises(ConfigError, match=message) as error:
        pr_moe(**changes).validate()
    assert "\n" not in str(error.value)


def test_a_residual_moe_is_not_tensor_parallel_here():
    with pytest.raises(ConfigError, match="--mlp-type residual with --tensor-model-parallel-size 2"):
        pr_moe().validate_tensor_parallel(2)


def test_each_layers_count_must_divide_over_the_expert_parallel_group_as_deepspeed_asserts():
    """deepspeed/moe/layer.py MoE.__init__: `assert num_experts % ep_size == 0` for each layer's MoE."""
    base = ["--num-layers", "4", "--hidden-size", "16", "--num-attention-heads", "2", "--moe-gating", "deepspeed",
            "--micro-batch-size", "1", "--global-batch-size", "4"]
    assert parse_config(base + ["--num-experts", "2", "4", "--moe-expert-parallel-size", "2"]).model.experts.num_experts == (2, 4)
    with pytest.raises(ConfigError, match="--num-experts 2 is not divisible by --moe-expert-parallel-size 4"):
        parse_config(base + ["--num-experts", "2", "4", "--moe-expert-parallel-size", "4"])  # named as typed


def test_a_recorded_per_layer_list_reads_back_as_the_parsed_tuple():
    """A checkpoint's config is JSON: the list comes back a list, and the resume compares it with the tuple."""
    from checkpoint.resume_model import model_differences
    from checkpoint.schema import recorded_model

    config = pr_moe()
    recorded = setting_values(config)
    recorded["num_experts"] = list(config.experts.num_experts)
    assert recorded_model(recorded).experts.num_experts == (2, 4)
    assert model_differences(recorded, config) == []
    assert model_differences({**recorded, "num_experts": [2, 8]}, config) == [
        "--num-experts 2 4 (the checkpoint's: 2 8)"]
    assert model_differences({**recorded, "mlp_type": "standard"}, config) == [
        "--mlp-type residual (the checkpoint's: standard)"]
