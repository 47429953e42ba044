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
        assert state.dims.coordinates == {"pp": rank // 4, "dp": rank // 2 % 2, "cp": 0, "tp": rank % 2}
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
    # megatron/training/arguments.py: "please use --num-virtual-stages-per-pipeline-rank ... when enable uneven
    # pipeline parallelism"
    with pytest.raises(ConfigError, match="Megatron takes uneven stages' interleaving as --num-virtual-stages"):
        stage_layers(8, 2, 0, 1, 2, None)


# (layers, stages, first, last, chunks a stage): Megatron-Core's uneven interleaving
UNEVEN_INTERLEAVED = [(12, 4, 2, 2, 2), (8, 2, 2, None, 2), (6, 2, 2, None, 2), (15, 3, None, 3, 3), (20, 4, 4, 4, 2)]


def test_uneven_stages_interleaved_as_megatron_core_builds_them():
    """--num-virtual-stages-per-pipeline-rank V with uneven first/last stages: each stage's layers split evenly over
    its V chunks (get_num_layers_to_build: "num_layers_per_pipeline_rank ... should be divisible by vp_size"), chunk v
    of stage r after every chunk before it round the ring (get_transformer_layer_offset: vp_stage x
    total_virtual_chunks + the first stage's chunk + middle_pipeline_rank x the middle stages' chunk)."""
    assert [stage_layers(12, 4, s, None, 2, 2, virtual_stages=2).chunks for s in range(4)] == [
        ((0,), (6,)), ((1, 2), (7, 8)), ((3, 4), (9, 10)), ((5,), (11,))]
    assert [stage_layers(6, 2, s, None, 2, None, virtual_stages=2).chunks for s in range(2)] == [
        ((0,), (3,)), ((1, 2), (4, 5))]
    assert stage_layers(6, 2, 0, None, 2, None, virtual_stages=1).chunks == ((0, 1),)  # V 1: no interleaving
    with pytest.raises(ConfigError, match="--num-virtual-stages-per-pipeline-rank 2 does not divide every stage's "
                                          "layers \\(1, 3 with"):
        stage_layers(4, 2, 0, None, 1, None, virtual_stages=2)


@pytest.mark.parametrize("layers, stages, first, last, chunks", UNEVEN_INTERLEAVED)
def test_uneven_interleaved_split_is_megatron_cores_own(layers, stages, first, last, chunks):
    """The same split from megatron-core's functions themselves (requirements-bench.txt; skipped without it)."""
    block = pytest.importorskip("megatron.core.transformer.transformer_block")
    layer = pytest.importorskip("megatron.core.transformer.transformer_layer")
    from types import SimpleNamespace

    config = SimpleNamespace(num_layers=layers, pipeline_model_parallel_size=stages,
                             virtual_pipeline_model_parallel_size=chunks, num_layers_in_first_pipeline_stage=first,
                             num_layers_in_last_pipeline_stage=last, pipeline_model_parallel_layout=None,
                             account_for_embedding_in_pipeline_split=False, account_for_loss_in_pipeline_split=False)
    for rank in range(stages):
        theirs = []
        for vp_stage in range(chunks):
            count = block.get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=rank)
            offset = layer.get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=rank)
            theirs.append(tuple(range(offset, offset + count)))
        ours = stage_layers(layers, stages, rank, None, first, last, virtual_stages=chunks).chunks
        assert ours == tuple(theirs), (rank, ours, theirs)


@pytest.mark.parametrize("untied", [False, True])
def test_stage_models_hold_the_one_stage_models_parameters(untied):
    config = ModelConfig.of(num_layers=4, hidden_size=32, num_attention_heads=4, seq_length=8,
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
    config = ModelConfig.of(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=8,
                         max_position_embeddings=8, vocab_size=100, untie_embeddings_and_output_weights=True)
    state = virtual_state(1, device="cpu")
    whole = build_gpt_model(config, state, seed=5)
    last = materialize(GPTModel(config, state, stage=stage_layers(2, 2, 1)), 5, device="cpu")
    assert last.word_embeddings is None
    hidden, labels = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(0)), torch.arange(16).view(2, 8)
    assert torch.equal(last.output(last.final_layernorm(hidden), labels),
                       whole.output(whole.final_layernorm(hidden), labels))


def _megatron_chunks(num_layers, pp, rank, vp, embedding, loss):
    """Megatron-Core at d98e8a64 reproduced by hand: get_num_layers_to_build
    (megatron/core/transformer/transformer_block.py: (L + embedding + loss) / pp per stage, / vp per chunk, one
    fewer on the first stage's first chunk with account_for_embedding_in_pipeline_split and on the last stage's
    last chunk with account_for_loss_in_pipeline_split) and get_transformer_layer_offset
    (megatron/core/transformer/transformer_layer.py: vp_stage x (num_layers / vp) + pp_rank x
    num_layers_per_virtual_rank, minus 1 on every chunk but the first stage's first when the embedding counts)."""
    counted = num_layers + embedding + loss
    per_rank = counted // pp
    chunks = []
    for vp_stage in range(vp or 1):
        first_chunk, last_chunk = vp_stage == 0, vp_stage == (vp or 1) - 1
        build = per_rank // vp if vp else per_rank
        if embedding and first_chunk and rank == 0:
            build -= 1
        if loss and last_chunk and rank == pp - 1:
            build -= 1
        offset = vp_stage * (counted // vp) + rank * (per_rank // vp) if vp else rank * per_rank
        if embedding and not (first_chunk and rank == 0):
            offset -= 1
        chunks.append(tuple(range(offset, offset + build)))
    return tuple(chunks)


@pytest.mark.parametrize("num_layers,pp,vp,embedding,loss", [
    (7, 2, None, True, False), (7, 2, None, False, True), (6, 4, None, True, True), (7, 4, None, True, False),
    (6, 2, 2, True, True), (10, 2, 3, True, True), (14, 4, 2, True, True), (7, 2, 2, True, False),
    (8, 2, 2, False, False)])
def test_account_for_embedding_and_loss_split_as_megatrons_get_num_layers_to_build(num_layers, pp, vp, embedding,
                                                                                   loss):
    """--account-for-embedding/loss-in-pipeline-split, alone and with --num-virtual-stages-per-pipeline-rank
    (and its spelling in layers, --num-layers-per-virtual-pipeline-stage): every stage's chunks are Megatron's,
    and together they are the model's layers once each."""
    per_chunk = (num_layers + embedding + loss) // pp // vp if vp else None
    held = []
    for rank in range(pp):
        expected = _megatron_chunks(num_layers, pp, rank, vp, embedding, loss)
        got = stage_layers(num_layers, pp, rank, virtual_stages=vp, account_for_embedding=embedding,
                           account_for_loss=loss)
        assert got.chunks == expected
        assert stage_layers(num_layers, pp, rank, per_chunk, account_for_embedding=embedding,
                            account_for_loss=loss).chunks == expected
        held += got.layer_ids
    assert sorted(held) == list(range(num_layers))


def test_the_split_flags_refuse_what_megatron_refuses():
    with pytest.raises(ConfigError, match=r"--num-layers 6 \(with the embedding and/or loss counted as layers\) is "
                                          r"not divisible by --pipeline-model-parallel-size 4"):
        stage_layers(6, 4, 0, account_for_embedding=True)
    with pytest.raises(ConfigError, match="--num-virtual-stages-per-pipeline-rank 2 does not divide the 3 layers"):
        stage_layers(6, 2, 0, virtual_stages=2)
    with pytest.raises(ConfigError, match="Megatron does not take both"):
        stage_layers(6, 2, 0, first_stage_layers=2, account_for_loss=True)
    with pytest.raises(ConfigError, match="Megatron takes one of them"):
        stage_layers(8, 2, 0, 2, virtual_stages=2)
    with pytest.raises(ConfigError, match="leaves stage 0 no transformer layer"):
        stage_layers(2, 4, 0, account_for_embedding=True, account_for_loss=True)
