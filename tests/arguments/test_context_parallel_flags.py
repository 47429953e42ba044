"""Megatron-LM's --context-parallel-size, --cp-comm-type and --hierarchical-context-parallel-sizes as settings
(issues 52, 81): accepted (they were refused or taken with no effect before), and the sizes and layouts Megatron
(or TransformerEngine under it) also asserts refused in one line naming the flags."""

import pytest

from arguments.parser import parse_config
from base.errors import ConfigError

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32"]


def test_ds_sequence_parallel_size_is_ulysses_over_the_context_parallel_ranks():
    """Megatron-DeepSpeed's --ds-sequence-parallel-size N: DP = world / (PP x TP x N) (megatron/arguments.py) and
    DeepSpeed's DistributedAttention around attention: Megatron-Core's --context-parallel-size N --cp-comm-type a2a."""
    config = parse_config([*TINY, "--ds-sequence-parallel-size", "2"])
    assert (config.parallel.context_parallel_size, config.model.attention.cp_comm_type) == (2, "a2a")
    assert parse_config([*TINY, "--ds-sequence-parallel-size", "1"]).parallel.context_parallel_size == 1


def test_context_parallel_size_and_comm_type_are_settings():
    config = parse_config([*TINY, "--context-parallel-size", "2", "--cp-comm-type", "all_gather"])
    assert config.parallel.context_parallel_size == 2 and config.model.attention.cp_comm_type == "all_gather"
    assert parse_config(TINY).model.attention.cp_comm_type == "p2p"  # Megatron-Core's default (TransformerConfig)
    config = parse_config([*TINY, "--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                           "--hierarchical-context-parallel-sizes", "2", "2"])
    assert (config.model.attention.cp_comm_type, config.parallel.hierarchical_context_parallel_sizes) == ("a2a+p2p", [2, 2])
    # the ring at a given softmax scale, and multi-latent attention (its own scale and value width) on every path
    assert parse_config([*TINY, "--context-parallel-size", "2", "--softmax-scale", "0.3"]).model.attention.softmax_scale == 0.3
    for comm in ("p2p", "all_gather", "a2a"):
        config = parse_config([*TINY, "--context-parallel-size", "2", "--cp-comm-type", comm, "--multi-latent-attention"])
        assert config.model.mla.multi_latent_attention and config.parallel.context_parallel_size == 2


@pytest.mark.parametrize("argv, words", [
    # megatron/training/utils.py get_batch_on_this_cp_rank views the sequence as 2 x CP equal chunks
    (["--context-parallel-size", "3"], "--seq-length 32 must be divisible by 2 x --context-parallel-size (6)"),
    # megatron/training/arguments.py validate_args: a2a+p2p needs the sizes, and their product is the CP size
    (["--context-parallel-size", "2", "--cp-comm-type", "a2a+p2p"],
     "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A B"),
    (["--context-parallel-size", "4", "--hierarchical-context-parallel-sizes", "2", "3"],
     "--hierarchical-context-parallel-sizes 2 3 must multiply to --context-parallel-size 4"),
    # TransformerEngine's attn_forward_func_with_cp takes cp_group = [a2a group, p2p group]
    (["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "4"],
     "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A B"),
    # and its flash_attn_a2a_communicate views each of q, k, v's heads as [A, heads / A]
    (["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2",
      "--group-query-attention", "--num-query-groups", "1"],
     "splits each tensor-parallel rank's 4 attention heads and 1 key/value groups over the all-to-all level's 2"),
    (["--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p", "--hierarchical-context-parallel-sizes", "2", "2",
      "--window-size", "4,0"], "--window-size with --cp-comm-type a2a+p2p (the ring) is not implemented"),
    # the ring takes a softmax scale (gpt/cp_attention.py) but computes no soft-capped scores
    (["--context-parallel-size", "2", "--attn-logit-softcapping", "30"],
     "--attn-logit-softcapping with --cp-comm-type p2p (the ring) is not implemented"),
    (["--context-parallel-size", "4", "--tensor-model-parallel-size", "4", "--sequence-parallel", "--seq-length",
      "40", "--max-position-embeddings", "40"], "--sequence-parallel splits each context-parallel rank's 10 tokens"),
    (["--context-parallel-size", "0"], "--context-parallel-size must be at least 1"),
    # DeepSpeed's single_all_to_all: "Number of heads must be divisible by the sequence parallel size"
    (["--ds-sequence-parallel-size", "8", "--seq-length", "64", "--max-position-embeddings", "64"],
     "--cp-comm-type a2a (DeepSpeed-Ulysses) splits each tensor-parallel rank's 4 attention heads over 8 ranks"),
    (["--ds-sequence-parallel-size", "2", "--context-parallel-size", "4"],
     "--ds-sequence-parallel-size 2 contradicts --context-parallel-size 4"),
    (["--ds-sequence-parallel-size", "2", "--cp-comm-type", "p2p"],
     "--ds-sequence-parallel-size 2 is DeepSpeed-Ulysses' all-to-all; it contradicts --cp-comm-type p2p"),
])
def test_what_cannot_run_is_refused_in_one_line(argv, words):
    with pytest.raises(ConfigError) as error:
        parse_config([*TINY, *argv])
    assert words in str(error.value) and "\n" not in str(error.value)
