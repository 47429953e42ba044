"""The Llama block options as settings (issue 37): Megatron-LM's and Megatron-DeepSpeed's spellings land in
the same ModelConfig fields, and the combinations their own code reads differently are refused in one
line naming the flag and the fix."""

import pytest

from arguments.parser import parse_config
from base.errors import ConfigError

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4"]


def model(*argv):
    return parse_config([*TINY, *argv]).model


def blocks(config) -> tuple:
    """What the blocks are built from: the trunk's linears and output, and the sections."""
    return (config.add_bias_linear, config.output.untie_embeddings_and_output_weights, config.norms, config.mlp,
            config.positions, config.attention)


def test_megatron_lm_and_megatron_deepspeed_spellings_are_the_same_settings():
    megatron_lm = model("--normalization", "RMSNorm", "--position-embedding-type", "rope", "--rotary-base", "500000",
                        "--group-query-attention", "--num-query-groups", "2")
    megatron_deepspeed = model("--normalization", "rmsnorm", "--use-rotary-position-embeddings",
                               "--no-position-embedding", "--rotary-position-embeddings-theta", "500000",
                               "--num-key-value-heads", "2")
    assert blocks(megatron_lm) == blocks(megatron_deepspeed)
    assert (megatron_lm.norms.normalization, megatron_lm.positions.position_embedding_type, megatron_lm.positions.rotary_base,
            megatron_lm.attention.num_query_groups) == ("RMSNorm", "rope", 500000.0, 2)
    # Megatron-LM: --group-query-attention alone is its default of one group (multi-query attention)
    assert model("--group-query-attention").attention.num_query_groups == 1
    # Megatron-DeepSpeed: --no-position-embedding without rotary positions leaves none
    assert model("--no-position-embedding").positions.position_embedding_type == "none"
    # Megatron-LM's Llama launches give --position-embedding-type rope --no-position-embedding: rope
    assert model("--position-embedding-type", "rope", "--no-position-embedding").positions.position_embedding_type == "rope"
    assert model("--disable-bias-linear").add_bias_linear is False
    # A Megatron launch (model flags, no preset) takes Megatron-LM's defaults, but its --num-query-groups 1
    # only holds under --group-query-attention: without the switch attention stays multi-head.
    assert model().attention.num_query_groups is None and model().attention.query_groups(4) == 4


def test_rotary_positions_without_no_position_embedding_are_rotary_positions_alone():
    # deepspeedai/Megatron-DeepSpeed f4157bea megatron/arguments.py, validate_args lines 314-317: "When rotary
    # position embeddings is used, set add_position_embedding to false to turn off absolute position
    # embedding. if args.use_rotary_position_embeddings: args.add_position_embedding = False"; so
    # megatron/model/language_model.py's Embedding (line 163-164, `if self.add_position_embedding:
    # self.position_embeddings = ...`) builds no learned positions, and TransformerLanguageModel (lines
    # 424-437, 539-551) rotates q and k in megatron/model/transformer.py (lines 824-829). NVIDIA/Megatron-LM
    # megatron/training/arguments.py validate_args, "Legacy RoPE arguments": `if
    # args.use_rotary_position_embeddings: args.position_embedding_type = 'rope'`.
    alone = model("--use-rotary-position-embeddings", "--rotary-percent", "0.25")
    assert (alone.positions.position_embedding_type, alone.positions.rotary_percent) == ("rope", 0.25)
    assert blocks(alone) == blocks(model("--position-embedding-type", "rope", "--rotary-percent", "0.25"))
    with_off = model("--use-rotary-position-embeddings", "--no-position-embedding", "--rotary-percent", "0.25")
    assert blocks(with_off) == blocks(alone)


def test_swiglu_takes_megatrons_default_ffn_size_unless_given():
    # megatron/training/arguments.py, validate_args: int((4 * hidden_size * 2 / 3) / 64) * 64
    assert model("--swiglu").ffn_size == int((4 * 64 * 2 / 3) / 64) * 64 == 128
    assert model("--swiglu", "--ffn-hidden-size", "96").ffn_size == 96
    assert model().ffn_size == 4 * 64


@pytest.mark.parametrize("argv, words", [
    (["--group-query-attention", "--num-query-groups", "3"], "--num-query-groups 3 does not divide"),
    # named as typed; fewer groups than TP ranks are taken (Megatron-Core's attention.py:289), a non-divisor is not
    (["--num-attention-heads", "12", "--hidden-size", "192", "--num-key-value-heads", "4",
      "--tensor-model-parallel-size", "6"], "--num-key-value-heads 4 must be a multiple or divisor of "
                                            "--tensor-model-parallel-size 6"),
    (["--position-embedding-type", "rope", "--rotary-percent", "1.5"], "--rotary-percent 1.5"),
    (["--swiglu", "--ffn-hidden-size", "90", "--tensor-model-parallel-size", "4"], "--ffn-hidden-size 90"),
    (["--normalization", "BatchNorm"], "--normalization"),
])
def test_a_combination_megatron_reads_otherwise_is_refused_in_one_line(argv, words):
    with pytest.raises(ConfigError) as error:
        parse_config([*TINY, *argv])
    assert words in str(error.value) and "\n" not in str(error.value)


def test_num_query_groups_without_group_query_attention_is_not_read_as_in_megatron():
    """Megatron-LM (megatron/training/arguments.py, core_transformer_config_from_args) passes num_query_groups only
    under --group-query-attention: without it the model is multi-head. Before, this was refused; now it is not
    read, and said."""
    from arguments.parser import parse_arguments

    parsed = parse_arguments(["--num-query-groups", "2"])
    assert parsed.config.model.attention.num_query_groups is None
    assert any(note.startswith("--num-query-groups 2 without --group-query-attention: not read, as in Megatron-LM")
               for note in parsed.notes)
    assert parse_arguments(["--group-query-attention", "--num-query-groups", "2"]).config.model.attention.num_query_groups == 2
