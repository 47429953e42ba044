"""The declared tensor- and sequence-parallel plan (gpt/parallel_plan.py), read as a table.

The spec is Megatron-Core's layer spec (megatron/core/models/gpt/gpt_layer_specs.py, get_gpt_layer_local_spec:
linear_qkv and linear_fc1 ColumnParallelLinear, linear_proj and linear_fc2 RowParallelLinear; GPTModel's
VocabParallelEmbedding and column-parallel output_layer) and torchtitan's models/llama3/parallelize.py apply_tp,
whose layer_plan names each module with its ColwiseParallel / RowwiseParallel / SequenceParallel style.
"""

from __future__ import annotations

import pytest
from torch import nn

from arguments.parser import parse_config
from base.options import replace_settings
from gpt.model import GPTModel
from gpt.model_config import ModelConfig
from gpt.norms import HeadNorm
from gpt.parallel_plan import (
    LAYER_STYLES,
    SEQUENCE_REGIONS,
    STYLE_CLASSES,
    TensorParallelPlan,
    tensor_parallel_plan,
)
from parallel.config import ParallelismConfig
from parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from parallel.state import virtual_state
from training.build import build
from training.run_settings import resolve_run_settings

TP = 2
GPT2 = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=16, max_position_embeddings=16,
                   vocab_size=96)
LLAMA = replace_settings(GPT2, normalization="RMSNorm", swiglu=True, position_embedding_type="rope",
                            num_query_groups=2, untie_embeddings_and_output_weights=True, add_bias_linear=False,
                            qk_layernorm=True)
# Gemma's blocks: norms on each sublayer's input and output (--sublayer-norms input_and_output)
MODELS = {"gpt2": GPT2, "llama": LLAMA, "gemma": replace_settings(LLAMA, sublayer_norms="input_and_output")}
GDN = replace_settings(LLAMA, hybrid_layer_pattern="G-*-", linear_num_key_heads=2, linear_num_value_heads=2,
                       linear_key_head_dim=8, linear_value_head_dim=8)
OUTPUT_NORMS = {"attention_output_layernorm", "mlp_output_layernorm"}
# MoE layers with shared experts (TP-parallel as the MLP, gpt/moe/layer.py): built under sequence parallelism only,
# as Megatron-Core's MoE layer requires it with TP
MOE_MODELS = {name: replace_settings(config, num_experts=4, moe_shared_expert_intermediate_size=64)
              for name, config in MODELS.items()}
PARALLEL_LAYERS = (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)


def _model(config: ModelConfig, sequence_parallel: bool) -> GPTModel:
    state = virtual_state(TP, TP)
    return GPTModel(config, state, plan=tensor_parallel_plan(
        state, ParallelismConfig(tensor_model_parallel_size=TP, sequence_parallel=sequence_parallel)))


def _plan_name(name: str) -> str:
    """A module's name as the plan names it: a block's relative to the block (an MTP layer's block too), an MTP
    layer's own `mtp.<name>` (gpt/mtp.py)."""
    parts = name.split(".")
    if parts[0] == "mtp_layers":
        return ".".join(parts[3:]) if parts[2] == "transformer_layer" else "mtp." + ".".join(parts[2:])
    return ".".join(parts[2:]) if parts[0] == "blocks" else name


@pytest.mark.parametrize("sequence_parallel", (False, True))
def test_every_tensor_parallel_module_and_linear_is_named_in_the_plan_with_its_style(sequence_parallel):
    named = set()
    # with an MTP layer (gpt/mtp.py): its eh_proj and its block's linears are the plan's too
    # and multi-latent attention's projections (gpt/mla.py), with and without a query LoRA rank, and Gated
    # DeltaNet's (gpt/gated_delta_net.py)
    mla = dict(multi_latent_attention=True, num_query_groups=None, kv_lora_rank=16, qk_head_dim=8,
               qk_pos_emb_head_dim=4, v_head_dim=8)
    # and Mamba-2's out_proj (gpt/mamba.py), an `M` block's mixer
    mamba = replace_settings(GPT2, hybrid_layer_pattern="M-*-", mamba_head_dim=8, mamba_num_groups=2,
                             mamba_state_dim=8)
    for config in (*MODELS.values(), replace_settings(LLAMA, mtp_num_layers=1), mamba,
                   replace_settings(LLAMA, **mla), replace_settings(LLAMA, **mla, q_lora_rank=24), GDN,
                   *(MOE_MODELS.values() if sequence_parallel else ())):
        for name, module in _model(config, sequence_parallel).named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding, *PARALLEL_LAYERS)) and name != "position_embeddings":
                style = LAYER_STYLES[_plan_name(name)]  # a KeyError is a layer built outside the table
                assert type(module) is STYLE_CLASSES[style], name
                named.add(_plan_name(name))
                if isinstance(module, (ColumnParallelLinear, RowParallelLinear)) and name != "output_layer":
                    assert module.sequence_parallel is sequence_parallel, name
    # and the table names nothing the models do not build
    assert named == {name for name in LAYER_STYLES if sequence_parallel or "shared_experts" not in name}


@pytest.mark.parametrize("name", MODELS)
def test_the_split_regions_are_the_norms_and_dropouts_the_plan_lists(name):
    """Megatron-Core marks the norms of the split regions `sequence_parallel` (their gradients are summed over
    the TP group in finalize_model_grads) and forks the rank's private stream for their dropout."""
    plain, split = _model(MODELS[name], False), _model(MODELS[name], True)
    regions = {region for region in SEQUENCE_REGIONS if region.endswith("layernorm")}
    if MODELS[name].norms.sublayer_norms == "input":
        regions -= OUTPUT_NORMS
    for model, on in ((plain, False), (split, True)):
        marked = {_plan_name(module_name) for module_name, module in model.named_modules()
                  if getattr(getattr(module, "weight", None), "sequence_parallel", False)
                  and not isinstance(module, (HeadNorm, *PARALLEL_LAYERS))}
        assert marked == (regions if on else set())
        assert model.sequence_parallel is on and model.plan.sequence_parallel is on
    assert split.plan.dropout_rng("hidden_dropout", rng="stream") == "stream"
    assert plain.plan.dropout_rng("hidden_dropout", rng="stream") is None


def test_the_plan_refuses_a_module_or_region_it_does_not_declare():
    plan = TensorParallelPlan(virtual_state(TP, TP), sequence_parallel=True)
    with pytest.raises(ValueError, match="not in the tensor-parallel plan"):
        plan.linear("mlp.fc3", 8, 8, init_std=0.02, bias=False)
    with pytest.raises(ValueError, match="not a region"):
        plan.splits("attention.core")
    with pytest.raises(ValueError, match="not a linear"):
        plan.linear("word_embeddings", 8, 8, init_std=0.02, bias=False)


def test_sequence_parallel_at_tp_1_splits_nothing():
    """Megatron-LM accepts --sequence-parallel at TP 1 and splits nothing (its validate_args turns it off)."""
    plan = tensor_parallel_plan(virtual_state(1, 1), ParallelismConfig(sequence_parallel=True))
    assert not plan.sequence_parallel
    assert tensor_parallel_plan(virtual_state(TP, TP), None).sequence_parallel is False


def test_the_build_decides_the_plan_from_the_parallel_section():
    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
             "--tensor-model-parallel-size", "2", "--sequence-parallel"]
    config = parse_config(flags)
    assert config.parallel.tensor_model_parallel_size == 2 and config.parallel.sequence_parallel
    settings = resolve_run_settings(config, 128, TP, 1, "cuda")
    built = build(settings, virtual_state(TP, TP, 0, "meta"), dropout_rng=False, torch_compile=False)
    assert built.model.plan.sequence_parallel and built.model.blocks[0].input_layernorm.weight.sequence_parallel
