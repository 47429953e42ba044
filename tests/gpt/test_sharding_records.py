"""Every parameter of a built model carries its sharding record (parallel/sharding.py, issue 82 item 4): a layer
writes it where it makes the parameter, a whole one too, and GPTModel refuses a parameter without one in one line
naming it and the module class that made it. Before, such a parameter was read as whole: GPT-OSS's attention sinks
once loaded whole into a TP half that way."""

import pytest
import torch
from torch import nn

import gpt.mlp
from arguments.parser import parse_config
from base.errors import ConfigError
from gpt.model import GPTModel
from gpt.parallel_plan import tensor_parallel_plan
from parallel.state import ParallelState, virtual_state

SMALL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--vocab-size", "64"]
MOE = ["--num-experts", "4", "--moe-router-topk", "2"]

# What relied on the silent whole record before: LayerNorm's and RMSNorm's gains and biases (blocks, final, MTP),
# a row-parallel layer's bias, learned positions, per-head q/k norms, MLA's down projections and latent norms,
# the router's weight and bias, a shared expert's gate, PR-MoE's coefficient, xIELU's scalars.
BUILDS = {
    "gpt2": [],
    "llama": ["--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--qk-layernorm",
              "--untie-embeddings-and-output-weights", "--disable-bias-linear"],
    "layernorm-1p": ["--apply-layernorm-1p"],
    "moe": [*MOE, "--moe-shared-expert-intermediate-size", "32", "--moe-shared-expert-gate", "--add-bias-linear",
            "--mtp-num-layers", "1"],
    "moe xielu": [*MOE, "--xielu", "--moe-shared-expert-intermediate-size", "32"],
    "mla": ["--multi-latent-attention", "--q-lora-rank", "16", "--kv-lora-rank", "8", "--qk-layernorm",
            "--normalization", "RMSNorm", "--position-embedding-type", "rope"],
    "sinks": ["--softmax-type", "learnable"],
}


@pytest.mark.parametrize("tensor_parallel", [1, 2])
@pytest.mark.parametrize("name", list(BUILDS))
def test_every_parameter_of_a_built_model_has_its_own_record(name, tensor_parallel):
    flags = [*SMALL, *BUILDS[name]]
    if tensor_parallel > 1:
        flags += ["--tensor-model-parallel-size", str(tensor_parallel), "--sequence-parallel"]
        if "--xielu" in flags:  # no model to build: each expert's scalars would need their gradients summed over TP
            with pytest.raises(ConfigError, match="--xielu"):
                parse_config(flags)
            return
    config = parse_config(flags)
    state = virtual_state(tensor_parallel, tensor_parallel, rank=tensor_parallel - 1)
    model = GPTModel(config.model, state, plan=tensor_parallel_plan(state, config.parallel))  # checks every record
    for param_name, param in model.named_parameters():
        assert param.sharding.local_shape == tuple(param.shape), param_name


def test_a_parameter_without_a_record_is_refused_in_one_line_naming_it_and_its_module(monkeypatch):
    made = gpt.mlp.MLP.__init__

    def with_a_stray(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.stray = nn.Parameter(torch.empty(3, device="meta"))  # as the sinks were: made, never recorded

    monkeypatch.setattr(gpt.mlp.MLP, "__init__", with_a_stray)
    with pytest.raises(ConfigError) as error:
        GPTModel(parse_config(SMALL).model, ParallelState(device=torch.device("meta")))
    line = str(error.value)
    assert "\n" not in line
    assert "blocks.0.mlp.stray (made by gpt.mlp.MLP) has no sharding record" in line


def test_an_experts_xielu_scalars_are_held_as_its_weights_under_expert_parallelism():
    """They were read as dense (the silent whole record), so ZeRO over the whole data-parallel group would have held
    one expert-parallel rank's experts' scalars beside another's; now they are the expert data-parallel group's."""
    config = parse_config([*SMALL, *BUILDS["moe xielu"], "--expert-model-parallel-size", "2"])
    state = virtual_state(2, 1, rank=1, expert_model_parallel_size=2)
    params = dict(GPTModel(config.model, state, plan=tensor_parallel_plan(state, config.parallel)).named_parameters())
    experts = {name: param for name, param in params.items() if ".mlp.experts." in name}
    assert experts and all(param.sharding.is_expert for param in experts.values())
    assert {"blocks.0.mlp.experts.2.activation_func.alpha_p", "blocks.0.mlp.experts.3.activation_func.alpha_n"} \
        <= set(experts)
    assert not params["blocks.0.mlp.shared_experts.activation_func.alpha_p"].sharding.is_expert
