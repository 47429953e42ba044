"""A resume with other block settings than the checkpoint's is refused in one line naming both values
(checkpoint/resume_model.py). Before, a different --rotary-base, --rotary-percent, --use-rope-scaling or
--norm-epsilon changed no parameter shape, so the load's shape check let the resume through and it trained
another function from the saved weights; --finetune may still change them (a new run from the weights)."""


import pytest

from base.errors import ConfigError
from base.options import replace_settings, setting_values
from checkpoint.resume_model import check_resume_model, model_differences
from gpt.model_config import ModelConfig
from tests.reliability_helpers import train

LLAMA = ModelConfig.of(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", num_query_groups=2,
                    untie_embeddings_and_output_weights=True, add_bias_linear=False)


def saved(model: ModelConfig, **drop) -> dict:
    values = setting_values(model)  # as a checkpoint records it (PretrainConfig.to_dict)
    for name in drop:
        values.pop(name)
    return values


@pytest.mark.parametrize("change, named", [
    ({"rotary_base": 5e5}, "--rotary-base 500000.0 (the checkpoint's: 10000.0)"),
    ({"rotary_percent": 0.5}, "--rotary-percent 0.5 (the checkpoint's: 1.0)"),
    ({"use_rope_scaling": True}, "--use-rope-scaling on (the checkpoint's: off)"),
    ({"normalization": "LayerNorm"}, "--normalization LayerNorm (the checkpoint's: RMSNorm)"),
    ({"swiglu": False}, "--swiglu off (the checkpoint's: on)"),
    ({"num_query_groups": 4}, "--num-query-groups 4 (the checkpoint's: 2)"),
    ({"add_bias_linear": True}, "--disable-bias-linear off (the checkpoint's: on)"),
    ({"layernorm_epsilon": 1e-6}, "--layernorm-epsilon 1e-06 (the checkpoint's: 1e-05)"),
    # Megatron-LM's --rotary-interleaved and --squared-relu (issue 48) change no shape either
    ({"rotary_interleaved": True}, "--rotary-interleaved on (the checkpoint's: off)"),
    ({"activation": "squared_relu"}, "--activation squared_relu (the checkpoint's: gelu_tanh)"),
    ({"attention_output_gate": True}, "--attention-output-gate on (the checkpoint's: off)"),
    # these change shapes, and Megatron-LM's check_checkpoint_args compares them first (megatron/training/
    # checkpointing.py): one line at start-up, not a list of every parameter's shape (issue 79)
    ({"num_layers": 8}, "--num-layers 8 (the checkpoint's: 4)"),
    ({"hidden_size": 64}, "--hidden-size 64 (the checkpoint's: 128)"),
])
def test_each_block_setting_that_differs_is_named_with_both_values(change, named):
    with pytest.raises(ConfigError) as error:
        check_resume_model({"config": {"model": saved(LLAMA)}}, replace_settings(LLAMA, **change), "ckpt/iter_2")
    assert str(error.value).count(named) == 1 and "\n" not in str(error.value) and "--finetune" in str(error.value)


def test_multi_latent_attentions_settings_are_compared_where_it_is_on():
    """--multi-latent-attention (gpt/mla.py): its YaRN settings change no shape; rope_type None is its yarn; a dense
    attention's model ignores them, and an MLA model reads --rotary-base with learned positions too."""
    mla = replace_settings(LLAMA, multi_latent_attention=True, q_lora_rank=32, rotary_scaling_factor=40.0,
                           mscale_all_dim=1.0)
    for change, named in (({"rotary_scaling_factor": 1.0}, "--rotary-scaling-factor 1.0 (the checkpoint's: 40.0)"),
                          ({"mscale_all_dim": 0.0}, "--mscale-all-dim 0.0 (the checkpoint's: 1.0)"),
                          ({"rope_type": "rope"}, "--rope-type rope (the checkpoint's: yarn)"),
                          ({"multi_latent_attention": False}, "--multi-latent-attention off (the checkpoint's: on)")):
        assert model_differences(saved(mla), replace_settings(mla, **change)) == [named]
    assert model_differences(saved(mla), replace_settings(mla, rope_type="yarn")) == []
    assert model_differences(saved(LLAMA), replace_settings(LLAMA, rotary_scaling_factor=40.0)) == []
    learned = replace_settings(mla, position_embedding_type="learned_absolute")
    assert model_differences(saved(learned), replace_settings(learned, rotary_base=5e5)) == [
        "--rotary-base 500000.0 (the checkpoint's: 10000.0)"]


def test_equal_meanings_and_settings_that_do_nothing_are_not_differences():
    assert model_differences(saved(LLAMA), LLAMA) == []
    # None is one key/value group per head
    mha = replace_settings(LLAMA, num_query_groups=None)
    assert model_differences(saved(replace_settings(mha, num_query_groups=4)), mha) == []
    # a rotary setting of a model without rotary positions, a scaling factor without scaling
    gpt2 = ModelConfig()
    assert model_differences(saved(gpt2), replace_settings(gpt2, rotary_base=5e5)) == []
    assert model_differences(saved(gpt2), replace_settings(gpt2, rotary_interleaved=True)) == []
    assert model_differences(saved(LLAMA), replace_settings(LLAMA, rope_scaling_factor=4.0)) == []
    # a checkpoint saved before the block settings existed was GPT-2's
    assert model_differences(saved(gpt2, swiglu=None, normalization=None), gpt2) == []
    assert model_differences(saved(gpt2, swiglu=None), replace_settings(gpt2, swiglu=True)) == [
        "--swiglu on (the checkpoint's: off)"]


def test_a_launch_resuming_with_another_rotary_base_is_refused_before_any_work(corpus_cache, tmp_path):
    llama = ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
             "--disable-bias-linear", "--save", tmp_path / "ckpt", "--save-interval", "2"]
    assert train(corpus_cache, tmp_path, *llama).code == 0
    resumed = train(corpus_cache, tmp_path, *llama, "--load", tmp_path / "ckpt", "--train-iters", "3",
                    "--rotary-base", "500000")
    resumed.one_error_line("--rotary-base 500000.0 (the checkpoint's: 10000.0)")
    # a fine-tune starts a new run from the weights, and may change it
    (tmp_path / "ft").mkdir()
    finetuned = train(corpus_cache, tmp_path / "ft", *llama[:-4], "--load", tmp_path / "ckpt", "--finetune",
                      "--rotary-base", "500000")
    assert finetuned.code == 0, finetuned.err[-2000:]


def test_the_moe_layers_structure_and_routing_are_compared_and_their_coefficients_are_not():
    """Issue 51: a different --moe-router-topk or score function changes no parameter shape but another function
    from the same experts; --num-experts and --moe-layer-freq other parameters. The balancing coefficients and
    the capacity are training settings, as Megatron lets a resume change them; a dense model reads none."""
    moe = replace_settings(LLAMA, num_experts=4, moe_router_topk=2)
    for change, named in (({"moe_router_topk": 1}, "--moe-router-topk 1 (the checkpoint's: 2)"),
                          ({"moe_router_score_function": "sigmoid"},
                           "--moe-router-score-function sigmoid (the checkpoint's: softmax)"),
                          ({"num_experts": 8}, "--num-experts 8 (the checkpoint's: 4)"),
                          ({"moe_layer_freq": 2}, "--moe-layer-freq 2 (the checkpoint's: 1)"),
                          ({"moe_gating": "deepspeed"}, "--moe-gating deepspeed (the checkpoint's: megatron)")):
        assert model_differences(saved(moe), replace_settings(moe, **change)) == [named]
    assert model_differences(saved(moe), replace_settings(moe, moe_aux_loss_coeff=0.1,
                                                             moe_expert_capacity_factor=1.5)) == []
    assert model_differences(saved(LLAMA), replace_settings(LLAMA, moe_router_topk=1)) == []
