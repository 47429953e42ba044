"""The model's shape (gpt/shape.py) against independent counts over the model itself: for every preset,
metrics' parameter count against the meta model's own parameters, and metrics' FLOPs per token against
torch's FlopCounterMode over a meta-device forward.

The relation checked is Megatron's accounting: NVIDIA/Megatron-LM megatron/training/training.py,
`num_floating_point_operations`, whose comment on `expansion_factor = 3 * 2 * 2` reads "3x: Each GEMM in
the model needs to be performed 3 times (forward pass, backward wgrad [weight gradient], backward dgrad
[data gradient])" and "2x: A GEMM of a m*n tensor with a n*k tensor requires 2mnk floating-point
operations" (from the appendix of Narayanan et al. 2021, arXiv 2104.04473). So: a multiply-add is 2
FLOPs, as FlopCounterMode counts a matmul (2 m n k); only matmuls count (biases, norms, softmax, GeLU do
not); attention's scores and context are counted over the whole s x s square (its `seq_length /
hidden_size` term: not halved for the causal mask); an iteration is 3 x the forward, and full activation
recompute adds one more forward of the blocks (4 x the blocks' forward + 3 x the logits')."""

import dataclasses
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

from base.options import replace_settings, setting_names
from gpt.model import GPTModel
from gpt.model_config import ModelConfig
from gpt.shape import AttentionShape, LinearShape, model_shape
from parallel.state import ParallelState
from training.metrics import flops_per_iteration, forward_flops_per_token, parameter_count
from zero.memory import LayerActivationTerms, predict_saved_activation_bytes

PRESETS = sorted((Path(__file__).parents[2] / "configs" / "models").rglob("*.yaml"))
GPT2_VOCAB = 50257  # the presets name GPT-2's tokenizer; the tiny preset's embedded one is smaller
LLAMA_VOCAB = {"llama2-7b": 32000, "llama3-8b": 128256}  # their tokenizers' (the presets' comments)
META = ParallelState(device=torch.device("meta"))


def preset_model(path: Path) -> ModelConfig:
    values = yaml.safe_load(path.read_text())
    config = ModelConfig.of(**{key: value for key, value in values.items() if key in setting_names(ModelConfig)})
    return replace_settings(config, vocab_size=config.vocab_size or LLAMA_VOCAB.get(path.stem, GPT2_VOCAB),
                            hidden_dropout=0.0, attention_dropout=0.0)


def counted_forward_flops(config: ModelConfig) -> int:
    """FlopCounterMode's count of one sequence's forward through a meta-device GPTModel (no memory, no
    arithmetic). On the meta device scaled_dot_product_attention runs as its math decomposition, whose two
    batched matmuls (scores and context, over the whole s x s square) the counter sees as aten.bmm: the
    attention is counted, not added by hand (the assertion on `bmm` below says so if that ever changes)."""
    model = GPTModel(config, META).eval()
    tokens = torch.zeros(1, config.seq_length, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        model(tokens)
    counts = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    assert counts.get("aten.bmm", 0) > 0, f"attention's matmuls were not counted: {counts}"
    return counter.get_total_flops()


# Each Llama-shaped option alone, then all together (issue 37), at a size whose meta forward is quick.
SMALL = dict(num_layers=3, hidden_size=64, num_attention_heads=4, seq_length=32, max_position_embeddings=32,
             vocab_size=1000, hidden_dropout=0.0, attention_dropout=0.0)
LLAMA_VARIANTS = {
    "gqa": dict(num_query_groups=2),
    "mqa": dict(num_query_groups=1),
    "swiglu": dict(swiglu=True),
    "untied": dict(untie_embeddings_and_output_weights=True),
    "no-bias": dict(add_bias_linear=False),
    "rmsnorm-rope": dict(normalization="RMSNorm", position_embedding_type="rope"),
    "llama": dict(normalization="RMSNorm", swiglu=True, position_embedding_type="rope", num_query_groups=2,
                  untie_embeddings_and_output_weights=True, add_bias_linear=False),
    "qk-layernorm-qkv-bias": dict(qk_layernorm=True, add_bias_linear=False, add_qkv_bias=True),
}


@pytest.mark.parametrize("path", [path for path in PRESETS if preset_model(path).moe is None],
                         ids=lambda path: str(path.relative_to(path.parents[1])))
def test_metrics_equal_independent_counts_over_the_meta_model(path):
    """Every dense preset (an MoE preset's FLOPs follow its router's draws on the meta model; tests/gpt/test_moe.py
    counts its experts)."""
    assert_counts_equal_the_meta_models(preset_model(path))


@pytest.mark.parametrize("options", LLAMA_VARIANTS.values(), ids=LLAMA_VARIANTS.keys())
def test_llama_shaped_metrics_equal_independent_counts_over_the_meta_model(options):
    assert_counts_equal_the_meta_models(ModelConfig.of(**SMALL, **options))


def assert_counts_equal_the_meta_models(config: ModelConfig) -> None:
    padded = config.padded_vocab_size()
    # Parameters: the whole meta model's own, a tied output layer once (it is the embedding's weight).
    assert parameter_count(config, padded) == sum(p.numel() for p in GPTModel(config, META).parameters())

    # FLOPs: a meta forward costs ~0.1 s per block under the counter, so one and two blocks are counted
    # and the full depth is what lies outside the blocks + num_layers x one block (GPTModel's blocks are
    # identical; the two counts must differ by exactly one block's).
    one, two = (counted_forward_flops(dataclasses.replace(config, num_layers=n)) for n in (1, 2))
    per_block, outside = two - one, 2 * one - two
    counted = outside + config.num_layers * per_block
    blocks, logits = forward_flops_per_token(config, padded)
    tokens = config.seq_length  # one sequence
    assert (blocks + logits) * tokens == counted
    assert flops_per_iteration(config, 1, padded_vocab_size=padded) == 3 * counted
    assert flops_per_iteration(config, 1, activation_recompute=True, padded_vocab_size=padded) == \
        3 * counted + config.num_layers * per_block


def test_a_model_option_that_changes_the_block_changes_every_count():
    # An ffn size other than 4h: the hand-written GPT-2 activation estimate (24h inside TP regions) no longer
    # holds; the shape read from the model gives QKV 3h + context h + 2 x ffn, each 2 bytes.
    config = ModelConfig.of(num_layers=3, hidden_size=64, num_attention_heads=4, seq_length=32,
                         max_position_embeddings=32, vocab_size=1000, ffn_hidden_size=96)
    shape = model_shape(config)
    assert shape.activations == LayerActivationTerms(replicated_bytes_per_token=10 * 64,
                                                     partitioned_bytes_per_token=2 * (3 * 64 + 64 + 2 * 96),
                                                     bytes_per_attention_score=5, attention_heads=4)
    assert parameter_count(config) == sum(p.numel() for p in GPTModel(config, META).parameters())
    with_shape = predict_saved_activation_bytes(3, 32, 2, 64, 4, 2, 1, checkpoint_num_layers=None,
                                                partitioned=False, layer=shape.activations)
    gpt2_block = predict_saved_activation_bytes(3, 32, 2, 64, 4, 2, 1, checkpoint_num_layers=None, partitioned=False)
    assert with_shape["per_layer_without_recompute"] == 32 * 2 * (10 * 64 + 2 * (4 * 64 + 2 * 96) + 5 * 4 * 32)
    assert with_shape != gpt2_block


@pytest.mark.parametrize("path", [path for path in PRESETS if path.parent.name == "models"
                                  and path.stem.startswith(("gpt2", "tiny"))], ids=lambda path: path.stem)
def test_gpt2_presets_have_korthikantis_activation_terms(path):
    # Korthikanti et al. 2022, section 4.1: 34sbh + 5as^2b bytes per block, 24sbh of it inside TP regions.
    config = preset_model(path)
    for tp in (1, 2, 4):
        assert model_shape(config, tp).activations == \
            LayerActivationTerms.korthikanti_gpt(config.hidden_size, config.num_attention_heads)


def test_one_tp_rank_holds_its_slice_and_the_counts_stay_the_models():
    config = ModelConfig.of(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16,
                         max_position_embeddings=16, vocab_size=1000)
    whole, halves = model_shape(config, 1), model_shape(config, 2)
    assert halves.block_matmuls == (LinearShape("attention.query_key_value", 64, 96), AttentionShape(2, 16),
                                    LinearShape("attention.dense", 32, 64), LinearShape("mlp.dense_h_to_4h", 64, 128),
                                    LinearShape("mlp.dense_4h_to_h", 128, 64))
    padded = config.padded_vocab_size(2)
    assert halves.output_matmul(padded) == LinearShape("output", 64, padded // 2)
    assert halves.parameter_count(padded) == whole.parameter_count(padded)
    assert halves.block_forward_flops_per_token() == whole.block_forward_flops_per_token()
    assert halves.logits_forward_flops_per_token(padded) == whole.logits_forward_flops_per_token(padded)


def test_the_shape_is_built_once_per_model_options_and_tp_size():
    config = ModelConfig.of(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16,
                         max_position_embeddings=16, vocab_size=1000)
    first = model_shape(config)
    deeper = model_shape(dataclasses.replace(config, num_layers=40, vocab_size=7))
    assert deeper.num_layers == 40 and deeper.block_matmuls is first.block_matmuls  # the same build
    assert model_shape(config, 2).block_matmuls is not first.block_matmuls


MLA_SIZES = dict(multi_latent_attention=True, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=32,
                 position_embedding_type="rope")


@pytest.mark.parametrize("pattern", ["*-+-*-+-", "+-*-*-*-", "*-+-*-+-/+-"])
def test_a_pattern_mixing_attention_and_mla_counts_each_layers_own_mixer(pattern):
    """`*` and `+` blocks in one model: the one-block probe is an MLA block, the attention layers add what their
    mixer differs by (gpt/shape.py MixerDifference), so the counts are the meta model's own, and its forward FLOPs
    the counter's over the whole model (the MTP pattern: parameters, its MTP layer a `+-` block)."""
    config = ModelConfig.of(**{**SMALL, "num_layers": 4}, **MLA_SIZES, hybrid_layer_pattern=pattern,
                            mtp_num_layers=pattern.count("/"))
    padded = config.padded_vocab_size()
    assert parameter_count(config, padded) == sum(p.numel() for p in GPTModel(config, META).parameters())
    all_mla = ModelConfig.of(**{**SMALL, "num_layers": 4}, **MLA_SIZES, mtp_num_layers=pattern.count("/"))
    assert parameter_count(config, padded) != parameter_count(all_mla, padded)
    if "/" not in pattern:
        blocks, logits = forward_flops_per_token(config, padded)
        assert (blocks + logits) * config.seq_length == counted_forward_flops(config)
