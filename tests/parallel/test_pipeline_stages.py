"""The pipeline's grid and model split, without a process group: Megatron's rank order with a pipeline
dimension, the layers each stage and model chunk holds (Megatron-Core's get_transformer_layer_offset:
vp_rank x (L / vp) + pp_rank x L_v, github:NVIDIA/Megatron-LM megatron/core/transformer/transformer_layer.py),
and stage models whose parameters are the one-stage model's, by name and value."""

from __future__ import annotations

import pytest
import torch

from arguments.config import ModelConfig
from base.errors import ConfigError
from gpt.model import GPTModel, build_gpt_model
from gpt.stage_layers import stage_layers
from parallel.init import materialize
from parallel.state import virtual_state


def test_world_8_pp_2_tp_2_rank_order_and_pipelines():
    # Megatron's order tp-dp-pp: rank = (pp x DP + dp) x TP + tp; a pipeline is the ranks DP x TP apart.
    for rank in range(8):
        state = virtual_state(8, tensor_parallel_size=2, rank=rank, pipeline_parallel_size=2)
        assert state.dims.coordinates == {"pp": rank // 4, "dp": rank // 2 % 2, "tp": rank % 2}
        assert state.dims.group_ranks("pp") == [rank % 4, rank % 4 + 4]
        assert (state.is_first_stage, state.is_last_stage) == (rank < 4, rank >= 4)
        assert state.stage_rank(-1) == rank % 4 + 4 and state.stage_rank(2) == rank % 4  # modulo the stages


def test_the_layers_of_each_stage_and_chunk():
    assert [stage_layers(8, 4, s).chunks for s in range(4)] == [((0, 1),), ((2, 3),), ((4, 5),), ((6, 7),)]
    # 8 layers, 2 stages, 2 layers per virtual stage: chunk c of stage s holds (c x pp + s) x 2 ...
    assert [stage_layers(8, 2, s, 2).chunks for s in range(2)] == [((0, 1), (4, 5)), ((2, 3), (6, 7))]
    assert stage_layers(8, 2, 0).first and not stage_layers(8, 2, 0).last and stage_layers(8, 2, 1).last
    with pytest.raises(ConfigError, match="--num-layers 6 is not divisible by --pipeline-model-parallel-size 4"):
        stage_layers(6, 4, 0)
    with pytest.raises(ConfigError, match="--num-layers-per-virtual-pipeline-stage 3 does not divide the 4 layers"):
        stage_layers(8, 2, 0, 3)


def test_uneven_first_and_last_stages():
    """Megatron-LM's --decoder-first/last-pipeline-num-layers: the first (last) stage holds that many layers and
    the rest split evenly over the middle stages (github:NVIDIA/Megatron-LM
    megatron/core/transformer/transformer_block.py get_num_layers_to_build: layers_to_distribute -=
    num_layers_in_first_pipeline_stage, pipeline_stages_left -= 1, ..., "With uneven pipelineing the left over
    layers must be divisible by left over stages"; the offsets follow in stage order)."""
    def split(num_layers, pp, first, last):
        return [stage_layers(num_layers, pp, s, None, first, last).layer_ids for s in range(pp)]

    assert split(4, 2, 1, None) == [(0,), (1, 2, 3)]
    assert split(4, 2, None, 1) == [(0, 1, 2), (3,)]
    assert split(8, 4, 1, 3) == [(0,), (1, 2), (3, 4), (5, 6, 7)]
    assert split(7, 4, 1, None) == [(0,), (1, 2), (3, 4), (5, 6)]  # 7 layers: even without the first stage
    with pytest.raises(ConfigError, match="leave 5 of --num-layers 8 for 2 other stages"):
        stage_layers(8, 4, 0, None, 1, 2)
    with pytest.raises(ConfigError, match="leave 1 of --num-layers 4 for 0 other stages"):
        stage_layers(4, 2, 0, None, 1, 2)  # the layers must all be placed
    with pytest.raises(ConfigError, match="--decoder-first-pipeline-num-layers 0: a stage holds 1 to"):
        stage_layers(4, 2, 0, None, 0, None)
    with pytest.raises(ConfigError, match="uneven stages are not implemented with interleaving"):
        stage_layers(8, 2, 0, 1, 2, None)


@pytest.mark.parametrize("untied", [False, True])
def test_stage_models_hold_the_one_stage_models_parameters(untied):
    config = ModelConfig(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=8,
                         max_position_embeddings=8, vocab_size=100,
                         untie_embeddings_and_output_weights=untied)
    state = virtual_state(1, device="cpu")
    whole = dict(build_gpt_model(config, state, seed=5).named_parameters())
    seen = {}
    for rank in range(2):
        stage = materialize(GPTModel(config, state, stage=stage_layers(4, 2, rank, 1)), 5, device="cpu")
        for name, param in stage.named_parameters():
            assert torch.equal(param, whole[name]), name  # same name, same initial values
            seen.setdefault(name, []).append(rank)
    assert set(seen) == set(whole)
    # only a tied word embedding is on both stages (the last one's copy is its output layer)
    shared = {name for name, ranks in seen.items() if len(ranks) > 1}
    assert shared == (set() if untied else {"word_embeddings.weight"})
    assert seen["blocks.2.input_layernorm.weight"] == [0]  # chunk 1 of stage 0 (interleaved, 1 layer a chunk)


def test_an_untied_last_stage_scores_the_vocabulary_as_the_one_stage_model():
    """The last stage of an untied model holds no word embedding (only the first stage does), so its loss
    reads its vocabulary shard's start from the output layer's split (the Llama-2 launch of
    deepspeedai/Megatron-DeepSpeed examples_deepspeed/pretrain_llama2_distributed.sh: PP 2, untied)."""
    config = ModelConfig(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8,
                         max_position_embeddings=8, vocab_size=100, untie_embeddings_and_output_weights=True)
    state = virtual_state(1, device="cpu")
    whole = build_gpt_model(config, state, seed=5)
    last = materialize(GPTModel(config, state, stage=stage_layers(2, 2, 1)), 5, device="cpu")
    assert last.word_embeddings is None
    hidden, labels = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0)), torch.arange(16).view(2, 8)
    assert torch.equal(last.output(last.final_layernorm(hidden), labels),
                       whole.output(whole.final_layernorm(hidden), labels))
